//! The name map: from a checkpoint's `config.json`, ds4's `deepseek4` (V4
//! Flash) or `deepseek41` (V4.1 Flash, [`Layout::v41`]) tensor directory
//! (every GGUF tensor's name, its GGUF shape in `ne` order, and the
//! checkpoint tensor(s) it comes from), and the check of every source
//! tensor against it before anything is written (docs/TOOLS.md, "The name
//! map" and the V4.1 section; GGUF.md §4 and §9; docs/V41.md "Tensors").
//! One builder (`Dir`) serves both families: the hyper-connection
//! mixes, attention, indexer query, router and experts are V4's parts,
//! named alike in both checkpoints.
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

use crate::model::dspark::DsparkConfig;
use crate::model::family::Arch;
use crate::model::v41::V41Config;
use crate::model::ModelConfig;
use crate::testmodel::v41::{layer_rank, V41Spec};

use super::decode::{scale_name, FP4_BLOCK};
use super::metadata::{model_type, ModelType, V41Meta, V4Config};
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
    /// V4.1's Engram table `{name}`, E4M3 `[rows, head_dim]` with its E8M0
    /// `.scale` `[rows, head_dim / 32]` (one per 32 values of a row),
    /// copied without loss into ds4's I8 rows `ne = [head_dim + head_dim /
    /// 32, rows]`: a row's codes, then its scale bytes.
    EngramRows { name: String, head_dim: u64 },
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
            Source::EngramRows { name, head_dim } => {
                vec![(name.clone(), vec![self.ne[1], *head_dim])]
            }
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
    /// DeepSeek's DSpark drafter's file (`--dspark-only`).
    Dspark,
}

/// The model family of a directory.
#[derive(Clone, Debug)]
pub enum Family {
    /// DeepSeek V4 (`deepseek4`).
    V4,
    /// DeepSeek V4.1 (`deepseek41`), with the test-model generator's spec of
    /// its shapes (its plan gives the recipes' types).
    V41(Box<V41Spec>),
}

/// The tensor directory of a checkpoint: ds4's `deepseek4` (V4) or
/// `deepseek41` (V4.1) layout.
#[derive(Clone, Debug)]
pub struct Layout {
    pub part: Part,
    pub family: Family,
    /// The shapes (and every other hyper-parameter) the directory is made
    /// for: what ds4's loader reads from the converted file (V4.1: the core
    /// both families read, with no hash layers).
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

    /// The attention's projections, norms and sinks (V4 and V4.1 alike).
    fn attention(&mut self, s: &ModelConfig, p: Prefix) {
        let (d, hd, nh, ql) = (s.n_embd, s.head_dim, s.n_head, s.q_lora_rank);
        let ol = s.o_groups * s.o_lora_rank;
        let group_in = nh / s.o_groups * hd;
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{x}", p.hf);
        self.one(&g("attn_norm"), &[d], &h("attn_norm.weight"));
        self.one(&g("attn_q_a"), &[d, ql], &h("attn.wq_a.weight"));
        self.one(&g("attn_q_a_norm"), &[ql], &h("attn.q_norm.weight"));
        self.one(&g("attn_q_b"), &[ql, nh * hd], &h("attn.wq_b.weight"));
        self.one(&g("attn_kv"), &[d, hd], &h("attn.wkv.weight"));
        self.one(&g("attn_kv_a_norm"), &[hd], &h("attn.kv_norm.weight"));
        self.one(&g("attn_sinks"), &[nh], &h("attn.attn_sink"));
        self.one(&g("attn_output_a"), &[group_in, ol], &h("attn.wo_a.weight"));
        self.one(&g("attn_output_b"), &[ol, d], &h("attn.wo_b.weight"));
    }

    /// The indexer's query projection and head weights (V4 and V4.1 alike).
    fn indexer_query(&mut self, s: &ModelConfig, p: Prefix) {
        let (ih, ihd) = (s.indexer_heads, s.indexer_head_dim);
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}attn.indexer.{x}.weight", p.hf);
        self.one(
            &g("indexer.attn_q_b"),
            &[s.q_lora_rank, ih * ihd],
            &h("wq_b"),
        );
        self.one(&g("indexer.proj"), &[s.n_embd, ih], &h("weights_proj"));
    }

    /// The FFN norm and the router's projection.
    fn router(&mut self, s: &ModelConfig, p: Prefix) {
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{x}", p.hf);
        self.one(&g("ffn_norm"), &[s.n_embd], &h("ffn_norm.weight"));
        let gate = h("ffn.gate.weight");
        self.one(&g("ffn_gate_inp"), &[s.n_embd, s.n_expert], &gate);
    }

    /// The routed experts, stacked, and the shared expert.
    fn experts(&mut self, s: &ModelConfig, p: Prefix) {
        let (d, ff, e) = (s.n_embd, s.expert_ff, s.n_expert);
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{x}", p.hf);
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
        for (gguf, w, ne) in [
            ("ffn_gate_shexp", "w1", [d, ff]),
            ("ffn_up_shexp", "w3", [d, ff]),
            ("ffn_down_shexp", "w2", [ff, d]),
        ] {
            self.one(&g(gguf), &ne, &h(&format!("ffn.shared_experts.{w}.weight")));
        }
    }

    /// A V4 block: a main layer (`blk.L.` from `layers.L.`) or the MTP
    /// block (`mtp.0.` from `mtp.0.`), with its compression `ratio` and,
    /// when `hash`, the hash-routing table instead of the router bias.
    fn block(&mut self, s: &ModelConfig, p: Prefix, ratio: usize, hash: bool) {
        let g = |x: &str| format!("{}{x}.weight", p.gguf);
        let h = |x: &str| format!("{}{x}", p.hf);
        self.hc_mix(s, p, "attn");
        self.attention(s, p);
        if ratio > 0 {
            let names = ["attn_compressor_", "attn.compressor."];
            self.compressor(s, p, names, ratio, s.head_dim);
            if ratio == CSA_RATIO {
                self.indexer_query(s, p);
                let names = ["indexer_compressor_", "attn.indexer.compressor."];
                self.compressor(s, p, names, ratio, s.indexer_head_dim);
            }
        }
        self.hc_mix(s, p, "ffn");
        self.router(s, p);
        if hash {
            let name = g("ffn_gate_tid2eid");
            let src = Source::Table(h("ffn.gate.tid2eid"));
            self.push(&name, &[s.n_expert_used, s.n_vocab], src);
        } else {
            let name = format!("{}exp_probs_b.bias", p.gguf);
            self.one(&name, &[s.n_expert], &h("ffn.gate.bias"));
        }
        self.experts(s, p);
    }

    /// A V4.1 drafter stage (`mtp.{k}.`): a window-only V4.1 block with
    /// the text and image-span router biases and the shared expert, in the
    /// drafter file's order.
    fn v41_stage(&mut self, s: &ModelConfig, p: Prefix) {
        self.hc_mix(s, p, "attn");
        self.attention(s, p);
        self.hc_mix(s, p, "ffn");
        self.router(s, p);
        for (bias, src) in [("exp_probs_b", "bias"), ("exp_probs_b_vl", "bias_vl")] {
            let name = format!("{}{bias}.bias", p.gguf);
            self.one(&name, &[s.n_expert], &format!("{}ffn.gate.{src}", p.hf));
        }
        self.experts(s, p);
    }

    /// A V4.1 layer `l` (`blk.L.` from `layers.L.`): V4's shared parts; on
    /// a kv source the single compressor (no APE, no overlap; a gate only
    /// above ratio 1) and the indexer's key projection, on an index source
    /// the indexer's query; both router biases; on an Engram layer its
    /// module, the table itself going to `tables` (written after
    /// everything else). In ds4's order (`layer_rank`).
    fn v41_layer(&mut self, s: &ModelConfig, v: &V41Spec, l: usize, tables: &mut Vec<GgufTensor>) {
        let (gguf, hf) = (format!("blk.{l}."), format!("layers.{l}."));
        let p = Prefix {
            gguf: &gguf,
            hf: &hf,
        };
        let (d, hd, hc) = (s.n_embd, s.head_dim, s.hc_count);
        let g = |x: &str| format!("{gguf}{x}.weight");
        let h = |x: &str| format!("{hf}{x}");
        let first = self.tensors.len();
        self.hc_mix(s, p, "attn");
        self.attention(s, p);
        if v.kv_source_layers.contains(&l) {
            let ratio = s.compress_ratios[l];
            let c = |x: &str| h(&format!("attn.compressor.{x}.weight"));
            self.one(&g("attn_compressor_kv"), &[d, hd], &c("wkv"));
            self.one(&g("attn_compressor_norm"), &[hd], &c("norm"));
            if ratio > 1 {
                self.one(&g("attn_compressor_gate"), &[d, hd], &c("wgate"));
            }
            let ihd = s.indexer_head_dim;
            let wk = h("attn.indexer.wk.weight");
            self.one(&g("indexer.attn_k"), &[hd, ihd], &wk);
            let k_norm = h("attn.indexer.k_norm.weight");
            self.one(&g("indexer.k_norm"), &[ihd], &k_norm);
        }
        if v.index_source_layers.contains(&l) {
            self.indexer_query(s, p);
        }
        self.hc_mix(s, p, "ffn");
        self.router(s, p);
        for (bias, src) in [("exp_probs_b", "bias"), ("exp_probs_b_vl", "bias_vl")] {
            let name = format!("{gguf}{bias}.bias");
            self.one(&name, &[s.n_expert], &h(&format!("ffn.gate.{src}")));
        }
        self.experts(s, p);
        if let Some(slot) = v.engram_layers.iter().position(|&x| x == l) {
            let e = |x: &str| h(&format!("engram.{x}"));
            self.one(&g("engram_q_norm"), &[d, hc], &e("q_weight"));
            self.one(&g("engram_k_norm"), &[d, hc], &e("k_weight"));
            let cols = v.engram_cols() * v.engram_head_dim;
            self.one(&g("engram_kv"), &[cols, (hc + 1) * d], &e("wkv.weight"));
            let ehd = v.engram_head_dim as u64;
            tables.push(GgufTensor {
                name: g("engram_embd"),
                ne: vec![ehd + ehd / 32, v.engram_rows()[slot]],
                source: Source::EngramRows {
                    name: e("embed.weight"),
                    head_dim: ehd,
                },
            });
        }
        let rank = |t: &GgufTensor| {
            let stem = t.name[gguf.len()..].rsplit_once('.').map_or("", |(a, _)| a);
            layer_rank(stem)
        };
        self.tensors[first..].sort_by_key(rank);
    }
}

/// A drafter's tensors: stage k's block (`stage`, with the drafter's
/// expert counts) from `mtp.{k}.*`; stage 0 adds the tap projection and
/// its norm, the last stage V4's hyper-connection head (V4.1 has none), the
/// norm, the Markov and confidence heads.
fn dspark_tensors(
    s: &ModelConfig,
    ds: &DsparkConfig,
    stage: impl Fn(&mut Dir, &ModelConfig, Prefix),
) -> Vec<GgufTensor> {
    let (d, hc, v, r) = (s.n_embd, s.hc_count, s.n_vocab, ds.markov_rank);
    let mut st = s.clone();
    st.core.n_expert = ds.n_expert;
    st.core.n_expert_used = ds.n_expert_used;
    let mut dir = Dir {
        tensors: Vec::new(),
    };
    for k in 0..ds.n_stages {
        let p = format!("mtp.{k}.");
        stage(&mut dir, &st, Prefix { gguf: &p, hf: &p });
        let w = |x: &str| format!("{p}{x}.weight");
        if k == 0 {
            let taps = ds.target_layers.len();
            dir.one(&w("main_proj"), &[d * taps, d], &w("main_proj"));
            dir.one(&w("main_norm"), &[d], &w("main_norm"));
        }
        if k + 1 == ds.n_stages {
            if ds.family == Arch::V4 {
                let h = |x: &str| format!("{p}hc_head_{x}");
                dir.one(&w("hc_head_fn"), &[hc * d, hc], &h("fn"));
                dir.one(&w("hc_head_scale"), &[1], &h("scale"));
                dir.one(&w("hc_head_base"), &[hc], &h("base"));
            }
            dir.one(&w("norm"), &[d], &w("norm"));
            for m in ["markov_head.markov_w1", "markov_head.markov_w2"] {
                dir.one(&w(m), &[r, v], &w(m));
            }
            let conf = w("confidence_head.proj");
            dir.one(&conf, &[d + r, 1], &conf);
        }
    }
    dir.tensors
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
    /// FP8 E4M3 rows with one E8M0 scale per 32 values of a row.
    EngramRows,
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
            family: Family::V4,
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
            family: Family::V4,
            tensors: dir.tensors,
        }
    }

    /// The directory of the DSpark drafter's file (`deepseek4-dspark`,
    /// docs/SPECULATIVE.md; `super::dspark` reads its configuration): stage
    /// k from `mtp.{k}.*`, each a window-only block with a router bias and
    /// the drafter's experts ([`dspark_tensors`]). It shares the main file's
    /// embedding and output head.
    pub fn v4_dspark(s: &ModelConfig, ds: &DsparkConfig) -> Layout {
        let stage = |dir: &mut Dir, st: &ModelConfig, p: Prefix| dir.block(st, p, 0, false);
        Layout {
            config: s.clone(),
            part: Part::Dspark,
            family: Family::V4,
            tensors: dspark_tensors(s, ds, stage),
        }
    }

    /// The V4.1 drafter's (`deepseek41-dspark`) for the model `c` of shapes
    /// `v`: each stage a window-only V4.1 block (both router biases, the
    /// shared expert), no learned head mix.
    pub fn v41_dspark(c: &V41Config, v: &V41Spec, ds: &DsparkConfig) -> Layout {
        let s = ModelConfig {
            core: c.core.clone(),
            n_hash_layers: 0,
        };
        let stage = |dir: &mut Dir, st: &ModelConfig, p: Prefix| dir.v41_stage(st, p);
        Layout {
            part: Part::Dspark,
            family: Family::V41(Box::new(v.clone())),
            tensors: dspark_tensors(&s, ds, stage),
            config: s,
        }
    }

    /// The `deepseek41` directory of a V4.1 model of hyper-parameters `c`
    /// and shapes `v` (docs/V41.md, "Tensors"): the embedding, the output
    /// norm and head, each layer (`Dir::v41_layer`), then the Engram
    /// tables, in the order of ds4's `deepseek41_quantize.py`. No output HC
    /// mix, no `tid2eid`, no APE, no indexer compressor.
    pub fn v41(c: &V41Config, v: &V41Spec) -> Layout {
        let s = ModelConfig {
            core: c.core.clone(),
            n_hash_layers: 0,
        };
        let (d, nv) = (s.n_embd, s.n_vocab);
        let mut dir = Dir {
            tensors: Vec::new(),
        };
        dir.one("token_embd.weight", &[d, nv], "embed.weight");
        dir.one("output_norm.weight", &[d], "norm.weight");
        dir.one("output.weight", &[d, nv], "head.weight");
        let mut tables = Vec::new();
        for l in 0..s.n_layer {
            dir.v41_layer(&s, v, l, &mut tables);
        }
        dir.tensors.extend(tables);
        Layout {
            config: s,
            part: Part::Main,
            family: Family::V41(Box::new(v.clone())),
            tensors: dir.tensors,
        }
    }

    /// The directory of a `config.json` (`json`, read from `file`): V4's,
    /// read and checked by [`V4Config::from_config`], or V4.1's, by
    /// [`V41Meta::from_config`] (its `general.name` left empty and no
    /// Engram tables: the directory depends on neither).
    pub fn from_config(json: &Value, file: &Path) -> Result<Layout, ConvertError> {
        Ok(match model_type(json, file)? {
            ModelType::V4 => Layout::v4(&V4Config::from_config(json, file, "")?.model),
            ModelType::V41 => {
                let m = V41Meta::from_config(json, file, "", None)?;
                Layout::v41(&m.config, &m.spec)
            }
        })
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
                Source::EngramRows { .. } => Storage::EngramRows,
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
        Storage::EngramRows => &[Dtype::F8E4m3],
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
        // Packed FP4 and V4.1's Engram rows: a scale per 32 values of a row.
        Dtype::I8 | Dtype::F8E4m3 if packed || storage == Storage::EngramRows => {
            let (r, c) = (want[0] as usize, want[1] as usize);
            if c % FP4_BLOCK != 0 {
                let what = if packed { "packed FP4" } else { "Engram" };
                return Err(v.error(format!(
                    "{what} rows of {c} values are not whole blocks of {FP4_BLOCK}"
                )));
            }
            Some((
                [r, c / FP4_BLOCK],
                format!("one per {FP4_BLOCK} values of a row"),
            ))
        }
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
