//! Deterministic DeepSeek V4.1 test models in ds4's `deepseek41` GGUF layout
//! (metadata as `gguf-tools/deepseek41_metadata.py` writes it, tensors in the
//! order and types of `deepseek41_quantize.py`, Engram tables last).
//!
//! [`V41Spec::tiny`] exercises every V4.1 path at a size the float reference
//! (`tools/reference/v41_reference.py`) runs in seconds: window-only, source,
//! reuse and reindex layers, a ratio-2 and a ratio-1 compressor, candidate
//! blocks that keep fewer rows than are visible, a window of 4, and Engram at
//! two layers (one of them also a kv source) with tables of a few hundred
//! rows, hashed through a non-identity token map with a compressed pad.
//! [`V41Spec::flash`] is the published V4.1 Flash shape; [`write_sparse_v41_flash`]
//! writes its full header over a data region that is a hole.

use std::io;
use std::path::Path;

use serde_json::json;

use super::tensors::{write_planned, Class, CoreShape, Data, Init, Planned, Planner};
use super::{Rng, Variant, Vocab};
use crate::gguf::{GgufWriter, MetaArray, MetaValue};
use crate::model::v41::engram::bucket_primes;
use crate::model::v41::V41Config;
use crate::quant::GgmlType;

/// Shapes of a generated V4.1 model (research §1 names in comments).
#[derive(Clone, Debug)]
pub struct V41Spec {
    pub core: CoreShape,
    pub kv_source_layers: Vec<usize>,
    pub index_source_layers: Vec<usize>,
    pub candidate_source: usize,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub rms_eps: f32,
    pub rope_base: u32,
    pub compress_rope_base: u32,
    pub swiglu_limit: f32,
    pub routed_scale: f32,
    pub engram_layers: Vec<usize>,
    pub engram_max_ngram: usize,
    pub engram_heads: usize,
    pub engram_head_dim: usize,
    /// Where the prime search starts (`engram_vocab_size`).
    pub engram_vocab_size: u64,
    /// Size of the compressed vocabulary the token map targets.
    pub engram_compressed_vocab: u32,
    /// The raw pad id (`engram_pad_token_id`); the file stores its compressed id.
    pub engram_pad_token: usize,
}

impl V41Spec {
    /// The tiny model of the research note's recipe, with the candidate
    /// geometry chosen so that a kept set always holds at least top-k rows
    /// ((topk_blocks − 1)·block + 1 ≥ top-k): the official code would
    /// otherwise fill the top-k with arbitrary rows scored −inf.
    pub fn tiny() -> V41Spec {
        V41Spec {
            core: CoreShape {
                name: "ds4 tiny V4.1 test model".into(),
                n_embd: 64,
                n_head: 4,
                head_dim: 32,
                n_rot: 8,
                q_lora_rank: 32,
                o_lora_rank: 16,
                o_groups: 2,
                sliding_window: 4,
                // L0-1 window; L2 source r2, L3 reuse; L4 source r1 (candidate
                // source), L5 reuse, L6 reindex within L4's candidates, L7 reuse of L6.
                compress_ratios: vec![0, 0, 2, 2, 1, 1, 1, 1],
                indexer_heads: 2,
                indexer_head_dim: 16,
                indexer_top_k: 3,
                n_expert: 4,
                n_expert_used: 2,
                expert_ff: 32,
                hc_count: 4,
                hc_sinkhorn_iters: 20,
                yarn_factor: 16.0,
                yarn_original_context: 65536,
                init_gain: 0.5,
                seed: 41,
            },
            kv_source_layers: vec![2, 4],
            index_source_layers: vec![2, 4, 6],
            candidate_source: 4,
            candidate_topk_blocks: 2,
            candidate_block_size: 2,
            rms_eps: 1e-20,
            rope_base: 10000,
            compress_rope_base: 160000,
            swiglu_limit: 10.0,
            routed_scale: 1.5,
            engram_layers: vec![1, 4],
            engram_max_ngram: 3,
            engram_heads: 2,
            engram_head_dim: 32,
            engram_vocab_size: 100,
            engram_compressed_vocab: 997,
            engram_pad_token: 2,
        }
    }

    /// The published V4.1 Flash shape (research §1).
    pub fn flash() -> V41Spec {
        let mut ratios = vec![0usize, 0];
        ratios.extend([2; 18]);
        ratios.extend([1; 20]);
        V41Spec {
            core: CoreShape {
                name: "DeepSeek V4.1 Flash".into(),
                n_embd: 5120,
                n_head: 64,
                head_dim: 512,
                n_rot: 64,
                q_lora_rank: 1280,
                o_lora_rank: 1024,
                o_groups: 8,
                sliding_window: 128,
                compress_ratios: ratios,
                indexer_heads: 32,
                indexer_head_dim: 128,
                indexer_top_k: 512,
                n_expert: 384,
                n_expert_used: 6,
                expert_ff: 2304,
                hc_count: 4,
                hc_sinkhorn_iters: 20,
                yarn_factor: 16.0,
                yarn_original_context: 65536,
                init_gain: 0.5,
                seed: 0,
            },
            kv_source_layers: vec![2, 8, 14, 20],
            index_source_layers: vec![2, 8, 14, 20, 24, 28, 32, 36],
            candidate_source: 20,
            candidate_topk_blocks: 2048,
            candidate_block_size: 8,
            rms_eps: 1e-20,
            rope_base: 10000,
            compress_rope_base: 160000,
            swiglu_limit: 10.0,
            routed_scale: 1.5,
            engram_layers: vec![1, 14],
            engram_max_ngram: 4,
            engram_heads: 8,
            engram_head_dim: 256,
            engram_vocab_size: 16_000_000,
            engram_compressed_vocab: 99092,
            engram_pad_token: 2,
        }
    }

    /// The Flash-width bench model (`cargo bench --bench v41`, `ds4-bench`):
    /// Flash's widths over `layers` layers (at least 2). Window layers first
    /// (two from 3 layers on, one with 2; an Engram table on the last of
    /// them, as the release's layer 1), then kv/index sources of ratio 2,
    /// the first one the candidate source, the second Engram table on the
    /// last layer. `engram_vocab` is where the prime search starts (the
    /// release's 16,000,000 gives 384 M-row tables; 50,000 gives 1.2 M).
    pub fn flash_bench(layers: usize, engram_vocab: u64) -> V41Spec {
        let layers = layers.max(2);
        let windows = if layers > 2 { 2 } else { 1 };
        let mut spec = V41Spec::flash();
        spec.core.compress_ratios = (0..layers)
            .map(|l| if l < windows { 0 } else { 2 })
            .collect();
        spec.kv_source_layers = (windows..layers).collect();
        spec.index_source_layers = (windows..layers).collect();
        spec.candidate_source = windows;
        spec.engram_layers = vec![windows - 1, layers - 1];
        spec.engram_vocab_size = engram_vocab;
        spec.core.name = format!("V4.1 bench model ({layers} Flash-width layers, random blocks)");
        spec
    }

    pub fn n_layer(&self) -> usize {
        self.core.n_layer()
    }

    /// The spec whose tensor plan has the directory of a V4.1 model of
    /// hyper-parameters `c` whose Engram primes start at `engram_vocab_size`
    /// (the converter's name map and types, `ds4::convert`): every shape of
    /// `c`; the constants the plan does not use are the tiny model's.
    pub fn from_config(c: &V41Config, engram_vocab_size: u64) -> V41Spec {
        let tiny = V41Spec::tiny();
        let n = c.n_layer;
        V41Spec {
            core: CoreShape::with_shapes_of(c, tiny.core),
            kv_source_layers: c.kv_source_layers.clone(),
            index_source_layers: c.index_source_layers.clone(),
            candidate_source: c.candidate_source.unwrap_or(n),
            candidate_topk_blocks: c.candidate_topk_blocks,
            candidate_block_size: c.candidate_block_size,
            engram_layers: c.engram.layer_ids.clone(),
            engram_max_ngram: c.engram.max_ngram,
            engram_heads: c.engram.n_heads,
            engram_head_dim: c.engram.head_dim,
            engram_vocab_size,
            engram_compressed_vocab: c.engram.compressed_vocab,
            ..tiny
        }
    }

    /// Hash columns per Engram layer.
    pub fn engram_cols(&self) -> usize {
        (self.engram_max_ngram - 1) * self.engram_heads
    }

    /// The official prime layout ([`bucket_primes`]), layer-major.
    pub fn engram_primes(&self) -> Vec<u64> {
        bucket_primes(
            self.engram_layers.len(),
            self.engram_max_ngram,
            self.engram_heads,
            self.engram_vocab_size,
        )
    }

    /// Table rows per Engram layer: the sum of its primes.
    pub fn engram_rows(&self) -> Vec<u64> {
        self.engram_primes()
            .chunks(self.engram_cols())
            .map(|c| c.iter().sum())
            .collect()
    }

    /// Odd multipliers below the reference's bound, seeded per layer as the
    /// official ones are (their numpy draws cannot be reproduced here, and
    /// need not be: the file carries them).
    pub fn engram_multipliers(&self) -> Vec<u64> {
        let bound = (i64::MAX as u64 / self.engram_compressed_vocab as u64) / 2;
        let mut out = Vec::new();
        for &l in &self.engram_layers {
            let mut rng = Rng::new(self.core.seed ^ (10007 * l as u64));
            for _ in 0..self.engram_max_ngram {
                out.push(rng.below(bound) * 2 + 1);
            }
        }
        out
    }

    /// A non-identity many-to-one token map onto the compressed vocabulary.
    pub fn engram_token_map(&self, n_vocab: usize) -> Vec<u32> {
        let c = self.engram_compressed_vocab as u64;
        (0..n_vocab as u64)
            .map(|i| ((i * 7919 + 13) % c) as u32)
            .collect()
    }
}

/// The place of a layer's tensor (`stem`: its name after `blk.L.`, without
/// `.weight` / `.bias`) in ds4's order ([`LAYER_ORDER`]).
pub(crate) fn layer_rank(stem: &str) -> Option<usize> {
    LAYER_ORDER.iter().position(|&x| x == stem)
}

/// The order ds4's `deepseek41_quantize.py` writes a layer's tensors in
/// (by name after `blk.L.`); the shared planners add them in V4's order.
#[rustfmt::skip]
const LAYER_ORDER: [&str; 35] = [
    "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "attn_norm",
    "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "ffn_norm",
    "attn_sinks", "attn_q_a", "attn_q_b", "attn_q_a_norm", "attn_kv", "attn_kv_a_norm",
    "attn_output_a", "attn_output_b",
    "attn_compressor_kv", "attn_compressor_norm", "indexer.attn_k", "indexer.k_norm",
    "attn_compressor_gate", "indexer.attn_q_b", "indexer.proj",
    "ffn_gate_inp", "exp_probs_b", "exp_probs_b_vl",
    "ffn_gate_shexp", "ffn_gate_exps", "ffn_up_shexp", "ffn_up_exps",
    "ffn_down_shexp", "ffn_down_exps",
    "engram_q_norm", "engram_k_norm", "engram_kv",
];

/// The tensors of a V4.1 model: V4's shared parts per layer, V4.1's
/// compressor on kv sources, the indexer query on index sources, the
/// image-span router bias and Engram modules, each layer in ds4's order
/// ([`LAYER_ORDER`]), and the Engram tables last (as ds4 writes them).
fn plan(s: &V41Spec, n_vocab: usize) -> Vec<Planned> {
    let (d, hc, hd, ihd) = (
        s.core.n_embd,
        s.core.hc_count,
        s.core.head_dim,
        s.core.indexer_head_dim,
    );
    let mut t = Planner::new(&s.core);
    let mut tables = Vec::new();
    let nd = t.normal(d);
    t.token_embedding(n_vocab);
    t.output_head(n_vocab);
    let rows = s.engram_rows();
    for (l, &ratio) in s.core.compress_ratios.iter().enumerate() {
        let p = format!("blk.{l}.");
        let first = t.out.len();
        let n = |x: &str| format!("{p}{x}");
        t.hc_mix(&p, "attn");
        t.attention(&p);
        if s.kv_source_layers.contains(&l) {
            let nhd = t.normal(hd);
            t.add(
                n("attn_compressor_kv.weight"),
                &[d, hd],
                Class::F16Dense,
                nd,
            );
            t.add(
                n("attn_compressor_norm.weight"),
                &[hd],
                Class::Vector,
                Init::NormWeight,
            );
            t.add(n("indexer.attn_k.weight"), &[hd, ihd], Class::F16Dense, nhd);
            t.add(
                n("indexer.k_norm.weight"),
                &[ihd],
                Class::Vector,
                Init::NormWeight,
            );
            if ratio > 1 {
                t.add(
                    n("attn_compressor_gate.weight"),
                    &[d, hd],
                    Class::F16Dense,
                    nd,
                );
            }
        }
        if s.index_source_layers.contains(&l) {
            t.indexer_query(&p);
        }
        t.hc_mix(&p, "ffn");
        t.router(&p, Class::Vector);
        for bias in ["exp_probs_b.bias", "exp_probs_b_vl.bias"] {
            t.add(
                n(bias),
                &[s.core.n_expert],
                Class::Vector,
                Init::Normal(0.1),
            );
        }
        t.experts(&p);
        t.shared_expert(&p);
        if let Some(slot) = s.engram_layers.iter().position(|&x| x == l) {
            for part in ["q", "k"] {
                let name = n(&format!("engram_{part}_norm.weight"));
                t.add(name, &[d, hc], Class::Vector, Init::NormWeight);
            }
            let cols = s.engram_cols() * s.engram_head_dim;
            let ncols = t.normal(cols);
            t.add(
                n("engram_kv.weight"),
                &[cols, (hc + 1) * d],
                Class::F16Dense,
                ncols,
            );
            let row_bytes = s.engram_head_dim + s.engram_head_dim / 32;
            tables.push(Planned {
                name: n("engram_embd.weight"),
                ne: vec![row_bytes as u64, rows[slot]],
                class: Class::EngramRows,
                init: Init::EngramRows,
            });
        }
        let rank = |t: &Planned| {
            let stem = t.name[p.len()..].rsplit_once('.').map_or("", |(a, _)| a);
            layer_rank(stem)
        };
        t.out[first..].sort_by_key(rank);
    }
    t.out.extend(tables);
    t.out
}

/// The HF `config.json` the file embeds (`deepseek41.config`), text fields
/// nested under `text_config` as in the release.
fn hf_config(s: &V41Spec, n_vocab: usize) -> serde_json::Value {
    let mut ratios: Vec<usize> = s.core.compress_ratios.clone();
    ratios.extend([0, 0, 0]); // the MTP slots of the release
    let text: Vec<(&str, serde_json::Value)> = vec![
        ("vocab_size", json!(n_vocab)),
        ("hidden_size", json!(s.core.n_embd)),
        ("num_hidden_layers", json!(s.n_layer())),
        ("num_attention_heads", json!(s.core.n_head)),
        ("num_key_value_heads", json!(1)),
        ("head_dim", json!(s.core.head_dim)),
        ("qk_rope_head_dim", json!(s.core.n_rot)),
        ("q_lora_rank", json!(s.core.q_lora_rank)),
        ("o_lora_rank", json!(s.core.o_lora_rank)),
        ("o_groups", json!(s.core.o_groups)),
        ("n_routed_experts", json!(s.core.n_expert)),
        ("n_shared_experts", json!(1)),
        ("num_experts_per_tok", json!(s.core.n_expert_used)),
        ("moe_intermediate_size", json!(s.core.expert_ff)),
        ("scoring_func", json!("sqrtsoftplus")),
        ("topk_method", json!("noaux_tc")),
        ("norm_topk_prob", json!(true)),
        ("routed_scaling_factor", json!(s.routed_scale)),
        ("swiglu_limit", json!(s.swiglu_limit)),
        ("rms_norm_eps", json!(s.rms_eps)),
        ("rope_theta", json!(s.rope_base)),
        ("compress_rope_theta", json!(s.compress_rope_base)),
        ("max_position_embeddings", json!(1048576)),
        ("sliding_window", json!(s.core.sliding_window)),
        ("compress_ratios", json!(ratios)),
        ("kv_source_layer_ids", json!(s.kv_source_layers)),
        ("index_source_layer_ids", json!(s.index_source_layers)),
        ("index_n_heads", json!(s.core.indexer_heads)),
        ("index_head_dim", json!(s.core.indexer_head_dim)),
        ("index_topk", json!(s.core.indexer_top_k)),
        ("candidate_source_layer_id", json!(s.candidate_source)),
        ("candidate_topk_blocks", json!(s.candidate_topk_blocks)),
        ("candidate_block_size", json!(s.candidate_block_size)),
        ("hc_mult", json!(s.core.hc_count)),
        ("hc_sinkhorn_iters", json!(s.core.hc_sinkhorn_iters)),
        ("hc_eps", json!(1e-6)),
        ("hidden_act", json!("silu")),
        ("engram_layer_ids", json!(s.engram_layers)),
        ("engram_num_embeddings", json!(s.engram_rows())),
        ("engram_max_ngram_size", json!(s.engram_max_ngram)),
        ("engram_n_heads", json!(s.engram_heads)),
        ("engram_head_dim", json!(s.engram_head_dim)),
        ("engram_vocab_size", json!(s.engram_vocab_size)),
        ("engram_pad_token_id", json!(s.engram_pad_token)),
        (
            "engram_compressed_vocab_size",
            json!(s.engram_compressed_vocab),
        ),
        (
            "rope_scaling",
            json!({"type": "yarn", "factor": s.core.yarn_factor,
                "original_max_position_embeddings": s.core.yarn_original_context,
                "beta_fast": 32, "beta_slow": 1}),
        ),
    ];
    let text: serde_json::Map<String, serde_json::Value> =
        text.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "text_config": text,
    })
}

fn add_metadata(w: &mut GgufWriter, s: &V41Spec, vocab: &Vocab) {
    let n_vocab = vocab.tokens.len();
    let k = |x: &str| format!("deepseek41.{x}");
    let token_map = s.engram_token_map(n_vocab);
    w.add_str("general.architecture", "deepseek41");
    w.add_str("general.name", &s.core.name);
    w.add_u32("general.alignment", 16384);
    w.add_str(
        &k("config"),
        &serde_json::to_string(&hf_config(s, n_vocab)).unwrap_or_default(),
    );
    w.add_str(&k("engram.encoding"), "e4m3_e8m0_32_row264");
    let u32s = |v: &[usize]| MetaArray::U32(v.iter().map(|&x| x as u32).collect());
    w.add_array(&k("engram.layer_ids"), u32s(&s.engram_layers));
    w.add_array(
        &k("engram.rows"),
        MetaArray::U32(s.engram_rows().iter().map(|&x| x as u32).collect()),
    );
    w.add_u32(
        &k("engram.compressed_vocab_size"),
        s.engram_compressed_vocab,
    );
    w.add_u32(&k("engram.pad_id"), token_map[s.engram_pad_token]);
    w.add_array(&k("engram.token_map"), MetaArray::U32(token_map));
    w.add_array(
        &k("engram.primes"),
        MetaArray::U32(s.engram_primes().iter().map(|&x| x as u32).collect()),
    );
    w.add_array(
        &k("engram.multipliers"),
        MetaArray::U64(s.engram_multipliers()),
    );
    super::add_tokenizer(w, vocab, true);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
    let u = |x: usize| x as u32;
    for (key, v) in [
        ("vocab_size", u(n_vocab)),
        ("hidden_size", u(s.core.n_embd)),
        ("moe_intermediate_size", u(s.core.expert_ff)),
        ("num_hidden_layers", u(s.n_layer())),
        ("num_attention_heads", u(s.core.n_head)),
        ("num_key_value_heads", 1),
        ("head_dim", u(s.core.head_dim)),
        ("qk_rope_head_dim", u(s.core.n_rot)),
        ("q_lora_rank", u(s.core.q_lora_rank)),
        ("o_lora_rank", u(s.core.o_lora_rank)),
        ("o_groups", u(s.core.o_groups)),
        ("n_routed_experts", u(s.core.n_expert)),
        ("n_shared_experts", 1),
        ("num_experts_per_tok", u(s.core.n_expert_used)),
        ("max_position_embeddings", 1 << 20),
        ("sliding_window", u(s.core.sliding_window)),
        ("index_n_heads", u(s.core.indexer_heads)),
        ("index_head_dim", u(s.core.indexer_head_dim)),
        ("index_topk", u(s.core.indexer_top_k)),
        ("candidate_source_layer_id", u(s.candidate_source)),
        ("candidate_topk_blocks", u(s.candidate_topk_blocks)),
        ("candidate_block_size", u(s.candidate_block_size)),
        ("hc_mult", u(s.core.hc_count)),
        ("hc_sinkhorn_iters", u(s.core.hc_sinkhorn_iters)),
        ("rope_theta", s.rope_base),
        ("compress_rope_theta", s.compress_rope_base),
    ] {
        w.add_u32(&k(key), v);
    }
    for (key, v) in [
        ("rms_norm_eps", s.rms_eps),
        ("hc_eps", 1e-6),
        ("swiglu_limit", s.swiglu_limit),
        ("routed_scaling_factor", s.routed_scale),
    ] {
        w.add_f32(&k(key), v);
    }
    for (key, v) in [
        ("scoring_func", "sqrtsoftplus"),
        ("hidden_act", "silu"),
        ("topk_method", "noaux_tc"),
    ] {
        w.add_str(&k(key), v);
    }
    w.add_bool(&k("norm_topk_prob"), true);
    w.add_array(&k("compress_ratios"), u32s(&s.core.compress_ratios));
    w.add_array(&k("kv_source_layer_ids"), u32s(&s.kv_source_layers));
    w.add_array(&k("index_source_layer_ids"), u32s(&s.index_source_layers));
    for (key, v) in [
        ("factor", s.core.yarn_factor),
        ("beta_fast", 32.0),
        ("beta_slow", 1.0),
        (
            "original_max_position_embeddings",
            s.core.yarn_original_context as f32,
        ),
    ] {
        w.add_f32(&k(&format!("rope_scaling.{key}")), v);
    }
}

/// The tensors of a V4.1 model in file order, each with its GGUF shape
/// and its type in `variant` (ds4's published mix of that name): the plan
/// the generator writes, which the converter (`ds4::convert::write`)
/// follows.
pub fn tensor_types(
    spec: &V41Spec,
    variant: Variant,
    n_vocab: usize,
) -> Vec<(String, Vec<u64>, GgmlType)> {
    super::typed(plan(spec, n_vocab), variant)
}

/// Writes a V4.1 model with random weights.
pub fn write_v41_model(
    spec: &V41Spec,
    variant: Variant,
    vocab: &Vocab,
    path: &Path,
) -> io::Result<()> {
    let mut w = GgufWriter::new();
    add_metadata(&mut w, spec, vocab);
    let plan = plan(spec, vocab.tokens.len());
    write_planned(w, plan, variant, spec.core.seed, Data::Values, path)
}

/// Writes `spec` in ds4's q2 recipe with random quantized blocks, for
/// benchmarks at real widths (`bench/v41.rs`): seconds per gigabyte instead
/// of the minutes quantizing seeded values would take. Not for goldens.
pub fn write_v41_bench_model(spec: &V41Spec, vocab: &Vocab, path: &Path) -> io::Result<()> {
    let mut w = GgufWriter::new();
    add_metadata(&mut w, spec, vocab);
    let plan = plan(spec, vocab.tokens.len());
    write_planned(
        w,
        plan,
        Variant::Q2,
        spec.core.seed,
        Data::RandomBlocks,
        path,
    )
}

/// Writes the full header of a V4.1 Flash file in ds4's q2 recipe (1,046
/// tensors, the two Engram tables last) over a data region that is a hole.
pub fn write_sparse_v41_flash(vocab: &Vocab, path: &Path) -> io::Result<()> {
    let spec = V41Spec::flash();
    let mut w = GgufWriter::new();
    add_metadata(&mut w, &spec, vocab);
    let plan = plan(&spec, vocab.tokens.len());
    write_planned(w, plan, Variant::Q2, 0, Data::Hole, path)
}

/// Writes `spec` with some metadata keys replaced or removed and some tensors
/// dropped, as a hole file: the bad-input tests' raw material.
pub fn write_v41_edited(
    spec: &V41Spec,
    vocab: &Vocab,
    path: &Path,
    replace: &[(&str, Option<MetaValue>)],
    drop_tensors: &[&str],
) -> io::Result<()> {
    let mut full = GgufWriter::new();
    add_metadata(&mut full, spec, vocab);
    let mut w = GgufWriter::new();
    for (k, v) in full.kvs() {
        match replace.iter().find(|(r, _)| r == k) {
            Some((_, Some(nv))) => w.add_kv(k, nv.clone()),
            Some((_, None)) => {}
            None => w.add_kv(k, v.clone()),
        }
    }
    let plan: Vec<Planned> = plan(spec, vocab.tokens.len())
        .into_iter()
        .filter(|t| !drop_tensors.contains(&t.name.as_str()))
        .collect();
    write_planned(w, plan, Variant::F32, spec.core.seed, Data::Hole, path)
}
