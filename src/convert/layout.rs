//! The V4 Flash name map: from a checkpoint's `config.json`, ds4's
//! `deepseek4` tensor directory (every GGUF tensor's name, its GGUF shape in
//! `ne` order, and the checkpoint tensor(s) it comes from), and the check of
//! every source tensor against it before anything is written
//! (docs/TOOLS.md, "The name map"; GGUF.md §4 and §9).
//!
//! The directory is derived here from `config.json` alone, in the order of
//! ds4's published files; tests/convert_layout.rs checks it, name by name
//! and shape by shape, against the full-shape header of the published Flash
//! file and against what ds4's loader binds. The tensor types are a
//! recipe's choice and not part of the directory.
//!
//! Every GGUF matrix `ne = [in, out]` is the checkpoint's `[out, in]` with
//! the same memory layout, so a source's shape is the GGUF `ne` reversed,
//! with three kinds of source:
//!
//! * one tensor, widened (F32/F16/BF16) or dequantized (FP8 E4M3 with its
//!   E8M0 `.scale` over `quantization_config.weight_block_size` blocks);
//! * the routed experts: `ne[2]` tensors `layers.L.ffn.experts.X.w1`
//!   (gate), `.w3` (up), `.w2` (down), each `[ne1, ne0]` (packed FP4 in
//!   I8 `[out, in/2]` with an E8M0 `.scale` `[out, in/32]` in the release),
//!   stacked: slab X is expert X;
//! * the hash-routing table `layers.L.ffn.gate.tid2eid`, I64 `[V, K]`
//!   narrowed to the I32 `[K, V]` of the GGUF (the same bytes order).
//!
//! The check reads headers only (dtype, shape, the scale's dtype and shape),
//! never tensor data, so it costs nothing on a 150 GB checkpoint; the
//! decoders (`decode::Weight`) check the bytes when a tensor is converted.

use std::path::Path;

use serde_json::Value;

use super::decode::{scale_name, FP4_BLOCK};
use super::safetensors::{Checkpoint, Dtype, TensorView, CONFIG_FILE, INDEX_FILE};
use super::ConvertError;

/// The compression ratio whose layers carry the overlapped compressor and
/// the indexer (CSA) in V4 (official `model.py`: `overlap = ratio == 4`,
/// an `Indexer` only when `compress_ratio == 4`); other compressed layers
/// are HCA.
pub const CSA_RATIO: usize = 4;

/// The shapes of a DeepSeek V4 (Flash) checkpoint, from the official
/// `config.json` keys (MODEL.md §1 for their meaning): only what the tensor
/// directory needs. The slice that writes metadata reads `config.json` into
/// `model::config::ModelConfig` (what the loader reads from the GGUF) and
/// makes this a view of it, so the shapes live in one struct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V4Shape {
    /// `num_hidden_layers`.
    pub n_layer: usize,
    /// `hidden_size`.
    pub n_embd: usize,
    /// `vocab_size`.
    pub n_vocab: usize,
    /// `num_attention_heads`.
    pub n_head: usize,
    /// `head_dim` (K and V).
    pub head_dim: usize,
    /// `qk_rope_head_dim`.
    pub n_rot: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    /// `compress_ratios`, the first `n_layer` entries (the release lists one
    /// more, for the MTP layer).
    pub compress_ratios: Vec<usize>,
    /// `index_n_heads`.
    pub indexer_heads: usize,
    /// `index_head_dim`.
    pub indexer_head_dim: usize,
    /// `n_routed_experts`.
    pub n_expert: usize,
    /// `num_experts_per_tok`.
    pub n_expert_used: usize,
    /// `moe_intermediate_size`.
    pub expert_ff: usize,
    /// `num_hash_layers`: layers `0 .. n_hash_layers` route by `tid2eid`.
    pub n_hash_layers: usize,
    /// `hc_mult`: hyper-connection streams.
    pub hc_count: usize,
}

fn config_err(file: &Path, msg: String) -> ConvertError {
    ConvertError::Input {
        file: file.display().to_string(),
        msg,
    }
}

impl V4Shape {
    /// Reads and checks the shapes of `config.json` (`json`, read from
    /// `file`, which errors name). A V4.1 or other config is refused.
    pub fn from_config(json: &Value, file: &Path) -> Result<V4Shape, ConvertError> {
        let err = |msg: String| config_err(file, msg);
        let model_type = json.get("model_type").and_then(|v| v.as_str());
        let archs: Vec<&str> = json
            .get("architectures")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
            .unwrap_or_default();
        if json.get("text_config").is_some()
            || model_type == Some("deepseek_v41")
            || archs.iter().any(|a| a.starts_with("DeepseekV41"))
        {
            return Err(err(
                "a DeepSeek V4.1 config (model_type deepseek_v41 / text_config): \
                 only the V4 (Flash) name map is implemented"
                    .into(),
            ));
        }
        let is_v4 = model_type == Some("deepseek_v4") || archs.contains(&"DeepseekV4ForCausalLM");
        if !is_v4 {
            return Err(err(format!(
                "not a DeepSeek V4 config: model_type {model_type:?}, architectures {archs:?} \
                 (expected deepseek_v4 / DeepseekV4ForCausalLM)"
            )));
        }
        let uint = |key: &str| -> Result<usize, ConvertError> {
            let v = json.get(key).ok_or_else(|| err(format!("no `{key}`")))?;
            v.as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| err(format!("`{key}` is {v}, not a non-negative integer")))
        };
        let positive = |key: &str| -> Result<usize, ConvertError> {
            match uint(key)? {
                0 => Err(err(format!("`{key}` is 0"))),
                x => Ok(x),
            }
        };
        let n_layer = positive("num_hidden_layers")?;
        let ratios_v = json
            .get("compress_ratios")
            .and_then(|v| v.as_array())
            .ok_or_else(|| err("no `compress_ratios` array".into()))?;
        let ratios: Vec<usize> = ratios_v
            .iter()
            .map(|r| r.as_u64().map(|x| x as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| err("`compress_ratios` holds a value that is not an integer".into()))?;
        if ratios.len() < n_layer {
            return Err(err(format!(
                "`compress_ratios` has {} entries for {n_layer} layers",
                ratios.len()
            )));
        }
        let compress_ratios = ratios[..n_layer].to_vec();
        if let Some((l, r)) = compress_ratios
            .iter()
            .enumerate()
            .find(|&(_, &r)| r == 1 || r > 1 << 20)
        {
            return Err(err(format!(
                "`compress_ratios[{l}]` is {r}: a V4 layer is 0 (window only) or compresses \
                 2 or more rows into one"
            )));
        }
        let s = V4Shape {
            n_layer,
            n_embd: positive("hidden_size")?,
            n_vocab: positive("vocab_size")?,
            n_head: positive("num_attention_heads")?,
            head_dim: positive("head_dim")?,
            n_rot: positive("qk_rope_head_dim")?,
            q_lora_rank: positive("q_lora_rank")?,
            o_lora_rank: positive("o_lora_rank")?,
            o_groups: positive("o_groups")?,
            compress_ratios,
            indexer_heads: positive("index_n_heads")?,
            indexer_head_dim: positive("index_head_dim")?,
            n_expert: positive("n_routed_experts")?,
            n_expert_used: positive("num_experts_per_tok")?,
            expert_ff: positive("moe_intermediate_size")?,
            n_hash_layers: uint("num_hash_layers")?,
            hc_count: positive("hc_mult")?,
        };
        // What ds4's V4 runs (GGUF.md §3, §8): one shared K=V head, one
        // shared expert, heads split evenly over the output groups.
        if json.get("num_key_value_heads").is_some() && uint("num_key_value_heads")? != 1 {
            return Err(err(format!(
                "`num_key_value_heads` is {}: V4 has one shared K=V head",
                uint("num_key_value_heads")?
            )));
        }
        let shared = uint("n_shared_experts")?;
        if shared != 1 {
            return Err(err(format!(
                "`n_shared_experts` is {shared}: V4 has one shared expert"
            )));
        }
        if s.n_head % s.o_groups != 0 {
            return Err(err(format!(
                "`num_attention_heads` {} is not a multiple of `o_groups` {}",
                s.n_head, s.o_groups
            )));
        }
        if s.n_rot > s.head_dim || s.n_rot % 2 != 0 {
            return Err(err(format!(
                "`qk_rope_head_dim` {} must be even and at most `head_dim` {}",
                s.n_rot, s.head_dim
            )));
        }
        if s.n_expert_used > s.n_expert {
            return Err(err(format!(
                "`num_experts_per_tok` {} exceeds `n_routed_experts` {}",
                s.n_expert_used, s.n_expert
            )));
        }
        if s.n_hash_layers > s.n_layer {
            return Err(err(format!(
                "`num_hash_layers` {} exceeds the {} layers",
                s.n_hash_layers, s.n_layer
            )));
        }
        Ok(s)
    }
}

/// Where a GGUF tensor's values come from in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// One checkpoint tensor of shape `ne` reversed: F32/F16/BF16 widened,
    /// FP8 E4M3 dequantized with its `.scale`.
    One(String),
    /// `ne[2]` checkpoint tensors `{prefix}{X}{suffix}`, X = 0, 1, …, each
    /// `[ne1, ne0]` (packed FP4 in the release), stacked: slab X is expert X.
    Experts { prefix: String, suffix: String },
    /// An integer table (I64 in the release, I32 accepted) of shape `ne`
    /// reversed, narrowed to I32.
    Table(String),
}

/// One tensor of the GGUF directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    /// GGUF dimensions, `ne0` first.
    pub ne: Vec<u64>,
    pub source: Source,
}

impl GgufTensor {
    /// Every checkpoint tensor this one reads, with the logical shape
    /// `config.json` implies for it (row-major, `[out, in]` for a matrix; a
    /// packed FP4 tensor stores half the columns).
    pub fn sources(&self) -> Vec<(String, Vec<u64>)> {
        let rev: Vec<u64> = self.ne.iter().rev().copied().collect();
        match &self.source {
            Source::One(n) | Source::Table(n) => vec![(n.clone(), rev)],
            Source::Experts { prefix, suffix } => (0..self.ne[2])
                .map(|x| (format!("{prefix}{x}{suffix}"), vec![self.ne[1], self.ne[0]]))
                .collect(),
        }
    }
}

/// The `deepseek4` tensor directory of a V4 checkpoint.
#[derive(Clone, Debug)]
pub struct Layout {
    pub shape: V4Shape,
    /// In the order of ds4's published files: the embedding, each layer's
    /// tensors, then the output HC mix, norm and head.
    pub tensors: Vec<GgufTensor>,
}

/// Builds the directory in file order.
struct Dir {
    tensors: Vec<GgufTensor>,
}

impl Dir {
    fn one(&mut self, name: &str, ne: &[usize], src: &str) {
        self.push(name, ne, Source::One(src.into()));
    }

    fn push(&mut self, name: &str, ne: &[usize], source: Source) {
        self.tensors.push(GgufTensor {
            name: name.into(),
            ne: ne.iter().map(|&x| x as u64).collect(),
            source,
        });
    }

    /// A sublayer's hyper-connection mix (`sub` = attn or ffn).
    fn hc_mix(&mut self, s: &V4Shape, l: usize, sub: &str) {
        let (hc, d) = (s.hc_count, s.n_embd);
        let mix = (2 + hc) * hc;
        let g = |x: &str| format!("blk.{l}.hc_{sub}_{x}.weight");
        let h = |x: &str| format!("layers.{l}.hc_{sub}_{x}");
        self.one(&g("fn"), &[hc * d, mix], &h("fn"));
        self.one(&g("scale"), &[3], &h("scale"));
        self.one(&g("base"), &[mix], &h("base"));
    }

    /// A compressor: `names` = its GGUF prefix (`attn_compressor_` /
    /// `indexer_compressor_`) and its checkpoint prefix, `hd` its head dim
    /// (outputs doubled when overlapped, in CSA layers).
    fn compressor(&mut self, s: &V4Shape, l: usize, names: [&str; 2], ratio: usize, hd: usize) {
        let [gguf, hf] = names;
        let w = if ratio == CSA_RATIO { 2 * hd } else { hd };
        let g = |x: &str| format!("blk.{l}.{gguf}{x}.weight");
        let h = |x: &str| format!("layers.{l}.{hf}{x}");
        self.one(&g("ape"), &[w, ratio], &h("ape"));
        self.one(&g("kv"), &[s.n_embd, w], &h("wkv.weight"));
        self.one(&g("gate"), &[s.n_embd, w], &h("wgate.weight"));
        self.one(&g("norm"), &[hd], &h("norm.weight"));
    }

    fn layer(&mut self, s: &V4Shape, l: usize) {
        let (d, hd, nh, ql) = (s.n_embd, s.head_dim, s.n_head, s.q_lora_rank);
        let ol = s.o_groups * s.o_lora_rank;
        let group_in = nh / s.o_groups * hd;
        let (ff, e) = (s.expert_ff, s.n_expert);
        let g = |x: &str| format!("blk.{l}.{x}.weight");
        let h = |x: &str| format!("layers.{l}.{x}");
        let ratio = s.compress_ratios[l];

        self.hc_mix(s, l, "attn");
        self.one(&g("attn_norm"), &[d], &h("attn_norm.weight"));
        self.one(&g("attn_q_a"), &[d, ql], &h("attn.wq_a.weight"));
        self.one(&g("attn_q_a_norm"), &[ql], &h("attn.q_norm.weight"));
        self.one(&g("attn_q_b"), &[ql, nh * hd], &h("attn.wq_b.weight"));
        self.one(&g("attn_kv"), &[d, hd], &h("attn.wkv.weight"));
        self.one(&g("attn_kv_a_norm"), &[hd], &h("attn.kv_norm.weight"));
        self.one(&g("attn_sinks"), &[nh], &h("attn.attn_sink"));
        self.one(&g("attn_output_a"), &[group_in, ol], &h("attn.wo_a.weight"));
        self.one(&g("attn_output_b"), &[ol, d], &h("attn.wo_b.weight"));
        if ratio > 0 {
            let names = ["attn_compressor_", "attn.compressor."];
            self.compressor(s, l, names, ratio, hd);
            if ratio == CSA_RATIO {
                let (ih, ihd) = (s.indexer_heads, s.indexer_head_dim);
                let wq_b = h("attn.indexer.wq_b.weight");
                self.one(&g("indexer.attn_q_b"), &[ql, ih * ihd], &wq_b);
                let proj = h("attn.indexer.weights_proj.weight");
                self.one(&g("indexer.proj"), &[d, ih], &proj);
                let names = ["indexer_compressor_", "attn.indexer.compressor."];
                self.compressor(s, l, names, ratio, ihd);
            }
        }
        self.hc_mix(s, l, "ffn");
        self.one(&g("ffn_norm"), &[d], &h("ffn_norm.weight"));
        self.one(&g("ffn_gate_inp"), &[d, e], &h("ffn.gate.weight"));
        if l < s.n_hash_layers {
            let name = g("ffn_gate_tid2eid");
            let src = Source::Table(h("ffn.gate.tid2eid"));
            self.push(&name, &[s.n_expert_used, s.n_vocab], src);
        } else {
            let name = format!("blk.{l}.exp_probs_b.bias");
            self.one(&name, &[e], &h("ffn.gate.bias"));
        }
        for (gguf, w, ne) in [
            ("ffn_gate_exps", "w1", [d, ff, e]),
            ("ffn_up_exps", "w3", [d, ff, e]),
            ("ffn_down_exps", "w2", [ff, d, e]),
        ] {
            let src = Source::Experts {
                prefix: h("ffn.experts."),
                suffix: format!(".{w}.weight"),
            };
            self.push(&g(gguf), &ne, src);
        }
        self.one(
            &g("ffn_gate_shexp"),
            &[d, ff],
            &h("ffn.shared_experts.w1.weight"),
        );
        self.one(
            &g("ffn_up_shexp"),
            &[d, ff],
            &h("ffn.shared_experts.w3.weight"),
        );
        self.one(
            &g("ffn_down_shexp"),
            &[ff, d],
            &h("ffn.shared_experts.w2.weight"),
        );
    }
}

/// What a source tensor may be stored as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Storage {
    /// F32/F16/BF16, or FP8 E4M3 (a matrix) with its scale.
    Float,
    /// The same or packed FP4 (I8) with its scale.
    Expert,
    /// I64 or I32.
    Table,
}

impl Layout {
    /// The directory for the shapes `s`.
    pub fn v4(s: &V4Shape) -> Layout {
        let (d, hc, v) = (s.n_embd, s.hc_count, s.n_vocab);
        let mut dir = Dir {
            tensors: Vec::new(),
        };
        dir.one("token_embd.weight", &[d, v], "embed.weight");
        for l in 0..s.n_layer {
            dir.layer(s, l);
        }
        dir.one("output_hc_fn.weight", &[hc * d, hc], "hc_head_fn");
        dir.one("output_hc_scale.weight", &[1], "hc_head_scale");
        dir.one("output_hc_base.weight", &[hc], "hc_head_base");
        dir.one("output_norm.weight", &[d], "norm.weight");
        dir.one("output.weight", &[d, v], "head.weight");
        Layout {
            shape: s.clone(),
            tensors: dir.tensors,
        }
    }

    /// The directory of a `config.json` (`json`, read from `file`).
    pub fn from_config(json: &Value, file: &Path) -> Result<Layout, ConvertError> {
        Ok(Layout::v4(&V4Shape::from_config(json, file)?))
    }

    /// The directory of an opened checkpoint, every source tensor checked
    /// against it ([`Layout::check`]).
    pub fn for_checkpoint(ck: &Checkpoint) -> Result<Layout, ConvertError> {
        let layout = Layout::from_config(ck.config(), &ck.dir().join(CONFIG_FILE))?;
        layout.check(ck)?;
        Ok(layout)
    }

    /// The tensor named `name`, if the directory has it.
    pub fn get(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Checks every source tensor of the directory in `ck`, in file order,
    /// headers only: present, of a dtype it may have, of the shape
    /// `config.json` implies, and (FP8 and packed FP4) with a `.scale` of
    /// the right dtype and shape. The first failure is an error naming the
    /// checkpoint file (the shard, or the index for a missing tensor), the
    /// tensor, the GGUF tensor it feeds and both shapes.
    pub fn check(&self, ck: &Checkpoint) -> Result<(), ConvertError> {
        let block = ck.weight_block_size()?;
        let index = ck.dir().join(INDEX_FILE);
        for t in &self.tensors {
            let storage = match t.source {
                Source::One(_) => Storage::Float,
                Source::Experts { .. } => Storage::Expert,
                Source::Table(_) => Storage::Table,
            };
            for (name, want) in t.sources() {
                let v = ck.get(&name).ok_or_else(|| ConvertError::Tensor {
                    file: index.display().to_string(),
                    tensor: name.clone(),
                    msg: format!(
                        "missing from the checkpoint; {} {want:?} (from {CONFIG_FILE}) \
                         is made from it",
                        t.name
                    ),
                })?;
                check_source(ck, &v, &want, storage, block, &t.name)?;
            }
        }
        Ok(())
    }

    /// The checkpoint tensors no GGUF tensor reads (their `.scale`s count
    /// as read), in name order: in the release, the MTP layer's `mtp.*`.
    pub fn unused<'c>(&self, ck: &'c Checkpoint) -> Vec<&'c str> {
        let mut used = std::collections::HashSet::new();
        for t in &self.tensors {
            for (name, _) in t.sources() {
                used.insert(scale_name(&name));
                used.insert(name);
            }
        }
        ck.names().filter(|n| !used.contains(*n)).collect()
    }
}

/// One source tensor's header against what the directory needs.
fn check_source(
    ck: &Checkpoint,
    v: &TensorView,
    want: &[u64],
    storage: Storage,
    block: [usize; 2],
    gguf: &str,
) -> Result<(), ConvertError> {
    let allowed: &[Dtype] = match storage {
        Storage::Float => &[Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::F8E4m3],
        Storage::Expert => &[
            Dtype::I8,
            Dtype::F32,
            Dtype::F16,
            Dtype::Bf16,
            Dtype::F8E4m3,
        ],
        Storage::Table => &[Dtype::I64, Dtype::I32],
    };
    if !allowed.contains(&v.dtype) {
        let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
        return Err(v.error(format!(
            "dtype {} cannot make {gguf} (expected one of {})",
            v.dtype.name(),
            names.join(", ")
        )));
    }
    // Packed FP4 stores two values a byte along the row.
    let mut logical = v.shape.to_vec();
    let packed = v.dtype == Dtype::I8;
    if packed {
        if let Some(last) = logical.last_mut() {
            *last *= 2;
        }
    }
    if logical != want {
        let stored = if packed {
            format!(" (stored as packed FP4 {:?})", v.shape)
        } else {
            String::new()
        };
        return Err(v.error(format!(
            "shape {logical:?}{stored}, but {CONFIG_FILE} implies {want:?} for {gguf}"
        )));
    }
    let scale_want = match v.dtype {
        Dtype::F8E4m3 => {
            let [r, c] = match *want {
                [r, c] => [r as usize, c as usize],
                _ => {
                    return Err(v.error(format!(
                        "an FP8 weight must be a matrix, {gguf} is {}-D",
                        want.len()
                    )))
                }
            };
            Some((
                [r.div_ceil(block[0]), c.div_ceil(block[1])],
                format!("one per {} x {} block", block[0], block[1]),
            ))
        }
        Dtype::I8 => {
            let (r, c) = (want[0] as usize, want[1] as usize);
            if c % FP4_BLOCK != 0 {
                return Err(v.error(format!(
                    "packed FP4 rows of {c} values are not whole blocks of {FP4_BLOCK}"
                )));
            }
            Some((
                [r, c / FP4_BLOCK],
                format!("one per {FP4_BLOCK} values of a row"),
            ))
        }
        _ => None,
    };
    if let Some((sw, per)) = scale_want {
        let sname = scale_name(v.name);
        let s = ck.get(&sname).ok_or_else(|| {
            v.error(format!(
                "{} weight without its scale tensor {sname}",
                v.dtype.name()
            ))
        })?;
        if s.dtype != Dtype::F8E8m0 || s.shape != [sw[0] as u64, sw[1] as u64] {
            return Err(v.error(format!(
                "its scale {sname} is {} {:?}, expected F8_E8M0 {sw:?} ({per})",
                s.dtype.name(),
                s.shape
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The official V4 Flash `config.json`'s shape keys (the release's
    /// values, MODEL.md §1).
    fn flash_config() -> Value {
        let mut ratios = vec![0, 0];
        for l in 2..43 {
            ratios.push(if l % 2 == 0 { 4 } else { 128 });
        }
        ratios.push(0);
        json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
            "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
            "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
            "q_lora_rank": 1024, "qk_rope_head_dim": 64, "head_dim": 512,
            "compress_ratios": ratios, "sliding_window": 128, "o_lora_rank": 1024,
            "o_groups": 8, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
            "num_hash_layers": 3, "hc_mult": 4,
        })
    }

    fn path() -> &'static Path {
        Path::new("ck/config.json")
    }

    #[test]
    fn flash_directory_counts_and_shapes() {
        let l = Layout::from_config(&flash_config(), path()).unwrap();
        // GGUF.md §4: 1328 tensors.
        assert_eq!(l.tensors.len(), 1328);
        assert_eq!(l.shape.compress_ratios.len(), 43);
        let ne = |n: &str| l.get(n).unwrap().ne.clone();
        assert_eq!(ne("token_embd.weight"), [4096, 129280]);
        assert_eq!(ne("blk.0.hc_attn_fn.weight"), [16384, 24]);
        assert_eq!(ne("blk.2.attn_compressor_ape.weight"), [1024, 4]);
        assert_eq!(ne("blk.3.attn_compressor_ape.weight"), [512, 128]);
        assert_eq!(ne("blk.2.indexer.attn_q_b.weight"), [1024, 8192]);
        assert_eq!(ne("blk.0.ffn_gate_tid2eid.weight"), [6, 129280]);
        assert_eq!(ne("blk.5.ffn_down_exps.weight"), [2048, 4096, 256]);
        assert_eq!(ne("blk.7.attn_output_a.weight"), [4096, 8192]);
        assert!(l.get("blk.3.indexer.proj.weight").is_none());
        assert!(l.get("blk.3.ffn_gate_tid2eid.weight").is_none());
        assert!(l.get("blk.2.exp_probs_b.bias").is_none());
        assert_eq!(l.tensors[0].name, "token_embd.weight");
        assert_eq!(l.tensors.last().unwrap().name, "output.weight");
    }

    #[test]
    fn name_map_follows_gguf_md() {
        let l = Layout::from_config(&flash_config(), path()).unwrap();
        let src = |n: &str| l.get(n).unwrap().source.clone();
        let one = |s: &str| Source::One(s.into());
        assert_eq!(src("token_embd.weight"), one("embed.weight"));
        assert_eq!(src("output.weight"), one("head.weight"));
        assert_eq!(src("output_hc_fn.weight"), one("hc_head_fn"));
        assert_eq!(
            src("blk.4.attn_sinks.weight"),
            one("layers.4.attn.attn_sink")
        );
        assert_eq!(
            src("blk.4.indexer_compressor_gate.weight"),
            one("layers.4.attn.indexer.compressor.wgate.weight")
        );
        assert_eq!(src("blk.9.exp_probs_b.bias"), one("layers.9.ffn.gate.bias"));
        assert_eq!(
            src("blk.1.ffn_gate_tid2eid.weight"),
            Source::Table("layers.1.ffn.gate.tid2eid".into())
        );
        assert_eq!(
            src("blk.0.ffn_up_shexp.weight"),
            one("layers.0.ffn.shared_experts.w3.weight")
        );
        let up = l.get("blk.3.ffn_up_exps.weight").unwrap().sources();
        assert_eq!(up.len(), 256);
        assert_eq!(
            up[17],
            ("layers.3.ffn.experts.17.w3.weight".into(), vec![2048, 4096])
        );
        let down = l.get("blk.3.ffn_down_exps.weight").unwrap().sources();
        assert_eq!(
            down[0],
            ("layers.3.ffn.experts.0.w2.weight".into(), vec![4096, 2048])
        );
        let tid = l.get("blk.0.ffn_gate_tid2eid.weight").unwrap().sources();
        assert_eq!(tid, [("layers.0.ffn.gate.tid2eid".into(), vec![129280, 6])]);
    }

    #[test]
    fn bad_configs_are_refused_with_the_key() {
        let cases: Vec<(Box<dyn Fn(&mut Value)>, &str)> = vec![
            (
                Box::new(|c| drop(c.as_object_mut().unwrap().remove("o_groups"))),
                "no `o_groups`",
            ),
            (
                Box::new(|c| c["hidden_size"] = json!("4096")),
                "`hidden_size` is \"4096\"",
            ),
            (
                Box::new(|c| c["num_hidden_layers"] = json!(50)),
                "`compress_ratios` has 44 entries for 50 layers",
            ),
            (
                Box::new(|c| c["compress_ratios"][5] = json!(1)),
                "`compress_ratios[5]` is 1",
            ),
            (
                Box::new(|c| c["o_groups"] = json!(7)),
                "not a multiple of `o_groups` 7",
            ),
            (
                Box::new(|c| c["n_shared_experts"] = json!(2)),
                "one shared expert",
            ),
            (
                Box::new(|c| c["num_key_value_heads"] = json!(8)),
                "one shared K=V head",
            ),
            (
                Box::new(|c| c["num_hash_layers"] = json!(44)),
                "`num_hash_layers` 44 exceeds",
            ),
            (
                Box::new(|c| c["num_experts_per_tok"] = json!(300)),
                "exceeds `n_routed_experts`",
            ),
            (Box::new(|c| c["hc_mult"] = json!(0)), "`hc_mult` is 0"),
            (
                Box::new(|c| c["model_type"] = json!("deepseek_v3")),
                "not a DeepSeek V4 config",
            ),
            (Box::new(|c| c["text_config"] = json!({})), "V4.1"),
        ];
        for (edit, want) in cases {
            let mut c = flash_config();
            if want == "not a DeepSeek V4 config" {
                c["architectures"] = json!(["DeepseekV3ForCausalLM"]);
            }
            edit(&mut c);
            let e = Layout::from_config(&c, path()).unwrap_err().to_string();
            assert!(e.starts_with("ck/config.json: "), "{e}");
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn architectures_alone_identify_v4() {
        let mut c = flash_config();
        c.as_object_mut().unwrap().remove("model_type");
        assert!(Layout::from_config(&c, path()).is_ok());
        c.as_object_mut().unwrap().remove("architectures");
        assert!(Layout::from_config(&c, path()).is_err());
    }
}
