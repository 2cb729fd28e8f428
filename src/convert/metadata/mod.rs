//! A checkpoint's `config.json` read into ds4's own configuration, and the
//! metadata of the converted file: V4 ([`V4Config`]: [`ModelConfig`], the
//! `deepseek4` keys; docs/TOOLS.md, "The metadata"; GGUF.md §3, MODEL.md
//! §1) and V4.1 ([`V41Meta`]: the V4.1 loader's [`V41Config`], the
//! `deepseek41` keys with the Engram layout; docs/V41.md).
//!
//! There is one reader and one set of checks: `config.json` is translated
//! key by key into the GGUF metadata ds4's published files carry, and that
//! metadata is read back by the loader's [`ModelConfig::from_gguf`], so a
//! converted file holds exactly what the loader accepts, and a value the
//! loader would refuse is refused here, before anything is written. Its
//! error is given back in `config.json`'s terms: the file, the official key
//! (`o_groups`, not `deepseek4.attention.output_group_count`) and the keys
//! the expectation mentions.
//!
//! The tokenizer keys (`tokenizer.*`) come from the checkpoint's
//! `tokenizer.json` ([`super::tokenizer`]) and follow these in the file;
//! `general.alignment` and the `quantize.*` keys are the writer's and the
//! recipe's.

use std::path::Path;

use serde_json::Value;

use crate::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use crate::model::{ModelConfig, ModelError};

use super::ConvertError;

mod v41;
pub use v41::{EngramTables, V41Meta};

/// The GGUF architecture of a converted V4 file.
pub const ARCH: &str = "deepseek4";

/// `deepseek4.expert_gating_func` for sqrt(softplus) scores (llama.cpp's
/// numbering; the only gating ds4 implements).
pub const GATING_SQRT_SOFTPLUS: u32 = 4;

/// Which `config.json` key each `deepseek4.*` key comes from (errors are
/// given in these names). `rope.scaling` is the loader's name for the YaRN
/// group.
const SOURCES: &[(&str, &str)] = &[
    ("block_count", "num_hidden_layers"),
    ("context_length", "max_position_embeddings"),
    ("embedding_length", "hidden_size"),
    ("vocab_size", "vocab_size"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.key_length", "head_dim"),
    ("attention.value_length", "head_dim"),
    ("attention.q_lora_rank", "q_lora_rank"),
    ("attention.output_lora_rank", "o_lora_rank"),
    ("attention.output_group_count", "o_groups"),
    ("attention.sliding_window", "sliding_window"),
    ("attention.compress_ratios", "compress_ratios"),
    ("attention.compress_rope_freq_base", "compress_rope_theta"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("attention.indexer.head_count", "index_n_heads"),
    ("attention.indexer.key_length", "index_head_dim"),
    ("attention.indexer.top_k", "index_topk"),
    ("rope.dimension_count", "qk_rope_head_dim"),
    ("rope.freq_base", "rope_theta"),
    ("rope.scaling", "rope_scaling"),
    ("rope.scaling.type", "rope_scaling.type"),
    ("rope.scaling.factor", "rope_scaling.factor"),
    (
        "rope.scaling.original_context_length",
        "rope_scaling.original_max_position_embeddings",
    ),
    ("rope.scaling.yarn_beta_fast", "rope_scaling.beta_fast"),
    ("rope.scaling.yarn_beta_slow", "rope_scaling.beta_slow"),
    ("expert_count", "n_routed_experts"),
    ("expert_used_count", "num_experts_per_tok"),
    ("expert_feed_forward_length", "moe_intermediate_size"),
    ("expert_shared_count", "n_shared_experts"),
    ("expert_weights_scale", "routed_scaling_factor"),
    ("expert_weights_norm", "norm_topk_prob"),
    ("expert_gating_func", "scoring_func"),
    ("hash_layer_count", "num_hash_layers"),
    ("swiglu_clamp_exp", "swiglu_limit"),
    ("nextn_predict_layers", "num_nextn_predict_layers"),
    ("hyper_connection.count", "hc_mult"),
    ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters"),
    ("hyper_connection.epsilon", "hc_eps"),
];

/// The `config.json` key a `deepseek4.*` key (or its suffix) comes from.
fn source_of(gguf_key: &str) -> Option<&'static str> {
    let suffix = gguf_key
        .strip_prefix(ARCH)
        .and_then(|s| s.strip_prefix('.'))
        .unwrap_or(gguf_key);
    SOURCES
        .iter()
        .find(|(g, _)| *g == suffix)
        .map(|(_, json)| *json)
}

/// `text` with every GGUF key it names (whole words) replaced by the
/// `config.json` key, quoted.
fn in_config_terms(text: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(word) {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        let chunk = &tail[..end];
        let w = chunk.trim_end_matches('.');
        if w.is_empty() {
            out.push_str(chunk);
            rest = &tail[end..];
            continue;
        }
        match source_of(w) {
            Some(json) if w.contains(|c: char| c.is_ascii_alphabetic()) => {
                out.push('`');
                out.push_str(json);
                out.push('`');
            }
            _ => out.push_str(w),
        }
        rest = &tail[w.len()..];
    }
    out.push_str(rest);
    out
}

/// A V4 checkpoint's configuration: what ds4's loader will read from the
/// converted file, and the metadata that says it.
#[derive(Clone, Debug)]
pub struct V4Config {
    /// What [`ModelConfig::from_gguf`] reads from [`V4Config::kvs`].
    pub model: ModelConfig,
    /// The metadata, in the order of ds4's published files: `general.*`,
    /// then `deepseek4.*` (GGUF.md §3), tokenizer keys excluded.
    pub kvs: Vec<(String, MetaValue)>,
}

/// Reads `config.json` values, naming the file and the key on failure.
struct Json<'a> {
    json: &'a Value,
    file: &'a Path,
}

impl Json<'_> {
    fn err(&self, msg: String) -> ConvertError {
        ConvertError::Input {
            file: self.file.display().to_string(),
            msg,
        }
    }

    /// `key`, or `group.key` inside an object.
    fn get(&self, key: &str) -> Option<&Value> {
        match key.split_once('.') {
            Some((group, k)) => self.json.get(group)?.get(k),
            None => self.json.get(key),
        }
    }

    fn req(&self, key: &str) -> Result<&Value, ConvertError> {
        self.get(key).ok_or_else(|| self.err(format!("no `{key}`")))
    }

    /// A size: a non-negative integer that fits the GGUF's u32.
    fn u32_of(&self, key: &str, v: &Value) -> Result<u32, ConvertError> {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| {
                self.err(format!(
                    "`{key}` is {v}, not a non-negative integer below 2^32"
                ))
            })
    }

    fn uint(&self, key: &str) -> Result<u32, ConvertError> {
        self.u32_of(key, self.req(key)?)
    }

    /// A size that must not be 0 (checked here for the sizes the loader
    /// lets be 0 but the tensor directory cannot).
    fn positive(&self, key: &str) -> Result<u32, ConvertError> {
        match self.uint(key)? {
            0 => Err(self.err(format!("`{key}` is 0"))),
            x => Ok(x),
        }
    }

    fn float(&self, key: &str) -> Result<f32, ConvertError> {
        let v = self.req(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.err(format!("`{key}` is {v}, not a finite number")))
    }

    /// `norm_topk_prob`, true when absent: the official model.py
    /// renormalises the top-k weights of every non-softmax score.
    fn norm_topk_prob(&self) -> Result<bool, ConvertError> {
        match self.get("norm_topk_prob") {
            None => Ok(true),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(format!("`norm_topk_prob` is {v}, not a boolean"))),
        }
    }

    fn str(&self, key: &str) -> Result<&str, ConvertError> {
        let v = self.req(key)?;
        v.as_str()
            .ok_or_else(|| self.err(format!("`{key}` is {v}, not a string")))
    }
}

/// The model family a checkpoint's `config.json` is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    /// DeepSeek V4 (Flash): `model_type deepseek_v4`, the fields at the top.
    V4,
    /// DeepSeek V4.1 (Flash): `model_type deepseek_v41`, the text fields
    /// nested under `text_config`.
    V41,
}

/// The family of `config.json` (`json`, read from `file`); any other model
/// is refused by name.
pub fn model_type(json: &Value, file: &Path) -> Result<ModelType, ConvertError> {
    check_model_type(&Json { json, file })
}

fn check_model_type(j: &Json) -> Result<ModelType, ConvertError> {
    let json = j.json;
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
        return Ok(ModelType::V41);
    }
    if model_type == Some("deepseek_v4") || archs.contains(&"DeepseekV4ForCausalLM") {
        return Ok(ModelType::V4);
    }
    Err(j.err(format!(
        "not a DeepSeek V4 or V4.1 config: model_type {model_type:?}, architectures {archs:?} \
         (expected deepseek_v4 / DeepseekV4ForCausalLM or deepseek_v41 / DeepseekV41ForCausalLM)"
    )))
}

/// The `deepseek4` metadata of `config.json`, in the published order.
fn metadata(j: &Json, name: &str) -> Result<Vec<(String, MetaValue)>, ConvertError> {
    let mut kvs: Vec<(String, MetaValue)> = Vec::new();
    let mut add = |k: &str, v: MetaValue| {
        let key = if k.starts_with("general.") {
            k.to_string()
        } else {
            format!("{ARCH}.{k}")
        };
        kvs.push((key, v));
    };
    let u = MetaValue::U32;
    let f = MetaValue::F32;

    add("general.architecture", MetaValue::String(ARCH.into()));
    add("general.name", MetaValue::String(name.into()));
    add("block_count", u(j.uint("num_hidden_layers")?));
    add("context_length", u(j.uint("max_position_embeddings")?));
    add("embedding_length", u(j.uint("hidden_size")?));
    add("vocab_size", u(j.uint("vocab_size")?));
    add("attention.head_count", u(j.uint("num_attention_heads")?));
    let kv_heads = match j.get("num_key_value_heads") {
        Some(v) => j.u32_of("num_key_value_heads", v)?,
        None => 1,
    };
    add("attention.head_count_kv", u(kv_heads));
    let head_dim = j.uint("head_dim")?;
    add("attention.key_length", u(head_dim));
    add("attention.value_length", u(head_dim));
    add("attention.q_lora_rank", u(j.uint("q_lora_rank")?));
    add("attention.output_lora_rank", u(j.uint("o_lora_rank")?));
    add("attention.output_group_count", u(j.uint("o_groups")?));
    add("attention.sliding_window", u(j.uint("sliding_window")?));
    // Every entry, the MTP layer's slot included, as the published files
    // carry them; the loader reads the first block_count.
    let ratios = j
        .req("compress_ratios")?
        .as_array()
        .ok_or_else(|| j.err("`compress_ratios` is not an array".into()))?
        .iter()
        .enumerate()
        .map(|(l, r)| {
            r.as_u64()
                .and_then(|x| i32::try_from(x).ok())
                .ok_or_else(|| {
                    j.err(format!(
                        "`compress_ratios[{l}]` is {r}, not a non-negative integer"
                    ))
                })
        })
        .collect::<Result<Vec<i32>, _>>()?;
    let n_slots = ratios.len();
    add(
        "attention.compress_ratios",
        MetaValue::Array(MetaArray::I32(ratios)),
    );
    add(
        "attention.compress_rope_freq_base",
        f(j.float("compress_rope_theta")?),
    );
    add(
        "attention.layer_norm_rms_epsilon",
        f(j.float("rms_norm_eps")?),
    );
    add(
        "attention.indexer.head_count",
        u(j.positive("index_n_heads")?),
    );
    add("attention.indexer.key_length", u(j.uint("index_head_dim")?));
    add("attention.indexer.top_k", u(j.positive("index_topk")?));
    add("rope.dimension_count", u(j.uint("qk_rope_head_dim")?));
    add("rope.freq_base", f(j.float("rope_theta")?));
    if j.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        let ty = match j.get("rope_scaling.type") {
            Some(_) => j.str("rope_scaling.type")?,
            None => j.str("rope_scaling.rope_type")?,
        };
        if ty != "yarn" {
            return Err(j.err(format!("`rope_scaling.type` is {ty:?}: V4 uses \"yarn\"")));
        }
        add("rope.scaling.type", MetaValue::String(ty.into()));
        add("rope.scaling.factor", f(j.float("rope_scaling.factor")?));
        add(
            "rope.scaling.original_context_length",
            u(j.uint("rope_scaling.original_max_position_embeddings")?),
        );
        add(
            "rope.scaling.yarn_beta_fast",
            f(j.float("rope_scaling.beta_fast")?),
        );
        add(
            "rope.scaling.yarn_beta_slow",
            f(j.float("rope_scaling.beta_slow")?),
        );
    }
    add("expert_count", u(j.uint("n_routed_experts")?));
    add("expert_used_count", u(j.uint("num_experts_per_tok")?));
    add(
        "expert_feed_forward_length",
        u(j.uint("moe_intermediate_size")?),
    );
    // The directory has one shared expert per layer (the loader also takes 0).
    let shared = j.uint("n_shared_experts")?;
    if shared != 1 {
        return Err(j.err(format!(
            "`n_shared_experts` is {shared}: V4 has one shared expert"
        )));
    }
    add("expert_shared_count", u(shared));
    add("expert_weights_scale", f(j.float("routed_scaling_factor")?));
    add("expert_weights_norm", MetaValue::Bool(j.norm_topk_prob()?));
    let scoring = j.str("scoring_func")?;
    if scoring != "sqrtsoftplus" {
        return Err(j.err(format!(
            "`scoring_func` is {scoring:?}: ds4 implements V4's \"sqrtsoftplus\" only"
        )));
    }
    add("expert_gating_func", u(GATING_SQRT_SOFTPLUS));
    add("hash_layer_count", u(j.uint("num_hash_layers")?));
    // One clamp per slot of compress_ratios (the MTP layer's included).
    let clamp = j.float("swiglu_limit")?;
    add(
        "swiglu_clamp_exp",
        MetaValue::Array(MetaArray::F32(vec![clamp; n_slots])),
    );
    if j.get("num_nextn_predict_layers").is_some() {
        add(
            "nextn_predict_layers",
            u(j.uint("num_nextn_predict_layers")?),
        );
    }
    add("hyper_connection.count", u(j.uint("hc_mult")?));
    add(
        "hyper_connection.sinkhorn_iterations",
        u(j.uint("hc_sinkhorn_iters")?),
    );
    add("hyper_connection.epsilon", f(j.float("hc_eps")?));
    Ok(kvs)
}

/// The loader's refusal of the metadata, in `config.json`'s terms.
fn loader_refusal(j: &Json, e: ModelError) -> ConvertError {
    match e {
        ModelError::BadKey {
            key,
            expected,
            found,
        } => {
            let k = source_of(&key).map_or(key.clone(), |s| s.to_string());
            j.err(format!(
                "`{k}`: expected {}, found {}",
                in_config_terms(&expected),
                in_config_terms(&found)
            ))
        }
        ModelError::MissingKey { key } => {
            let k = source_of(&key).map_or(key.clone(), |s| s.to_string());
            j.err(format!("no `{k}`"))
        }
        other => j.err(in_config_terms(&other.to_string())),
    }
}

impl V4Config {
    /// Reads and checks `config.json` (`json`, read from `file`, which
    /// errors name); `name` is the file's `general.name` (ds4's published
    /// Flash files say `DeepSeek V4 Flash`). A V4.1 or other config is
    /// refused, and so is any value ds4's loader would refuse.
    pub fn from_config(json: &Value, file: &Path, name: &str) -> Result<V4Config, ConvertError> {
        let j = Json { json, file };
        if check_model_type(&j)? == ModelType::V41 {
            return Err(j.err(
                "a DeepSeek V4.1 config (model_type deepseek_v41 / text_config): \
                 V41Meta reads it, not V4Config"
                    .into(),
            ));
        }
        let kvs = metadata(&j, name)?;
        // The loader reads it back from a GGUF holding only the metadata.
        let mut w = GgufWriter::new();
        for (k, v) in &kvs {
            w.add_kv(k, v.clone());
        }
        let bytes = w.to_bytes().map_err(|e| j.err(format!("metadata: {e}")))?;
        let f = GgufFile::from_vec(bytes).map_err(|e| j.err(format!("metadata: {e}")))?;
        let model = ModelConfig::from_gguf(&f).map_err(|e| loader_refusal(&j, e))?;
        Ok(V4Config { model, kvs })
    }

    /// Adds the metadata to `w`, in order.
    pub fn add_to(&self, w: &mut GgufWriter) {
        for (k, v) in &self.kvs {
            w.add_kv(k, v.clone());
        }
    }
}

/// The official V4 Flash `config.json` (deepseek-ai/DeepSeek-V4-Flash,
/// MODEL.md §1), for the unit tests here and in the layout.
#[cfg(test)]
pub(crate) fn flash_config() -> Value {
    let mut ratios = vec![0, 0];
    for l in 2..43 {
        ratios.push(if l % 2 == 0 { 4 } else { 128 });
    }
    ratios.push(0);
    serde_json::json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
        "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 16,
                         "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "q_lora_rank": 1024, "qk_rope_head_dim": 64, "head_dim": 512,
        "compress_ratios": ratios, "sliding_window": 128, "compress_rope_theta": 160000,
        "o_lora_rank": 1024, "o_groups": 8, "index_n_heads": 64, "index_head_dim": 128,
        "index_topk": 512, "num_hash_layers": 3, "hc_mult": 4, "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path() -> &'static Path {
        Path::new("ck/config.json")
    }

    #[test]
    fn gguf_keys_read_in_config_terms() {
        assert_eq!(
            in_config_terms("a divisor of attention.head_count 64"),
            "a divisor of `num_attention_heads` 64"
        );
        assert_eq!(
            in_config_terms("≤ block_count 43."),
            "≤ `num_hidden_layers` 43."
        );
        assert_eq!(
            in_config_terms(
                "even and at most attention.key_length 80 and attention.indexer.key_length 32"
            ),
            "even and at most `head_dim` 80 and `index_head_dim` 32"
        );
        assert_eq!(in_config_terms("1.5, 2 (x)"), "1.5, 2 (x)");
        assert_eq!(source_of("deepseek4.rope.scaling"), Some("rope_scaling"));
    }

    #[test]
    fn flash_config_reads_as_the_loader_would() {
        let c = V4Config::from_config(&flash_config(), path(), "DeepSeek V4 Flash").unwrap();
        let m = &c.model;
        assert_eq!((m.n_layer, m.n_embd, m.n_vocab), (43, 4096, 129280));
        assert_eq!(m.n_hash_layers, 3);
        assert_eq!(m.compress_ratios.len(), 43);
        assert_eq!(m.swiglu_clamp, vec![10.0; 43]);
        assert_eq!(m.context_length, Some(1 << 20));
        assert!(m.yarn.is_some() && m.expert_weights_norm);
        assert_eq!(m.name, "DeepSeek V4 Flash");
        assert_eq!(c.kvs[0].0, "general.architecture");
    }

    /// An edit of `config.json`, and what its refusal must say.
    type BadCase = (Box<dyn Fn(&mut Value)>, &'static str);

    #[test]
    fn bad_configs_are_refused_with_the_key() {
        let cases: Vec<BadCase> = vec![
            (
                Box::new(|c| drop(c.as_object_mut().unwrap().remove("o_groups"))),
                "no `o_groups`",
            ),
            (
                Box::new(|c| {
                    drop(
                        c["rope_scaling"]
                            .as_object_mut()
                            .unwrap()
                            .remove("beta_slow"),
                    )
                }),
                "no `rope_scaling.beta_slow`",
            ),
            (
                Box::new(|c| c["hidden_size"] = json!("4096")),
                "`hidden_size` is \"4096\"",
            ),
            (
                Box::new(|c| c["num_hidden_layers"] = json!(50)),
                "`compress_ratios`: expected at least 50 entries, found 44",
            ),
            (
                Box::new(|c| c["compress_ratios"][5] = json!(1)),
                "`compress_ratios`: expected 0 or a ratio ≥ 2 per layer",
            ),
            (
                Box::new(|c| c["o_groups"] = json!(7)),
                "`o_groups`: expected a divisor of `num_attention_heads` 64, found 7",
            ),
            (
                Box::new(|c| c["n_shared_experts"] = json!(2)),
                "one shared expert",
            ),
            (
                Box::new(|c| c["num_key_value_heads"] = json!(8)),
                "`num_key_value_heads`: expected 1 (one shared K=V head), found 8",
            ),
            (
                Box::new(|c| c["num_hash_layers"] = json!(44)),
                "`num_hash_layers`: expected ≤ `num_hidden_layers` 43, found 44",
            ),
            (
                Box::new(|c| c["num_experts_per_tok"] = json!(300)),
                "`num_experts_per_tok`: expected ≤ `n_routed_experts` 256, found 300",
            ),
            (
                Box::new(|c| c["qk_rope_head_dim"] = json!(63)),
                "`qk_rope_head_dim`: expected even and at most `head_dim` 512",
            ),
            (
                Box::new(|c| c["index_head_dim"] = json!(96)),
                "`index_head_dim`: expected a power of two, multiple of 32, found 96",
            ),
            (
                Box::new(|c| c["rope_theta"] = json!(1)),
                "`rope_theta`: expected RoPE bases > 1",
            ),
            (
                Box::new(|c| c["rope_scaling"]["factor"] = json!(0.5)),
                "`rope_scaling.factor`: expected ≥ 1, found 0.5",
            ),
            (
                Box::new(|c| c["rope_scaling"]["type"] = json!("linear")),
                "`rope_scaling.type` is \"linear\"",
            ),
            (
                Box::new(|c| c["scoring_func"] = json!("softmax")),
                "`scoring_func` is \"softmax\"",
            ),
            (
                Box::new(|c| c["swiglu_limit"] = json!(-1.0)),
                "`swiglu_limit`: expected finite non-negative clamps",
            ),
            (
                Box::new(|c| c["hc_mult"] = json!(0)),
                "`hc_mult`: expected a positive value, found 0",
            ),
            (
                Box::new(|c| c["index_topk"] = json!(0)),
                "`index_topk` is 0",
            ),
            (
                Box::new(|c| c["vocab_size"] = json!(1u64 << 33)),
                "`vocab_size` is 8589934592, not a non-negative integer below 2^32",
            ),
            (
                Box::new(|c| c["model_type"] = json!("deepseek_v3")),
                "not a DeepSeek V4 or V4.1 config",
            ),
            (Box::new(|c| c["text_config"] = json!({})), "V4.1"),
        ];
        for (edit, want) in cases {
            let mut c = flash_config();
            if want == "not a DeepSeek V4 or V4.1 config" {
                c["architectures"] = json!(["DeepseekV3ForCausalLM"]);
            }
            edit(&mut c);
            let e = V4Config::from_config(&c, path(), "x")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("ck/config.json: "), "{e}");
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn architectures_alone_identify_v4() {
        let mut c = flash_config();
        c.as_object_mut().unwrap().remove("model_type");
        assert!(V4Config::from_config(&c, path(), "").is_ok());
        c.as_object_mut().unwrap().remove("architectures");
        assert!(V4Config::from_config(&c, path(), "").is_err());
    }
}
