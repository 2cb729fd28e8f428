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

use std::ops::Deref;

use crate::gguf::GgufFile;
use crate::model::config::{found, ClampKey, CoreConfig, CoreKeys, Meta};
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

/// A V4.1 model's hyper-parameters: the core V4 reads too, plus the layer
/// roles, the candidate blocks and the Engram layout.
#[derive(Clone, Debug, PartialEq)]
pub struct V41Config {
    pub core: CoreConfig,
    pub kv_source_layers: Vec<usize>,
    pub index_source_layers: Vec<usize>,
    pub roles: Vec<LayerRole>,
    /// Layer whose indexer picks the candidate blocks (research §2.3 step 8).
    pub candidate_source: Option<usize>,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub engram: EngramConfig,
}

/// The family configs extend the core: its fields read as their own.
impl Deref for V41Config {
    type Target = CoreConfig;
    fn deref(&self) -> &CoreConfig {
        &self.core
    }
}

/// V4.1's keys for the shared hyper-parameters: the HF field names.
const V41_KEYS: CoreKeys = CoreKeys {
    arch: ARCH,
    n_layer: "num_hidden_layers",
    n_embd: "hidden_size",
    n_vocab: "vocab_size",
    n_head: "num_attention_heads",
    n_head_kv: "num_key_value_heads",
    head_dim: "head_dim",
    value_dim: None,
    n_rot: "qk_rope_head_dim",
    indexer_head_dim: "index_head_dim",
    q_lora_rank: "q_lora_rank",
    o_lora_rank: "o_lora_rank",
    o_groups: "o_groups",
    sliding_window: "sliding_window",
    compress_ratios: "compress_ratios",
    min_ratio: 1,
    indexer_heads: "index_n_heads",
    indexer_top_k: "index_topk",
    hc_count: "hc_mult",
    hc_sinkhorn_iters: "hc_sinkhorn_iters",
    hc_eps: "hc_eps",
    rms_eps: "rms_norm_eps",
    rope_base: "rope_theta",
    compress_rope_base: "compress_rope_theta",
    yarn: [
        "rope_scaling.factor",
        "rope_scaling.original_max_position_embeddings",
        "rope_scaling.beta_fast",
        "rope_scaling.beta_slow",
    ],
    n_expert: "n_routed_experts",
    n_expert_used: "num_experts_per_tok",
    expert_ff: "moe_intermediate_size",
    n_expert_shared: "n_shared_experts",
    expert_weights_scale: "routed_scaling_factor",
    expert_weights_norm: "norm_topk_prob",
    swiglu_clamp: ClampKey::One("swiglu_limit"),
    context_length: "max_position_embeddings",
};

/// An array of unsigned integers, widened.
fn req_uints(m: &Meta, k: &str) -> Result<Vec<u64>, ModelError> {
    let v = m.ints(k)?;
    if v.iter().any(|&x| x < 0) {
        return Err(m.bad(k, "non-negative integers", format!("{v:?}")));
    }
    Ok(v.into_iter().map(|x| x as u64).collect())
}

/// Strictly ascending layer ids below `n_layer`.
fn layer_list(m: &Meta, k: &str, n_layer: usize) -> Result<Vec<usize>, ModelError> {
    let v = req_uints(m, k)?;
    if v.windows(2).any(|w| w[0] >= w[1]) || v.iter().any(|&l| l >= n_layer as u64) {
        return Err(m.bad(
            k,
            format!("ascending layer ids below {n_layer}"),
            format!("{v:?}"),
        ));
    }
    Ok(v.into_iter().map(|x| x as usize).collect())
}

/// The HF text config embedded as JSON (`deepseek41.config`), `text_config`
/// when nested.
fn embedded_config(m: &Meta) -> Result<serde_json::Value, ModelError> {
    let k = "config";
    let s =
        m.f.get_str(&m.key(k))
            .ok_or_else(|| match m.f.get(&m.key(k)) {
                None => ModelError::MissingKey { key: m.key(k) },
                Some(v) => m.bad(k, "the HF config as a JSON string", found(Some(v))),
            })?;
    let v: serde_json::Value =
        serde_json::from_str(s).map_err(|e| m.bad(k, "valid JSON", e.to_string()))?;
    Ok(match v.get("text_config") {
        Some(t) if t.is_object() => t.clone(),
        _ => v,
    })
}

fn json_uint(m: &Meta, cfg: &serde_json::Value, field: &str) -> Result<usize, ModelError> {
    match cfg.get(field) {
        None => Err(ModelError::MissingKey {
            key: format!("{} (text_config.{field})", m.key("config")),
        }),
        Some(v) => v
            .as_u64()
            .filter(|&x| (1..=1 << 20).contains(&x))
            .map(|x| x as usize)
            .ok_or_else(|| {
                m.bad(
                    "config",
                    format!("text_config.{field} a positive integer"),
                    v.to_string(),
                )
            }),
    }
}

impl V41Config {
    /// Reads and checks every hyper-parameter of a `deepseek41` file: the
    /// core through V4.1's keys, then what only V4.1 has.
    pub fn from_gguf(f: &GgufFile) -> Result<V41Config, ModelError> {
        match f.get_str("general.architecture") {
            Some(ARCH) => {}
            other => {
                return Err(ModelError::WrongKind(format!(
                    "general.architecture is {other:?}, expected {ARCH:?}"
                )))
            }
        }
        let core = CoreConfig::read(f, &V41_KEYS)?;
        let m = Meta { f, arch: ARCH };
        let n_layer = core.n_layer;
        for k in [V41_KEYS.indexer_heads, V41_KEYS.indexer_top_k] {
            m.pos(k)?;
        }
        if core.n_expert_shared != 1 {
            return Err(m.bad(
                V41_KEYS.n_expert_shared,
                "1 (the official MoE asserts it)",
                core.n_expert_shared.to_string(),
            ));
        }
        for (k, want) in [
            ("scoring_func", "sqrtsoftplus"),
            ("topk_method", "noaux_tc"),
        ] {
            match f.get_str(&m.key(k)) {
                Some(v) if v == want => {}
                None if !m.has(k) => return Err(ModelError::MissingKey { key: m.key(k) }),
                _ => return Err(m.bad(k, want, found(f.get(&m.key(k))))),
            }
        }
        let kv_source_layers = layer_list(&m, "kv_source_layer_ids", n_layer)?;
        let index_source_layers = layer_list(&m, "index_source_layer_ids", n_layer)?;
        let roles = layer_roles(
            &core.compress_ratios,
            &kv_source_layers,
            &index_source_layers,
        )?;
        let cand = m.uint("candidate_source_layer_id")?;
        let candidate_topk_blocks = m.uint("candidate_topk_blocks")?;
        let candidate_block_size = m.uint("candidate_block_size")?;
        // The official config marks "no candidate source" with a negative id;
        // ds4 stores u32, so an id past the last layer means none.
        let candidate_source = (cand < n_layer).then_some(cand);
        if let Some(c) = candidate_source {
            if !index_source_layers.contains(&c) {
                return Err(m.bad(
                    "candidate_source_layer_id",
                    "an index-source layer",
                    c.to_string(),
                ));
            }
            if candidate_topk_blocks == 0 || candidate_block_size == 0 {
                return Err(m.bad(
                    "candidate_topk_blocks",
                    "positive block count and size with a candidate source",
                    format!("{candidate_topk_blocks} blocks of {candidate_block_size}"),
                ));
            }
        }
        let engram = read_engram(&m, n_layer, core.n_vocab)?;
        Ok(V41Config {
            core,
            kv_source_layers,
            index_source_layers,
            roles,
            candidate_source,
            candidate_topk_blocks,
            candidate_block_size,
            engram,
        })
    }

    /// True when index-source layer `l` keeps only the candidate blocks.
    pub fn uses_candidates(&self, l: usize) -> bool {
        self.candidate_source.is_some_and(|c| c < l) && self.roles[l].indexes()
    }
}

fn role_bad(k: &str, expected: impl Into<String>, found: impl Into<String>) -> ModelError {
    ModelError::BadKey {
        key: format!("{ARCH}.{k}"),
        expected: expected.into(),
        found: found.into(),
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
            return Err(role_bad(
                "kv_source_layer_ids",
                "source layers with a compression ratio > 0",
                format!("layer {s} has ratio 0"),
            ));
        }
    }
    if let Some(&s) = kv_sources.iter().find(|s| !index_sources.contains(s)) {
        return Err(role_bad(
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
            return Err(role_bad(
                "kv_source_layer_ids",
                format!("a kv source and an index source at or below compressed layer {l}"),
                format!("kv {kv_sources:?}, index {index_sources:?}"),
            ));
        };
        if ratios[kv] != ratio || ratios[ix] != ratio {
            return Err(role_bad(
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

fn read_engram(m: &Meta, n_layer: usize, n_vocab: usize) -> Result<EngramConfig, ModelError> {
    let enc = "engram.encoding";
    match m.f.get_str(&m.key(enc)) {
        Some("e4m3_e8m0_32_row264") => {}
        None if !m.has(enc) => return Err(ModelError::MissingKey { key: m.key(enc) }),
        _ => {
            return Err(m.bad(
                enc,
                "\"e4m3_e8m0_32_row264\" (ds4's row layout)",
                found(m.f.get(&m.key(enc))),
            ))
        }
    }
    let text = embedded_config(m)?;
    let max_ngram = json_uint(m, &text, "engram_max_ngram_size")?;
    let n_heads = json_uint(m, &text, "engram_n_heads")?;
    let head_dim = json_uint(m, &text, "engram_head_dim")?;
    if !(2..=16).contains(&max_ngram) || head_dim % 32 != 0 {
        return Err(m.bad(
            "config",
            "engram_max_ngram_size in 2..=16 and engram_head_dim a multiple of 32",
            format!("{max_ngram}, {head_dim}"),
        ));
    }
    let layer_ids = layer_list(m, "engram.layer_ids", n_layer)?;
    let n = layer_ids.len();
    let rows = req_uints(m, "engram.rows")?;
    if rows.len() != n || rows.iter().any(|&r| r == 0 || r > u32::MAX as u64) {
        return Err(m.bad(
            "engram.rows",
            format!("{n} positive row counts below 2^32, one per Engram layer"),
            format!("{rows:?}"),
        ));
    }
    let compressed_vocab = m.pos("engram.compressed_vocab_size")?;
    let pad_id = m.uint("engram.pad_id")?;
    if pad_id >= compressed_vocab {
        return Err(m.bad(
            "engram.pad_id",
            format!("a compressed id below {compressed_vocab}"),
            pad_id.to_string(),
        ));
    }
    let token_map = req_uints(m, "engram.token_map")?;
    if token_map.len() != n_vocab {
        return Err(m.bad(
            "engram.token_map",
            format!("{n_vocab} entries (one per vocabulary id)"),
            format!("{} entries", token_map.len()),
        ));
    }
    if let Some(i) = token_map.iter().position(|&c| c >= compressed_vocab as u64) {
        return Err(m.bad(
            "engram.token_map",
            format!("compressed ids below {compressed_vocab}"),
            format!("entry {i} = {}", token_map[i]),
        ));
    }
    let cols = (max_ngram - 1) * n_heads;
    let primes = req_uints(m, "engram.primes")?;
    if primes.len() != n * cols {
        return Err(m.bad(
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
            return Err(m.bad(
                "engram.primes",
                format!(
                    "primes ≥ 2 whose sum is layer {}'s {r} table rows",
                    layer_ids[s]
                ),
                format!("sum {}", p.iter().sum::<u64>()),
            ));
        }
    }
    let multipliers = req_uints(m, "engram.multipliers")?;
    if multipliers.len() != n * max_ngram {
        return Err(m.bad(
            "engram.multipliers",
            format!("{} multipliers ({n} layers × {max_ngram})", n * max_ngram),
            format!("{} entries", multipliers.len()),
        ));
    }
    // The hash multiplies a compressed id by each multiplier in 64 bits; the
    // reference's bound keeps that product below 2^63.
    let limit = i64::MAX as u64 / compressed_vocab as u64;
    if let Some(x) = multipliers.iter().find(|&&x| x % 2 == 0 || x > limit) {
        return Err(m.bad(
            "engram.multipliers",
            format!("odd multipliers ≤ {limit}"),
            x.to_string(),
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
