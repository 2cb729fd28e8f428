//! The V4 Flash name map: from a checkpoint's `config.json`, ds4's
//! `deepseek4` tensor directory (every GGUF tensor's name, its GGUF shape in
//! `ne` order, and the checkpoint tensor(s) it comes from), and the check of
//! every source tensor against it before anything is written
//! (docs/TOOLS.md, "The name map"; GGUF.md §4 and §9).
//!
//! The directory is derived here from `config.json` alone (read into ds4's
//! own [`ModelConfig`] by [`super::metadata`], the loader's reader and
//! checks), in the order of
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

use crate::model::ModelConfig;

use super::decode::{scale_name, FP4_BLOCK};
use super::metadata::V4Config;
use super::safetensors::{Checkpoint, Dtype, TensorView, CONFIG_FILE, INDEX_FILE};
use super::ConvertError;

/// The compression ratio whose layers carry the overlapped compressor and
/// the indexer (CSA) in V4 (official `model.py`: `overlap = ratio == 4`,
/// an `Indexer` only when `compress_ratio == 4`); other compressed layers
/// are HCA.
pub const CSA_RATIO: usize = 4;

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

/// Which file of the model a directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The main `deepseek4` file.
    Main,
    /// The MTP draft block's file (`--mtp`).
    Mtp,
}

/// The `deepseek4` tensor directory of a V4 checkpoint.
#[derive(Clone, Debug)]
pub struct Layout {
    pub part: Part,
    /// The shapes (and every other hyper-parameter) the directory is made
    /// for: what ds4's loader reads from the converted file.
    pub config: ModelConfig,
    /// In the order of ds4's published files: the embedding, each layer's
    /// tensors, then the output HC mix, norm and head.
    pub tensors: Vec<GgufTensor>,
}

/// Builds the directory in file order.
struct Dir {
    tensors: Vec<GgufTensor>,
}

/// A block's name prefixes: in the GGUF and in the checkpoint.
#[derive(Clone, Copy)]
struct Prefix<'a> {
    gguf: &'a str,
    hf: &'a str,
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
    fn hc_mix(&mut self, s: &ModelConfig, p: Prefix, sub: &str) {
        let (hc, d) = (s.hc_count, s.n_embd);
        let mix = (2 + hc) * hc;
        let g = |x: &str| format!("{}hc_{sub}_{x}.weight", p.gguf);
        let h = |x: &str| format!("{}hc_{sub}_{x}", p.hf);
        self.one(&g("fn"), &[hc * d, mix], &h("fn"));
        self.one(&g("scale"), &[3], &h("scale"));
        self.one(&g("base"), &[mix], &h("base"));
    }

    /// A compressor: `names` = its GGUF prefix (`attn_compressor_` /
    /// `indexer_compressor_`) and its checkpoint prefix, `hd` its head dim
    /// (outputs doubled when overlapped, in CSA layers).
    fn compressor(
        &mut self,
        s: &ModelConfig,
        p: Prefix,
        names: [&str; 2],
        ratio: usize,
        hd: usize,
    ) {
        let [gguf, hf] = names;
        let w = if ratio == CSA_RATIO { 2 * hd } else { hd };
        let g = |x: &str| format!("{}{gguf}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{hf}{x}", p.hf);
        self.one(&g("ape"), &[w, ratio], &h("ape"));
        self.one(&g("kv"), &[s.n_embd, w], &h("wkv.weight"));
        self.one(&g("gate"), &[s.n_embd, w], &h("wgate.weight"));
        self.one(&g("norm"), &[hd], &h("norm.weight"));
    }

    /// A block: a main layer (`blk.L.` from `layers.L.`) or the MTP
    /// block (`mtp.0.` from `mtp.0.`), with its compression `ratio` and,
    /// when `hash`, the hash-routing table instead of the router bias.
    fn block(&mut self, s: &ModelConfig, p: Prefix, ratio: usize, hash: bool) {
        let (d, hd, nh, ql) = (s.n_embd, s.head_dim, s.n_head, s.q_lora_rank);
        let ol = s.o_groups * s.o_lora_rank;
        let group_in = nh / s.o_groups * hd;
        let (ff, e) = (s.expert_ff, s.n_expert);
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{x}", p.hf);

        self.hc_mix(s, p, "attn");
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
            self.compressor(s, p, names, ratio, hd);
            if ratio == CSA_RATIO {
                let (ih, ihd) = (s.indexer_heads, s.indexer_head_dim);
                let wq_b = h("attn.indexer.wq_b.weight");
                self.one(&g("indexer.attn_q_b"), &[ql, ih * ihd], &wq_b);
                let proj = h("attn.indexer.weights_proj.weight");
                self.one(&g("indexer.proj"), &[d, ih], &proj);
                let names = ["indexer_compressor_", "attn.indexer.compressor."];
                self.compressor(s, p, names, ratio, ihd);
            }
        }
        self.hc_mix(s, p, "ffn");
        self.one(&g("ffn_norm"), &[d], &h("ffn_norm.weight"));
        self.one(&g("ffn_gate_inp"), &[d, e], &h("ffn.gate.weight"));
        if hash {
            let name = g("ffn_gate_tid2eid");
            let src = Source::Table(h("ffn.gate.tid2eid"));
            self.push(&name, &[s.n_expert_used, s.n_vocab], src);
        } else {
            let name = format!("{}exp_probs_b.bias", p.gguf);
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
    /// The directory for the hyper-parameters `s`.
    pub fn v4(s: &ModelConfig) -> Layout {
        let (d, hc, v) = (s.n_embd, s.hc_count, s.n_vocab);
        let mut dir = Dir {
            tensors: Vec::new(),
        };
        dir.one("token_embd.weight", &[d, v], "embed.weight");
        for l in 0..s.n_layer {
            let (gguf, hf) = (format!("blk.{l}."), format!("layers.{l}."));
            let p = Prefix {
                gguf: &gguf,
                hf: &hf,
            };
            dir.block(s, p, s.compress_ratios[l], l < s.n_hash_layers);
        }
        dir.one("output_hc_fn.weight", &[hc * d, hc], "hc_head_fn");
        dir.one("output_hc_scale.weight", &[1], "hc_head_scale");
        dir.one("output_hc_base.weight", &[hc], "hc_head_base");
        dir.one("output_norm.weight", &[d], "norm.weight");
        dir.one("output.weight", &[d, v], "head.weight");
        Layout {
            config: s.clone(),
            part: Part::Main,
            tensors: dir.tensors,
        }
    }

    /// The directory of the MTP file (GGUF.md §7): the MTP block of the
    /// same checkpoint (`mtp.0.*`, the same sub-names as a layer), a
    /// window-only (ratio 0) top-k-routed block, with its own input
    /// projections and norms and its own hyper-connection head; it shares
    /// the main file's embedding and output head, so it has neither.
    pub fn v4_mtp(s: &ModelConfig) -> Layout {
        let (d, hc) = (s.n_embd, s.hc_count);
        let mut dir = Dir {
            tensors: Vec::new(),
        };
        let p = Prefix {
            gguf: "mtp.0.",
            hf: "mtp.0.",
        };
        dir.one("mtp.0.hc_head_fn.weight", &[hc * d, hc], "mtp.0.hc_head_fn");
        dir.one("mtp.0.hc_head_scale.weight", &[1], "mtp.0.hc_head_scale");
        dir.one("mtp.0.hc_head_base.weight", &[hc], "mtp.0.hc_head_base");
        for x in ["e_proj", "h_proj"] {
            dir.one(
                &format!("mtp.0.{x}.weight"),
                &[d, d],
                &format!("mtp.0.{x}.weight"),
            );
        }
        for x in ["enorm", "hnorm", "norm"] {
            dir.one(
                &format!("mtp.0.{x}.weight"),
                &[d],
                &format!("mtp.0.{x}.weight"),
            );
        }
        dir.block(s, p, 0, false);
        Layout {
            config: s.clone(),
            part: Part::Mtp,
            tensors: dir.tensors,
        }
    }

    /// The directory of a `config.json` (`json`, read from `file`), read
    /// and checked by [`V4Config::from_config`] (its `general.name` left
    /// empty: the directory does not depend on it).
    pub fn from_config(json: &Value, file: &Path) -> Result<Layout, ConvertError> {
        Ok(Layout::v4(&V4Config::from_config(json, file, "")?.model))
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

    use crate::convert::metadata::flash_config;

    fn path() -> &'static Path {
        Path::new("ck/config.json")
    }

    #[test]
    fn flash_directory_counts_and_shapes() {
        let l = Layout::from_config(&flash_config(), path()).unwrap();
        // GGUF.md §4: 1328 tensors.
        assert_eq!(l.tensors.len(), 1328);
        assert_eq!(l.config.compress_ratios.len(), 43);
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
}
