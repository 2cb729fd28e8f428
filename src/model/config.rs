//! Model hyper-parameters, every one read from GGUF metadata (MODEL.md §1).
//!
//! Both families name the same hyper-parameters, under different keys: V4
//! files use llama.cpp-style keys (`deepseek4.block_count`), V4.1 files the
//! HF field names (`deepseek41.num_hidden_layers`). [`CoreConfig`] holds what
//! both read, and [`CoreConfig::read`] reads it through a family's
//! [`CoreKeys`] table, with the same checks for both. [`ModelConfig`] is V4's:
//! the core plus hash routing and per-layer SwiGLU clamps; V4.1's
//! (`v41::V41Config`) extends the same core.
//!
//! Nothing here is hard-wired to Flash: tiny test models, V4-Pro-sized files
//! and future V4 updates go through the same code. Values are cross-checked
//! against each other here and against tensor shapes in [`super::weights`].

use std::ops::Deref;

use crate::gguf::{GgufFile, MetaArray, MetaValue};
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

/// The hyper-parameters every family reads.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    pub name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_head: usize,
    /// Always 1: one shared K=V head (checked).
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
    /// The routed experts' weight scale (V4.1: `routed_scaling_factor`).
    pub expert_weights_scale: f32,
    /// Whether the top-k weights are renormalised (V4.1: `norm_topk_prob`).
    pub expert_weights_norm: bool,
    /// Per-layer SwiGLU clamp, `n_layer` entries (V4.1 has one
    /// `swiglu_limit` for every layer).
    pub swiglu_clamp: Vec<f32>,
    pub context_length: Option<u64>,
}

/// How a family stores its SwiGLU clamp.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClampKey {
    /// An array with one clamp per layer (and possibly one more, for MTP).
    PerLayer(&'static str),
    /// One clamp for every layer.
    One(&'static str),
}

/// Where a family keeps each shared hyper-parameter: key suffixes under
/// `<arch>.`. Optional entries are keys one family does not have.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreKeys {
    pub arch: &'static str,
    pub n_layer: &'static str,
    pub n_embd: &'static str,
    pub n_vocab: &'static str,
    pub n_head: &'static str,
    pub n_head_kv: &'static str,
    pub head_dim: &'static str,
    /// V4 stores K and V widths apart; they must agree.
    pub value_dim: Option<&'static str>,
    pub n_rot: &'static str,
    pub indexer_head_dim: &'static str,
    pub q_lora_rank: &'static str,
    pub o_lora_rank: &'static str,
    pub o_groups: &'static str,
    pub sliding_window: &'static str,
    pub compress_ratios: &'static str,
    /// The smallest ratio a compressed layer may have (V4.1 has ratio 1).
    pub min_ratio: usize,
    pub indexer_heads: &'static str,
    pub indexer_top_k: &'static str,
    pub hc_count: &'static str,
    pub hc_sinkhorn_iters: &'static str,
    pub hc_eps: &'static str,
    pub rms_eps: &'static str,
    pub rope_base: &'static str,
    pub compress_rope_base: &'static str,
    /// YaRN: factor, original context, beta fast, beta slow.
    pub yarn: [&'static str; 4],
    pub n_expert: &'static str,
    pub n_expert_used: &'static str,
    pub expert_ff: &'static str,
    pub n_expert_shared: &'static str,
    pub expert_weights_scale: &'static str,
    pub expert_weights_norm: &'static str,
    pub swiglu_clamp: ClampKey,
    pub context_length: &'static str,
}

/// V4's keys (GGUF.md §2).
const V4_KEYS: CoreKeys = CoreKeys {
    arch: ARCH,
    n_layer: "block_count",
    n_embd: "embedding_length",
    n_vocab: "vocab_size",
    n_head: "attention.head_count",
    n_head_kv: "attention.head_count_kv",
    head_dim: "attention.key_length",
    value_dim: Some("attention.value_length"),
    n_rot: "rope.dimension_count",
    indexer_head_dim: "attention.indexer.key_length",
    q_lora_rank: "attention.q_lora_rank",
    o_lora_rank: "attention.output_lora_rank",
    o_groups: "attention.output_group_count",
    sliding_window: "attention.sliding_window",
    compress_ratios: "attention.compress_ratios",
    min_ratio: 2,
    indexer_heads: "attention.indexer.head_count",
    indexer_top_k: "attention.indexer.top_k",
    hc_count: "hyper_connection.count",
    hc_sinkhorn_iters: "hyper_connection.sinkhorn_iterations",
    hc_eps: "hyper_connection.epsilon",
    rms_eps: "attention.layer_norm_rms_epsilon",
    rope_base: "rope.freq_base",
    compress_rope_base: "attention.compress_rope_freq_base",
    yarn: [
        "rope.scaling.factor",
        "rope.scaling.original_context_length",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.yarn_beta_slow",
    ],
    n_expert: "expert_count",
    n_expert_used: "expert_used_count",
    expert_ff: "expert_feed_forward_length",
    n_expert_shared: "expert_shared_count",
    expert_weights_scale: "expert_weights_scale",
    expert_weights_norm: "expert_weights_norm",
    swiglu_clamp: ClampKey::PerLayer("swiglu_clamp_exp"),
    context_length: "context_length",
};

/// What a metadata key holds, for an error message.
pub(crate) fn found(v: Option<&MetaValue>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => format!("{} {}", v.value_type().name(), v.summary()),
    }
}

/// One family's metadata, read by key suffix (`<arch>.<suffix>`): the one
/// reader both families use, so every key gets the same checks and errors.
pub(crate) struct Meta<'f> {
    pub f: &'f GgufFile,
    pub arch: &'static str,
}

impl<'f> Meta<'f> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn bad(
        &self,
        k: &str,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> ModelError {
        ModelError::BadKey {
            key: self.key(k),
            expected: expected.into(),
            found: found.into(),
        }
    }

    fn value(&self, k: &str) -> Result<&'f MetaValue, ModelError> {
        self.f
            .get(&self.key(k))
            .ok_or_else(|| ModelError::MissingKey { key: self.key(k) })
    }

    pub fn has(&self, k: &str) -> bool {
        self.f.get(&self.key(k)).is_some()
    }

    /// A size. Every size is a u32 in the published files; the cap keeps
    /// products of two sizes (streams × width, heads × head width) inside
    /// 64 bits.
    pub fn uint(&self, k: &str) -> Result<usize, ModelError> {
        let v = self.value(k)?;
        v.as_u64()
            .filter(|&x| x <= u32::MAX as u64)
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| self.bad(k, "a non-negative integer below 2^32", found(Some(v))))
    }

    /// A size that must not be 0.
    pub fn pos(&self, k: &str) -> Result<usize, ModelError> {
        match self.uint(k)? {
            0 => Err(self.bad(k, "a positive value", "0")),
            v => Ok(v),
        }
    }

    pub fn opt_uint(&self, k: &str) -> Result<Option<usize>, ModelError> {
        if !self.has(k) {
            return Ok(None);
        }
        self.uint(k).map(Some)
    }

    /// A finite number (integers accepted).
    pub fn float(&self, k: &str) -> Result<f32, ModelError> {
        let v = self.value(k)?;
        v.as_f64()
            .filter(|x| x.is_finite())
            .map(|x| x as f32)
            .ok_or_else(|| self.bad(k, "a finite number", found(Some(v))))
    }

    pub fn opt_float(&self, k: &str) -> Result<Option<f32>, ModelError> {
        if !self.has(k) {
            return Ok(None);
        }
        self.float(k).map(Some)
    }

    /// A whole count stored as an integer or as a float (V4.1 writes the
    /// HF config's numbers as f32).
    pub fn count(&self, k: &str) -> Result<u64, ModelError> {
        let v = self.value(k)?;
        v.as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|x| x.is_finite() && *x >= 0.0 && x.fract() == 0.0)
                    .map(|x| x as u64)
            })
            .ok_or_else(|| self.bad(k, "a non-negative whole number", found(Some(v))))
    }

    pub fn bool(&self, k: &str) -> Result<bool, ModelError> {
        match self.value(k)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(self.bad(k, "bool", found(Some(v)))),
        }
    }

    pub fn array(&self, k: &str, what: &str) -> Result<&'f MetaArray, ModelError> {
        self.f
            .get_array(&self.key(k))
            .ok_or_else(|| match self.f.get(&self.key(k)) {
                None => ModelError::MissingKey { key: self.key(k) },
                Some(v) => self.bad(k, what, found(Some(v))),
            })
    }

    /// An array of integers.
    pub fn ints(&self, k: &str) -> Result<Vec<i64>, ModelError> {
        let a = self.array(k, "an array of integers")?;
        a.as_i64_vec()
            .ok_or_else(|| self.bad(k, "an array of integers", a.summary()))
    }
}

impl CoreConfig {
    /// This configuration with `k` window-only layers after the model's
    /// (indices `n_layer ..`), each clamped like the last layer: the layers
    /// of a drafter's block (MTP's one, DSpark's stages).
    pub fn with_draft_layers(&self, k: usize) -> CoreConfig {
        let mut c = self.clone();
        let n = self.n_layer;
        let clamp = self
            .swiglu_clamp
            .get(n.saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        c.compress_ratios.truncate(n);
        c.swiglu_clamp.truncate(n);
        c.compress_ratios.extend(std::iter::repeat_n(0, k));
        c.swiglu_clamp.extend(std::iter::repeat_n(clamp, k));
        c.n_layer = n + k;
        c
    }

    /// Reads and checks the shared hyper-parameters through `keys`.
    pub(crate) fn read(f: &GgufFile, keys: &CoreKeys) -> Result<CoreConfig, ModelError> {
        let m = Meta { f, arch: keys.arch };
        let n_layer = m.pos(keys.n_layer)?;
        let n_embd = m.pos(keys.n_embd)?;
        let n_vocab = m.pos(keys.n_vocab)?;
        let n_head = m.pos(keys.n_head)?;
        let n_head_kv = m.uint(keys.n_head_kv)?;
        if n_head_kv != 1 {
            return Err(m.bad(
                keys.n_head_kv,
                "1 (one shared K=V head)",
                n_head_kv.to_string(),
            ));
        }
        let head_dim = m.pos(keys.head_dim)?;
        if let Some(k) = keys.value_dim {
            let v_len = m.uint(k)?;
            if v_len != head_dim {
                return Err(m.bad(
                    k,
                    format!(
                        "equal to {} {head_dim} (K and V are one row)",
                        keys.head_dim
                    ),
                    v_len.to_string(),
                ));
            }
        }
        let n_rot = m.pos(keys.n_rot)?;
        let indexer_head_dim = m.pos(keys.indexer_head_dim)?;
        if n_rot % 2 != 0 || n_rot > head_dim || n_rot > indexer_head_dim {
            return Err(m.bad(
                keys.n_rot,
                format!(
                    "even and at most {} {head_dim} and {} {indexer_head_dim}",
                    keys.head_dim, keys.indexer_head_dim
                ),
                n_rot.to_string(),
            ));
        }
        let q_lora_rank = m.pos(keys.q_lora_rank)?;
        let o_lora_rank = m.pos(keys.o_lora_rank)?;
        let o_groups = m.pos(keys.o_groups)?;
        if n_head % o_groups != 0 {
            return Err(m.bad(
                keys.o_groups,
                format!("a divisor of {} {n_head}", keys.n_head),
                o_groups.to_string(),
            ));
        }
        let sliding_window = m.pos(keys.sliding_window)?;
        let compress_ratios = read_ratios(&m, keys, n_layer)?;
        let indexer_heads = m.uint(keys.indexer_heads)?;
        let indexer_top_k = m.uint(keys.indexer_top_k)?;

        let hc_count = m.pos(keys.hc_count)?;
        let hc_sinkhorn_iters = m.pos(keys.hc_sinkhorn_iters)?;
        let hc_eps = m.float(keys.hc_eps)?;
        let rms_eps = m.float(keys.rms_eps)?;
        // Both are finite here.
        if rms_eps <= 0.0 || hc_eps < 0.0 {
            return Err(m.bad(
                keys.rms_eps,
                "positive epsilons",
                format!("{rms_eps}, {hc_eps}"),
            ));
        }
        let rope_base = m.float(keys.rope_base)?;
        let compress_rope_base = m.float(keys.compress_rope_base)?;
        if rope_base <= 1.0 || compress_rope_base <= 1.0 {
            return Err(m.bad(
                keys.rope_base,
                "RoPE bases > 1",
                format!("{rope_base}, {compress_rope_base}"),
            ));
        }
        let yarn = read_yarn(&m, keys)?;

        let n_expert = m.pos(keys.n_expert)?;
        let n_expert_used = m.pos(keys.n_expert_used)?;
        if n_expert_used > n_expert {
            return Err(m.bad(
                keys.n_expert_used,
                format!("≤ {} {n_expert}", keys.n_expert),
                n_expert_used.to_string(),
            ));
        }
        let expert_ff = m.pos(keys.expert_ff)?;
        let n_expert_shared = m.uint(keys.n_expert_shared)?;
        if n_expert_shared > 1 {
            return Err(m.bad(keys.n_expert_shared, "0 or 1", n_expert_shared.to_string()));
        }
        let expert_weights_scale = m.float(keys.expert_weights_scale)?;
        let expert_weights_norm = m.bool(keys.expert_weights_norm)?;
        let swiglu_clamp = read_clamps(&m, keys.swiglu_clamp, n_layer)?;
        let context_length = f.get_uint(&m.key(keys.context_length));

        Ok(CoreConfig {
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

    /// The RoPE variant used by layer `l` (and its compressors and indexer):
    /// compressed layers use the compress base with YaRN, window layers the
    /// plain base without it.
    pub fn rope(&self, l: usize) -> RopeConfig {
        if self.compress_ratios[l] == 0 {
            RopeConfig {
                base: self.rope_base,
                yarn: None,
                n_rot: self.n_rot,
            }
        } else {
            RopeConfig {
                base: self.compress_rope_base,
                yarn: self.yarn,
                n_rot: self.n_rot,
            }
        }
    }
}

fn read_yarn(m: &Meta, keys: &CoreKeys) -> Result<Option<Yarn>, ModelError> {
    let [factor_k, original_k, fast_k, slow_k] = keys.yarn;
    let yarn = match m.opt_float(factor_k)? {
        Some(factor) if factor > 1.0 => Yarn {
            factor,
            original_context: m.count(original_k)?,
            beta_fast: m.float(fast_k)?,
            beta_slow: m.float(slow_k)?,
        },
        Some(factor) if factor < 1.0 => {
            return Err(m.bad(factor_k, "≥ 1", factor.to_string()));
        }
        _ => return Ok(None),
    };
    if yarn.original_context == 0 || yarn.beta_fast <= 0.0 || yarn.beta_slow <= 0.0 {
        let group = factor_k.trim_end_matches(".factor");
        return Err(m.bad(group, "positive YaRN parameters", format!("{yarn:?}")));
    }
    Ok(Some(yarn))
}

fn read_ratios(m: &Meta, keys: &CoreKeys, n_layer: usize) -> Result<Vec<usize>, ModelError> {
    let k = keys.compress_ratios;
    let a = m.array(k, "array of integers")?;
    let v = a
        .as_i64_vec()
        .ok_or_else(|| m.bad(k, "array of integers", a.summary()))?;
    // The HF config carries one more slot for the MTP layer; only the first
    // n_layer entries describe the main model.
    if v.len() < n_layer {
        return Err(m.bad(
            k,
            format!("at least {n_layer} entries"),
            format!("{}", v.len()),
        ));
    }
    v[..n_layer]
        .iter()
        .map(|&r| {
            if r == 0 || (keys.min_ratio as i64..=1 << 20).contains(&r) {
                Ok(r as usize)
            } else {
                Err(m.bad(
                    k,
                    format!("0 or a ratio ≥ {} per layer", keys.min_ratio),
                    a.summary(),
                ))
            }
        })
        .collect()
}

fn read_clamps(m: &Meta, key: ClampKey, n_layer: usize) -> Result<Vec<f32>, ModelError> {
    let k = match key {
        ClampKey::One(k) => {
            let v = m.float(k)?;
            if v < 0.0 {
                return Err(m.bad(k, "≥ 0", v.to_string()));
            }
            return Ok(vec![v; n_layer]);
        }
        ClampKey::PerLayer(k) => k,
    };
    let a = m.array(k, "array of floats")?;
    let v = a
        .as_f64_vec()
        .ok_or_else(|| m.bad(k, "array of floats", a.summary()))?;
    if v.len() < n_layer {
        return Err(m.bad(
            k,
            format!("at least {n_layer} entries"),
            format!("{}", v.len()),
        ));
    }
    if v[..n_layer].iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(m.bad(k, "finite non-negative clamps", a.summary()));
    }
    Ok(v[..n_layer].iter().map(|&x| x as f32).collect())
}

/// A V4 model's hyper-parameters: the core, plus hash routing.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub core: CoreConfig,
    /// The first `n_hash_layers` layers route by token id (`tid2eid`).
    pub n_hash_layers: usize,
}

/// The family configs extend the core: its fields read as their own.
impl Deref for ModelConfig {
    type Target = CoreConfig;
    fn deref(&self) -> &CoreConfig {
        &self.core
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
        let core = CoreConfig::read(f, &V4_KEYS)?;
        let m = Meta { f, arch: ARCH };
        let ihd = core.indexer_head_dim;
        if ihd & (ihd - 1) != 0 || ihd % 32 != 0 {
            // The indexer's Hadamard transform needs a power of two, its FP4
            // simulation whole blocks of 32.
            return Err(m.bad(
                V4_KEYS.indexer_head_dim,
                "a power of two, multiple of 32",
                ihd.to_string(),
            ));
        }
        let n_hash_layers = m.uint("hash_layer_count")?;
        if n_hash_layers > core.n_layer {
            return Err(m.bad(
                "hash_layer_count",
                format!("≤ block_count {}", core.n_layer),
                n_hash_layers.to_string(),
            ));
        }
        for k in ["expert_group_count", "expert_group_used_count"] {
            if let Some(v) = m.opt_uint(k)? {
                if v > 1 {
                    return Err(m.bad(k, "absent or 0 (no group-limited routing)", v.to_string()));
                }
            }
        }
        Ok(ModelConfig {
            core,
            n_hash_layers,
        })
    }

    pub fn is_hash_layer(&self, l: usize) -> bool {
        l < self.n_hash_layers
    }
}
