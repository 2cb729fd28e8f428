//! Model hyper-parameters, every one read from GGUF metadata (MODEL.md §1).
//!
//! Nothing here is hard-wired to Flash: tiny test models, V4-Pro-sized files
//! and future V4 updates go through the same code. Values are cross-checked
//! against each other here and against tensor shapes in [`super::weights`].

use crate::gguf::{GgufFile, MetaValue};
use crate::graph::ops::rope::{RopeConfig, Yarn};

use super::ModelError;

const ARCH: &str = "deepseek4";

/// What the attention of a layer looks at besides the raw sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// Sliding window only (ratio 0).
    Window,
    /// Compressed sparse attention: overlapped compressor + lightning indexer.
    Csa { ratio: usize },
    /// Heavily compressed attention: non-overlapped compressor, no indexer.
    Hca { ratio: usize },
}

impl AttentionKind {
    pub fn ratio(self) -> usize {
        match self {
            AttentionKind::Window => 0,
            AttentionKind::Csa { ratio } | AttentionKind::Hca { ratio } => ratio,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    pub sliding_window: usize,
    /// Per-layer compression ratio (0 = window only), `n_layer` entries.
    pub compress_ratios: Vec<usize>,
    pub indexer_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_top_k: usize,
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
    pub n_hash_layers: usize,
    pub expert_weights_scale: f32,
    pub expert_weights_norm: bool,
    /// Per-layer SwiGLU clamp, `n_layer` entries.
    pub swiglu_clamp: Vec<f32>,
    pub context_length: Option<u64>,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

/// What a metadata key holds, for an error message.
pub(crate) fn found(v: Option<&MetaValue>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => format!("{} {}", v.value_type().name(), v.summary()),
    }
}

/// The size under the full key `k` (shared by the V4 and V4.1 readers).
pub(crate) fn meta_uint(f: &GgufFile, k: &str) -> Result<usize, ModelError> {
    let v = f
        .get(k)
        .ok_or_else(|| ModelError::MissingKey { key: k.to_string() })?;
    // Every size is a u32 in the published files. The cap keeps products of
    // two sizes (streams × width, heads × head width) inside 64 bits.
    v.as_u64()
        .filter(|&x| x <= u32::MAX as u64)
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| ModelError::BadKey {
            key: k.to_string(),
            expected: "a non-negative integer below 2^32".into(),
            found: found(Some(v)),
        })
}

/// The finite number under the full key `k`.
pub(crate) fn meta_float(f: &GgufFile, k: &str) -> Result<f32, ModelError> {
    let v = f
        .get(k)
        .ok_or_else(|| ModelError::MissingKey { key: k.to_string() })?;
    v.as_f64()
        .filter(|x| x.is_finite())
        .map(|x| x as f32)
        .ok_or_else(|| ModelError::BadKey {
            key: k.to_string(),
            expected: "a finite number".into(),
            found: found(Some(v)),
        })
}

/// The RoPE of a layer with compression `ratio`: compressed layers use the
/// compress base with YaRN, window layers the plain base without it.
pub(crate) fn layer_rope(
    ratio: usize,
    rope_base: f32,
    compress_rope_base: f32,
    yarn: Option<Yarn>,
    n_rot: usize,
) -> RopeConfig {
    if ratio == 0 {
        RopeConfig {
            base: rope_base,
            yarn: None,
            n_rot,
        }
    } else {
        RopeConfig {
            base: compress_rope_base,
            yarn,
            n_rot,
        }
    }
}

fn req_uint(f: &GgufFile, k: &str) -> Result<usize, ModelError> {
    meta_uint(f, &key(k))
}

fn opt_uint(f: &GgufFile, k: &str) -> Result<Option<usize>, ModelError> {
    if f.get(&key(k)).is_none() {
        return Ok(None);
    }
    req_uint(f, k).map(Some)
}

fn req_float(f: &GgufFile, k: &str) -> Result<f32, ModelError> {
    meta_float(f, &key(k))
}

fn opt_float(f: &GgufFile, k: &str) -> Result<Option<f32>, ModelError> {
    if f.get(&key(k)).is_none() {
        return Ok(None);
    }
    req_float(f, k).map(Some)
}

fn positive(k: &str, v: usize) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(ModelError::BadKey {
            key: key(k),
            expected: "a positive value".into(),
            found: "0".into(),
        });
    }
    Ok(v)
}

fn bad(k: &str, expected: impl Into<String>, found: impl Into<String>) -> ModelError {
    ModelError::BadKey {
        key: key(k),
        expected: expected.into(),
        found: found.into(),
    }
}

impl ModelConfig {
    /// Reads and checks every hyper-parameter of a `deepseek4` file.
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, ModelError> {
        // The MTP file carries no metadata ds4 reads (its architecture may
        // well say deepseek4): recognise it by its tensors first.
        if f.tensor_info("mtp.0.attn_norm.weight").is_some()
            && f.tensor_info("blk.0.attn_norm.weight").is_none()
        {
            return Err(ModelError::WrongKind(
                "this is an MTP draft file (the optional speculative-decoding model), not a main model".into(),
            ));
        }
        if let Some(arch) = f.get_str("general.architecture") {
            if arch == "deepseek41" {
                return Err(ModelError::WrongKind(
                    "this is a DeepSeek V4.1 Flash file (general.architecture deepseek41); this path opens V4 files only (ds4, ds4-server, ds4-bench and --info run V4.1; docs/V41.md)".into(),
                ));
            }
            if arch != ARCH {
                return Err(ModelError::WrongKind(format!(
                    "general.architecture is {arch:?}, expected {ARCH:?}"
                )));
            }
        }
        let n_layer = positive("block_count", req_uint(f, "block_count")?)?;
        let n_embd = positive("embedding_length", req_uint(f, "embedding_length")?)?;
        let n_vocab = positive("vocab_size", req_uint(f, "vocab_size")?)?;
        let n_head = positive("attention.head_count", req_uint(f, "attention.head_count")?)?;
        let n_head_kv = req_uint(f, "attention.head_count_kv")?;
        if n_head_kv != 1 {
            return Err(bad(
                "attention.head_count_kv",
                "1 (one shared K=V head)",
                n_head_kv.to_string(),
            ));
        }
        let head_dim = positive("attention.key_length", req_uint(f, "attention.key_length")?)?;
        let v_len = req_uint(f, "attention.value_length")?;
        if v_len != head_dim {
            return Err(bad(
                "attention.value_length",
                format!("equal to key_length {head_dim} (K and V are one row)"),
                v_len.to_string(),
            ));
        }
        let n_rot = positive("rope.dimension_count", req_uint(f, "rope.dimension_count")?)?;
        let indexer_head_dim = positive(
            "attention.indexer.key_length",
            req_uint(f, "attention.indexer.key_length")?,
        )?;
        if n_rot % 2 != 0 || n_rot > head_dim || n_rot > indexer_head_dim {
            return Err(bad(
                "rope.dimension_count",
                format!("even and at most key_length {head_dim} and indexer key_length {indexer_head_dim}"),
                n_rot.to_string(),
            ));
        }
        let q_lora_rank = positive(
            "attention.q_lora_rank",
            req_uint(f, "attention.q_lora_rank")?,
        )?;
        let o_lora_rank = positive(
            "attention.output_lora_rank",
            req_uint(f, "attention.output_lora_rank")?,
        )?;
        let o_groups = positive(
            "attention.output_group_count",
            req_uint(f, "attention.output_group_count")?,
        )?;
        if n_head % o_groups != 0 {
            return Err(bad(
                "attention.output_group_count",
                format!("a divisor of head_count {n_head}"),
                o_groups.to_string(),
            ));
        }
        let sliding_window = positive(
            "attention.sliding_window",
            req_uint(f, "attention.sliding_window")?,
        )?;

        let compress_ratios = read_ratios(f, n_layer)?;
        let indexer_heads = req_uint(f, "attention.indexer.head_count")?;
        let indexer_top_k = req_uint(f, "attention.indexer.top_k")?;
        if indexer_head_dim & (indexer_head_dim - 1) != 0 || indexer_head_dim % 32 != 0 {
            // The indexer's Hadamard transform needs a power of two, its FP4
            // simulation whole blocks of 32.
            return Err(bad(
                "attention.indexer.key_length",
                "a power of two, multiple of 32",
                indexer_head_dim.to_string(),
            ));
        }

        let hc_count = positive(
            "hyper_connection.count",
            req_uint(f, "hyper_connection.count")?,
        )?;
        let hc_sinkhorn_iters = positive(
            "hyper_connection.sinkhorn_iterations",
            req_uint(f, "hyper_connection.sinkhorn_iterations")?,
        )?;
        let hc_eps = req_float(f, "hyper_connection.epsilon")?;
        let rms_eps = req_float(f, "attention.layer_norm_rms_epsilon")?;
        // Both are finite here (req_float).
        if rms_eps <= 0.0 || hc_eps < 0.0 {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                "positive epsilons",
                format!("{rms_eps}, {hc_eps}"),
            ));
        }

        let rope_base = req_float(f, "rope.freq_base")?;
        let compress_rope_base = req_float(f, "attention.compress_rope_freq_base")?;
        if rope_base <= 1.0 || compress_rope_base <= 1.0 {
            return Err(bad(
                "rope.freq_base",
                "RoPE bases > 1",
                format!("{rope_base}, {compress_rope_base}"),
            ));
        }
        let yarn = match opt_float(f, "rope.scaling.factor")? {
            Some(factor) if factor > 1.0 => Some(Yarn {
                factor,
                original_context: req_uint(f, "rope.scaling.original_context_length")? as u64,
                beta_fast: req_float(f, "rope.scaling.yarn_beta_fast")?,
                beta_slow: req_float(f, "rope.scaling.yarn_beta_slow")?,
            }),
            Some(factor) if factor < 1.0 => {
                return Err(bad("rope.scaling.factor", "≥ 1", factor.to_string()));
            }
            _ => None,
        };
        if let Some(y) = yarn {
            if y.original_context == 0 || y.beta_fast <= 0.0 || y.beta_slow <= 0.0 {
                return Err(bad(
                    "rope.scaling",
                    "positive YaRN parameters",
                    format!("{y:?}"),
                ));
            }
        }

        let n_expert = positive("expert_count", req_uint(f, "expert_count")?)?;
        let n_expert_used = positive("expert_used_count", req_uint(f, "expert_used_count")?)?;
        if n_expert_used > n_expert {
            return Err(bad(
                "expert_used_count",
                format!("≤ expert_count {n_expert}"),
                n_expert_used.to_string(),
            ));
        }
        let expert_ff = positive(
            "expert_feed_forward_length",
            req_uint(f, "expert_feed_forward_length")?,
        )?;
        let n_expert_shared = req_uint(f, "expert_shared_count")?;
        if n_expert_shared > 1 {
            return Err(bad(
                "expert_shared_count",
                "0 or 1",
                n_expert_shared.to_string(),
            ));
        }
        let n_hash_layers = req_uint(f, "hash_layer_count")?;
        if n_hash_layers > n_layer {
            return Err(bad(
                "hash_layer_count",
                format!("≤ block_count {n_layer}"),
                n_hash_layers.to_string(),
            ));
        }
        for k in ["expert_group_count", "expert_group_used_count"] {
            if let Some(v) = opt_uint(f, k)? {
                if v > 1 {
                    return Err(bad(
                        k,
                        "absent or 0 (no group-limited routing)",
                        v.to_string(),
                    ));
                }
            }
        }
        let expert_weights_scale = req_float(f, "expert_weights_scale")?;
        let expert_weights_norm = match f.get(&key("expert_weights_norm")) {
            Some(MetaValue::Bool(b)) => *b,
            None => {
                return Err(ModelError::MissingKey {
                    key: key("expert_weights_norm"),
                })
            }
            Some(v) => return Err(bad("expert_weights_norm", "bool", found(Some(v)))),
        };
        let swiglu_clamp = read_clamps(f, n_layer)?;
        let context_length = f.get_uint(&key("context_length"));

        Ok(ModelConfig {
            name: f.get_str("general.name").unwrap_or("").to_string(),
            n_layer,
            n_embd,
            n_vocab,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            q_lora_rank,
            o_lora_rank,
            o_groups,
            sliding_window,
            compress_ratios,
            indexer_heads,
            indexer_head_dim,
            indexer_top_k,
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
            n_hash_layers,
            expert_weights_scale,
            expert_weights_norm,
            swiglu_clamp,
            context_length,
        })
    }

    /// Query width H·HD.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Hyper-connection mixer width (2 + NHC)·NHC.
    pub fn hc_mix_dim(&self) -> usize {
        (2 + self.hc_count) * self.hc_count
    }

    /// Heads per output group.
    pub fn heads_per_group(&self) -> usize {
        self.n_head / self.o_groups
    }

    /// The RoPE variant used by layer `l` (and its compressors and indexer).
    pub fn rope(&self, l: usize) -> RopeConfig {
        layer_rope(
            self.compress_ratios[l],
            self.rope_base,
            self.compress_rope_base,
            self.yarn,
            self.n_rot,
        )
    }

    pub fn is_hash_layer(&self, l: usize) -> bool {
        l < self.n_hash_layers
    }
}

fn read_ratios(f: &GgufFile, n_layer: usize) -> Result<Vec<usize>, ModelError> {
    let k = "attention.compress_ratios";
    let a = f.get_array(&key(k)).ok_or_else(|| match f.get(&key(k)) {
        None => ModelError::MissingKey { key: key(k) },
        Some(v) => bad(k, "array of integers", found(Some(v))),
    })?;
    let v = a
        .as_i64_vec()
        .ok_or_else(|| bad(k, "array of integers", a.summary()))?;
    // The HF config carries one more slot for the MTP layer; only the first
    // n_layer entries describe the main model.
    if v.len() < n_layer {
        return Err(bad(
            k,
            format!("at least {n_layer} entries"),
            format!("{}", v.len()),
        ));
    }
    v[..n_layer]
        .iter()
        .map(|&r| {
            if r == 0 || (2..=1 << 20).contains(&r) {
                Ok(r as usize)
            } else {
                Err(bad(k, "0 or a ratio ≥ 2 per layer", a.summary()))
            }
        })
        .collect()
}

fn read_clamps(f: &GgufFile, n_layer: usize) -> Result<Vec<f32>, ModelError> {
    let k = "swiglu_clamp_exp";
    let a = f.get_array(&key(k)).ok_or_else(|| match f.get(&key(k)) {
        None => ModelError::MissingKey { key: key(k) },
        Some(v) => bad(k, "array of floats", found(Some(v))),
    })?;
    let v = a
        .as_f64_vec()
        .ok_or_else(|| bad(k, "array of floats", a.summary()))?;
    if v.len() < n_layer {
        return Err(bad(
            k,
            format!("at least {n_layer} entries"),
            format!("{}", v.len()),
        ));
    }
    if v[..n_layer].iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(bad(k, "finite non-negative clamps", a.summary()));
    }
    Ok(v[..n_layer].iter().map(|&x| x as f32).collect())
}
