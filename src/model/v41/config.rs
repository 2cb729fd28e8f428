//! DeepSeek V4.1 hyper-parameters, read from the metadata ds4's
//! `gguf-tools/deepseek41_metadata.py` writes (`deepseek41.*`), with the layer
//! roles (source / reindex / reuse) and the Engram hash layout derived and
//! checked here. docs/V41.md lists every key and where it comes from.
//!
//! The file stores the HF field names (`hidden_size`, `num_hidden_layers`, …)
//! as u32/f32 keys; the three Engram shapes that ds4 keeps only inside the
//! embedded HF config JSON (`deepseek41.config`: `engram_max_ngram_size`,
//! `engram_n_heads`, `engram_head_dim`) are read from there, so a wrong prime
//! or multiplier count is caught against them instead of being guessed from
//! the arrays themselves.

use crate::gguf::{GgufFile, MetaArray, MetaValue};
use crate::graph::ops::rope::{RopeConfig, Yarn};
use crate::model::config::{found, layer_rope, meta_float, meta_uint};
use crate::model::ModelError;

/// The `general.architecture` of a V4.1 main model.
pub const ARCH: &str = "deepseek41";

/// What a layer's attention does besides its sliding window (research §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRole {
    /// Ratio 0: the sliding window only.
    Window,
    /// Owns a compressor and index keys and runs its own indexer.
    Source { ratio: usize },
    /// Runs its own indexer over the keys of kv-source `kv_source`
    /// (restricted to the candidate blocks when the model has a candidate
    /// source below this layer).
    Reindex { ratio: usize, kv_source: usize },
    /// Reads `kv_source`'s compressed rows and the top-k `index_source`
    /// published last.
    Reuse {
        ratio: usize,
        kv_source: usize,
        index_source: usize,
    },
}

impl LayerRole {
    pub fn ratio(self) -> usize {
        match self {
            LayerRole::Window => 0,
            LayerRole::Source { ratio }
            | LayerRole::Reindex { ratio, .. }
            | LayerRole::Reuse { ratio, .. } => ratio,
        }
    }

    /// True when this layer runs an indexer.
    pub fn indexes(self) -> bool {
        matches!(self, LayerRole::Source { .. } | LayerRole::Reindex { .. })
    }
}

/// The Engram n-gram hash layout (research §2.5), as stored in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct EngramConfig {
    /// Layers carrying an Engram module, ascending.
    pub layer_ids: Vec<usize>,
    /// Table rows per Engram layer (= the sum of that layer's primes).
    pub rows: Vec<u64>,
    /// N-gram orders 2..=max_ngram are hashed; `max_ngram` multipliers per layer.
    pub max_ngram: usize,
    pub n_heads: usize,
    /// Width of one table row (256 in the real model).
    pub head_dim: usize,
    pub compressed_vocab: u32,
    /// The hashing pad, already a compressed id (`token_map[engram_pad_token_id]`).
    pub pad_id: u32,
    /// Raw token id → compressed id, one entry per vocabulary id.
    pub token_map: Vec<u32>,
    /// `layer × (max_ngram − 1)·n_heads` primes, layer-major.
    pub primes: Vec<u64>,
    /// `layer × max_ngram` odd multipliers, layer-major.
    pub multipliers: Vec<u64>,
}

impl EngramConfig {
    /// Hash columns per layer: `(max_ngram − 1)·n_heads` (24 in the real model).
    pub fn cols(&self) -> usize {
        (self.max_ngram - 1) * self.n_heads
    }

    /// Bytes of one stored row: `head_dim` E4M3 codes and one E8M0 scale per 32.
    pub fn row_bytes(&self) -> usize {
        self.head_dim + self.head_dim / 32
    }

    /// Index of `layer` among the Engram layers.
    pub fn slot(&self, layer: usize) -> Option<usize> {
        self.layer_ids.iter().position(|&l| l == layer)
    }

    pub fn layer_primes(&self, slot: usize) -> &[u64] {
        &self.primes[slot * self.cols()..(slot + 1) * self.cols()]
    }

    pub fn layer_multipliers(&self, slot: usize) -> &[u64] {
        &self.multipliers[slot * self.max_ngram..(slot + 1) * self.max_ngram]
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct V41Config {
    pub name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    pub sliding_window: usize,
    pub compress_ratios: Vec<usize>,
    pub kv_source_layers: Vec<usize>,
    pub index_source_layers: Vec<usize>,
    pub roles: Vec<LayerRole>,
    pub indexer_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_top_k: usize,
    /// Layer whose indexer picks the candidate blocks (research §2.3 step 8).
    pub candidate_source: Option<usize>,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub hc_count: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub compress_rope_base: f32,
    pub yarn: Option<Yarn>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub n_expert_shared: usize,
    pub routed_scale: f32,
    pub norm_topk_prob: bool,
    pub swiglu_limit: f32,
    pub context_length: Option<u64>,
    pub engram: EngramConfig,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

fn bad(k: &str, expected: impl Into<String>, found: impl Into<String>) -> ModelError {
    ModelError::BadKey {
        key: key(k),
        expected: expected.into(),
        found: found.into(),
    }
}

fn req_uint(f: &GgufFile, k: &str) -> Result<usize, ModelError> {
    meta_uint(f, &key(k))
}

fn req_pos(f: &GgufFile, k: &str) -> Result<usize, ModelError> {
    let v = req_uint(f, k)?;
    if v == 0 {
        return Err(bad(k, "a positive value", "0"));
    }
    Ok(v)
}

fn req_float(f: &GgufFile, k: &str) -> Result<f32, ModelError> {
    meta_float(f, &key(k))
}

fn req_array<'f>(f: &'f GgufFile, k: &str) -> Result<&'f MetaArray, ModelError> {
    f.get_array(&key(k)).ok_or_else(|| match f.get(&key(k)) {
        None => ModelError::MissingKey { key: key(k) },
        Some(v) => bad(k, "an array of integers", found(Some(v))),
    })
}

/// An array of unsigned integers, widened.
fn req_uints(f: &GgufFile, k: &str) -> Result<Vec<u64>, ModelError> {
    let a = req_array(f, k)?;
    let v = a
        .as_i64_vec()
        .ok_or_else(|| bad(k, "an array of integers", a.summary()))?;
    if v.iter().any(|&x| x < 0) {
        return Err(bad(k, "non-negative integers", a.summary()));
    }
    Ok(v.into_iter().map(|x| x as u64).collect())
}

/// Strictly ascending layer ids below `n_layer`.
fn layer_list(f: &GgufFile, k: &str, n_layer: usize) -> Result<Vec<usize>, ModelError> {
    let v = req_uints(f, k)?;
    if v.windows(2).any(|w| w[0] >= w[1]) || v.iter().any(|&l| l >= n_layer as u64) {
        return Err(bad(
            k,
            format!("ascending layer ids below {n_layer}"),
            format!("{v:?}"),
        ));
    }
    Ok(v.into_iter().map(|x| x as usize).collect())
}

/// The HF text config embedded as JSON (`deepseek41.config`), `text_config`
/// when nested.
fn embedded_config(f: &GgufFile) -> Result<serde_json::Value, ModelError> {
    let k = "config";
    let s = f.get_str(&key(k)).ok_or_else(|| match f.get(&key(k)) {
        None => ModelError::MissingKey { key: key(k) },
        Some(v) => bad(k, "the HF config as a JSON string", found(Some(v))),
    })?;
    let v: serde_json::Value =
        serde_json::from_str(s).map_err(|e| bad(k, "valid JSON", e.to_string()))?;
    Ok(match v.get("text_config") {
        Some(t) if t.is_object() => t.clone(),
        _ => v,
    })
}

fn json_uint(cfg: &serde_json::Value, field: &str) -> Result<usize, ModelError> {
    match cfg.get(field) {
        None => Err(ModelError::MissingKey {
            key: format!("{} (text_config.{field})", key("config")),
        }),
        Some(v) => v
            .as_u64()
            .filter(|&x| (1..=1 << 20).contains(&x))
            .map(|x| x as usize)
            .ok_or_else(|| {
                bad(
                    "config",
                    format!("text_config.{field} a positive integer"),
                    v.to_string(),
                )
            }),
    }
}

impl V41Config {
    /// Reads and checks every hyper-parameter of a `deepseek41` file.
    pub fn from_gguf(f: &GgufFile) -> Result<V41Config, ModelError> {
        match f.get_str("general.architecture") {
            Some(ARCH) => {}
            other => {
                return Err(ModelError::WrongKind(format!(
                    "general.architecture is {other:?}, expected {ARCH:?}"
                )))
            }
        }
        let n_layer = req_pos(f, "num_hidden_layers")?;
        let n_embd = req_pos(f, "hidden_size")?;
        let n_vocab = req_pos(f, "vocab_size")?;
        let n_head = req_pos(f, "num_attention_heads")?;
        let n_kv = req_uint(f, "num_key_value_heads")?;
        if n_kv != 1 {
            return Err(bad(
                "num_key_value_heads",
                "1 (one shared K=V head)",
                n_kv.to_string(),
            ));
        }
        let head_dim = req_pos(f, "head_dim")?;
        let n_rot = req_pos(f, "qk_rope_head_dim")?;
        let indexer_head_dim = req_pos(f, "index_head_dim")?;
        if n_rot % 2 != 0 || n_rot > head_dim || n_rot > indexer_head_dim {
            return Err(bad(
                "qk_rope_head_dim",
                format!(
                    "even and at most head_dim {head_dim} and index_head_dim {indexer_head_dim}"
                ),
                n_rot.to_string(),
            ));
        }
        let q_lora_rank = req_pos(f, "q_lora_rank")?;
        let o_lora_rank = req_pos(f, "o_lora_rank")?;
        let o_groups = req_pos(f, "o_groups")?;
        if n_head % o_groups != 0 {
            return Err(bad(
                "o_groups",
                format!("a divisor of num_attention_heads {n_head}"),
                o_groups.to_string(),
            ));
        }
        let sliding_window = req_pos(f, "sliding_window")?;

        let ratios = req_uints(f, "compress_ratios")?;
        if ratios.len() < n_layer || ratios[..n_layer].iter().any(|&r| r > 1 << 20) {
            return Err(bad(
                "compress_ratios",
                format!("{n_layer} ratios (0 = window only)"),
                format!("{ratios:?}"),
            ));
        }
        let compress_ratios: Vec<usize> = ratios[..n_layer].iter().map(|&r| r as usize).collect();
        let kv_source_layers = layer_list(f, "kv_source_layer_ids", n_layer)?;
        let index_source_layers = layer_list(f, "index_source_layer_ids", n_layer)?;
        let roles = layer_roles(&compress_ratios, &kv_source_layers, &index_source_layers)?;

        let indexer_heads = req_pos(f, "index_n_heads")?;
        let indexer_top_k = req_pos(f, "index_topk")?;
        let cand = req_uint(f, "candidate_source_layer_id")?;
        let candidate_topk_blocks = req_uint(f, "candidate_topk_blocks")?;
        let candidate_block_size = req_uint(f, "candidate_block_size")?;
        // The official config marks "no candidate source" with a negative id;
        // ds4 stores u32, so an id past the last layer means none.
        let candidate_source = (cand < n_layer).then_some(cand);
        if let Some(c) = candidate_source {
            if !index_source_layers.contains(&c) {
                return Err(bad(
                    "candidate_source_layer_id",
                    "an index-source layer",
                    c.to_string(),
                ));
            }
            if candidate_topk_blocks == 0 || candidate_block_size == 0 {
                return Err(bad(
                    "candidate_topk_blocks",
                    "positive block count and size with a candidate source",
                    format!("{candidate_topk_blocks} blocks of {candidate_block_size}"),
                ));
            }
        }

        let hc_count = req_pos(f, "hc_mult")?;
        let hc_sinkhorn_iters = req_pos(f, "hc_sinkhorn_iters")?;
        let hc_eps = req_float(f, "hc_eps")?;
        let rms_eps = req_float(f, "rms_norm_eps")?;
        if rms_eps <= 0.0 || hc_eps < 0.0 {
            return Err(bad(
                "rms_norm_eps",
                "positive epsilons",
                format!("{rms_eps}, {hc_eps}"),
            ));
        }
        let rope_base = req_uint(f, "rope_theta")? as f32;
        let compress_rope_base = req_uint(f, "compress_rope_theta")? as f32;
        if rope_base <= 1.0 || compress_rope_base <= 1.0 {
            return Err(bad(
                "rope_theta",
                "RoPE bases > 1",
                format!("{rope_base}, {compress_rope_base}"),
            ));
        }
        let factor = req_float(f, "rope_scaling.factor")?;
        let yarn = if factor > 1.0 {
            let y = Yarn {
                factor,
                original_context: req_float(f, "rope_scaling.original_max_position_embeddings")?
                    as u64,
                beta_fast: req_float(f, "rope_scaling.beta_fast")?,
                beta_slow: req_float(f, "rope_scaling.beta_slow")?,
            };
            if y.original_context == 0 || y.beta_fast <= 0.0 || y.beta_slow <= 0.0 {
                return Err(bad(
                    "rope_scaling",
                    "positive YaRN parameters",
                    format!("{y:?}"),
                ));
            }
            Some(y)
        } else if factor < 1.0 {
            return Err(bad("rope_scaling.factor", "≥ 1", factor.to_string()));
        } else {
            None
        };

        let n_expert = req_pos(f, "n_routed_experts")?;
        let n_expert_used = req_pos(f, "num_experts_per_tok")?;
        if n_expert_used > n_expert {
            return Err(bad(
                "num_experts_per_tok",
                format!("≤ n_routed_experts {n_expert}"),
                n_expert_used.to_string(),
            ));
        }
        let expert_ff = req_pos(f, "moe_intermediate_size")?;
        let n_expert_shared = req_uint(f, "n_shared_experts")?;
        if n_expert_shared != 1 {
            return Err(bad(
                "n_shared_experts",
                "1 (the official MoE asserts it)",
                n_expert_shared.to_string(),
            ));
        }
        for (k, want) in [
            ("scoring_func", "sqrtsoftplus"),
            ("topk_method", "noaux_tc"),
        ] {
            match f.get_str(&key(k)) {
                Some(v) if v == want => {}
                None if f.get(&key(k)).is_none() => {
                    return Err(ModelError::MissingKey { key: key(k) })
                }
                _ => return Err(bad(k, want, found(f.get(&key(k))))),
            }
        }
        let norm_topk_prob = match f.get(&key("norm_topk_prob")) {
            Some(MetaValue::Bool(b)) => *b,
            None => {
                return Err(ModelError::MissingKey {
                    key: key("norm_topk_prob"),
                })
            }
            Some(v) => return Err(bad("norm_topk_prob", "bool", found(Some(v)))),
        };
        let routed_scale = req_float(f, "routed_scaling_factor")?;
        let swiglu_limit = req_float(f, "swiglu_limit")?;
        if swiglu_limit < 0.0 {
            return Err(bad("swiglu_limit", "≥ 0", swiglu_limit.to_string()));
        }
        let context_length = f.get_uint(&key("max_position_embeddings"));
        let engram = read_engram(f, n_layer, n_vocab)?;

        Ok(V41Config {
            name: f.get_str("general.name").unwrap_or("").to_string(),
            n_layer,
            n_embd,
            n_vocab,
            n_head,
            head_dim,
            n_rot,
            q_lora_rank,
            o_lora_rank,
            o_groups,
            sliding_window,
            compress_ratios,
            kv_source_layers,
            index_source_layers,
            roles,
            indexer_heads,
            indexer_head_dim,
            indexer_top_k,
            candidate_source,
            candidate_topk_blocks,
            candidate_block_size,
            hc_count,
            hc_sinkhorn_iters,
            hc_eps,
            rms_eps,
            rope_base,
            compress_rope_base,
            yarn,
            n_expert,
            n_expert_used,
            expert_ff,
            n_expert_shared,
            routed_scale,
            norm_topk_prob,
            swiglu_limit,
            context_length,
            engram,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn hc_mix_dim(&self) -> usize {
        (2 + self.hc_count) * self.hc_count
    }

    /// True when index-source layer `l` keeps only the candidate blocks.
    pub fn uses_candidates(&self, l: usize) -> bool {
        self.candidate_source.is_some_and(|c| c < l) && self.roles[l].indexes()
    }

    /// The RoPE of layer `l`: compressed layers use the compress base with
    /// YaRN, window layers the plain base without it (as in V4).
    pub fn rope(&self, l: usize) -> RopeConfig {
        layer_rope(
            self.compress_ratios[l],
            self.rope_base,
            self.compress_rope_base,
            self.yarn,
            self.n_rot,
        )
    }
}

/// Derives each layer's role. A compressed layer reads the latest kv source at
/// or below it and the latest index source at or below it; both must exist and
/// share its ratio, and every kv source must also index (the official model
/// publishes a top-k from every source before any reuse layer reads it).
pub fn layer_roles(
    ratios: &[usize],
    kv_sources: &[usize],
    index_sources: &[usize],
) -> Result<Vec<LayerRole>, ModelError> {
    let mut roles = Vec::with_capacity(ratios.len());
    for &s in kv_sources.iter().chain(index_sources) {
        if ratios[s] == 0 {
            return Err(bad(
                "kv_source_layer_ids",
                "source layers with a compression ratio > 0",
                format!("layer {s} has ratio 0"),
            ));
        }
    }
    if let Some(&s) = kv_sources.iter().find(|s| !index_sources.contains(s)) {
        return Err(bad(
            "index_source_layer_ids",
            "every kv-source layer among the index sources",
            format!("kv source {s} missing"),
        ));
    }
    for (l, &ratio) in ratios.iter().enumerate() {
        if ratio == 0 {
            roles.push(LayerRole::Window);
            continue;
        }
        let kv = kv_sources.iter().rev().find(|&&s| s <= l).copied();
        let ix = index_sources.iter().rev().find(|&&s| s <= l).copied();
        let (Some(kv), Some(ix)) = (kv, ix) else {
            return Err(bad(
                "kv_source_layer_ids",
                format!("a kv source and an index source at or below compressed layer {l}"),
                format!("kv {kv_sources:?}, index {index_sources:?}"),
            ));
        };
        if ratios[kv] != ratio || ratios[ix] != ratio {
            return Err(bad(
                "compress_ratios",
                format!("layer {l} to share its ratio {ratio} with its sources {kv} and {ix}"),
                format!("{}, {}", ratios[kv], ratios[ix]),
            ));
        }
        roles.push(if kv == l {
            LayerRole::Source { ratio }
        } else if ix == l {
            LayerRole::Reindex {
                ratio,
                kv_source: kv,
            }
        } else {
            LayerRole::Reuse {
                ratio,
                kv_source: kv,
                index_source: ix,
            }
        });
    }
    Ok(roles)
}

fn read_engram(f: &GgufFile, n_layer: usize, n_vocab: usize) -> Result<EngramConfig, ModelError> {
    let enc = "engram.encoding";
    match f.get_str(&key(enc)) {
        Some("e4m3_e8m0_32_row264") => {}
        None if f.get(&key(enc)).is_none() => return Err(ModelError::MissingKey { key: key(enc) }),
        _ => {
            return Err(bad(
                enc,
                "\"e4m3_e8m0_32_row264\" (ds4's row layout)",
                found(f.get(&key(enc))),
            ))
        }
    }
    let text = embedded_config(f)?;
    let max_ngram = json_uint(&text, "engram_max_ngram_size")?;
    let n_heads = json_uint(&text, "engram_n_heads")?;
    let head_dim = json_uint(&text, "engram_head_dim")?;
    if !(2..=16).contains(&max_ngram) || head_dim % 32 != 0 {
        return Err(bad(
            "config",
            "engram_max_ngram_size in 2..=16 and engram_head_dim a multiple of 32",
            format!("{max_ngram}, {head_dim}"),
        ));
    }
    let layer_ids = layer_list(f, "engram.layer_ids", n_layer)?;
    let n = layer_ids.len();
    let rows = req_uints(f, "engram.rows")?;
    if rows.len() != n || rows.iter().any(|&r| r == 0 || r > u32::MAX as u64) {
        return Err(bad(
            "engram.rows",
            format!("{n} positive row counts below 2^32, one per Engram layer"),
            format!("{rows:?}"),
        ));
    }
    let compressed_vocab = req_pos(f, "engram.compressed_vocab_size")?;
    let pad_id = req_uint(f, "engram.pad_id")?;
    if pad_id >= compressed_vocab {
        return Err(bad(
            "engram.pad_id",
            format!("a compressed id below {compressed_vocab}"),
            pad_id.to_string(),
        ));
    }
    let token_map = req_uints(f, "engram.token_map")?;
    if token_map.len() != n_vocab {
        return Err(bad(
            "engram.token_map",
            format!("{n_vocab} entries (one per vocabulary id)"),
            format!("{} entries", token_map.len()),
        ));
    }
    if let Some(i) = token_map.iter().position(|&c| c >= compressed_vocab as u64) {
        return Err(bad(
            "engram.token_map",
            format!("compressed ids below {compressed_vocab}"),
            format!("entry {i} = {}", token_map[i]),
        ));
    }
    let cols = (max_ngram - 1) * n_heads;
    let primes = req_uints(f, "engram.primes")?;
    if primes.len() != n * cols {
        return Err(bad(
            "engram.primes",
            format!(
                "{} primes ({n} layers × {} orders × {n_heads} heads)",
                n * cols,
                max_ngram - 1
            ),
            format!("{} entries", primes.len()),
        ));
    }
    for (s, r) in rows.iter().enumerate() {
        let p = &primes[s * cols..(s + 1) * cols];
        if p.iter().any(|&x| x < 2) || p.iter().sum::<u64>() != *r {
            return Err(bad(
                "engram.primes",
                format!(
                    "primes ≥ 2 whose sum is layer {}'s {r} table rows",
                    layer_ids[s]
                ),
                format!("sum {}", p.iter().sum::<u64>()),
            ));
        }
    }
    let multipliers = req_uints(f, "engram.multipliers")?;
    if multipliers.len() != n * max_ngram {
        return Err(bad(
            "engram.multipliers",
            format!("{} multipliers ({n} layers × {max_ngram})", n * max_ngram),
            format!("{} entries", multipliers.len()),
        ));
    }
    // The hash multiplies a compressed id by each multiplier in 64 bits; the
    // reference's bound keeps that product below 2^63.
    let limit = i64::MAX as u64 / compressed_vocab as u64;
    if let Some(m) = multipliers.iter().find(|&&m| m % 2 == 0 || m > limit) {
        return Err(bad(
            "engram.multipliers",
            format!("odd multipliers ≤ {limit}"),
            m.to_string(),
        ));
    }
    Ok(EngramConfig {
        layer_ids,
        rows,
        max_ngram,
        n_heads,
        head_dim,
        compressed_vocab: compressed_vocab as u32,
        pad_id: pad_id as u32,
        token_map: token_map.into_iter().map(|x| x as u32).collect(),
        primes,
        multipliers,
    })
}
