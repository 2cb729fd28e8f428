//! DeepSeek's DSpark drafter in an official checkpoint, converted to ds4's
//! `deepseek4-dspark` (V4) or `deepseek41-dspark` (V4.1) file
//! (`ds4-quantize --hf DIR --dspark-only`, docs/TOOLS.md "DSpark"; the
//! file's layout: docs/SPECULATIVE.md).
//!
//! A checkpoint that ships the drafter (V4 Flash 0731,
//! `DeepSeek-V4-Flash-DSpark`; V4.1) keeps it under the MTP prefix, as the
//! official `inference/model.py` builds it (`DSparkBlock`, "stored under the
//! mtp.* checkpoint namespace"): stage k is `mtp.{k}.*` with a layer's
//! sub-names (a window-only block with a router bias; V4.1's with its
//! image-span bias too); stage 0 adds `main_proj` (FP8, `[D, D·taps]`) and
//! `main_norm`; the last stage adds V4's `hc_head_fn`/`_scale`/`_base` (V4.1
//! has none), `norm`, `markov_head.markov_w1`/`_w2`
//! (BF16 `[vocab, rank]`) and `confidence_head.proj` (BF16 `[1, D + rank]`).
//! Its shape comes from `config.json`:
//!
//! | key | `dspark.*` |
//! |---|---|
//! | `dspark_block_size` | `block_size` |
//! | `dspark_noise_token_id` | `noise_token_id` |
//! | `dspark_target_layer_ids` | `target_layer_ids` |
//! | `dspark_markov_rank` (official default 256) | `markov_rank` |
//! | `dspark_n_routed_experts`, `dspark_n_activated_experts` (0 or absent: the model's, `ModelArgs.get_moe_config`) | `expert_count`, `expert_used_count` |
//! | the `compress_ratios` slots after `num_hidden_layers`, each 0 | `stage_count`, `n_layers` |
//!
//! The stage count is not `num_nextn_predict_layers`: Flash 0731's root
//! config says 1 beside three stages; the ratios list one slot per stage
//! (`DSparkAttention` asserts ratio 0). As for the main file, the metadata
//! is read back by the loader's own reader and checks
//! ([`DsparkConfig::read`]), so a drafter ds4 would refuse is refused here,
//! naming `config.json` and the key, before anything is written.

use std::path::Path;

use serde_json::Value;

use super::layout::{Family, Layout};
use super::ConvertError;
use crate::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use crate::model::config::CoreConfig;
use crate::model::dspark::DsparkConfig;
use crate::model::{Arch, ModelError};
use crate::quant::GgmlType;
use crate::testmodel::dspark::{dspark_tensor_types, v41_dspark_tensor_types, DsparkSpec};
use crate::testmodel::{TestModelSpec, Variant};

/// `general.architecture` of the drafter's file (V4).
pub const ARCH: &str = "deepseek4-dspark";

/// `general.architecture` of a V4.1 drafter's file.
pub const V41_ARCH: &str = "deepseek41-dspark";

/// The official Markov rank when `config.json` has none (`ModelArgs`).
pub const DEFAULT_MARKOV_RANK: u64 = 256;

/// Which `config.json` key each `dspark.*` key comes from.
const SOURCES: &[(&str, &str)] = &[
    ("dspark.block_size", "dspark_block_size"),
    ("dspark.noise_token_id", "dspark_noise_token_id"),
    ("dspark.target_layer_ids", "dspark_target_layer_ids"),
    ("dspark.markov_rank", "dspark_markov_rank"),
    ("dspark.expert_count", "dspark_n_routed_experts"),
    ("dspark.expert_used_count", "dspark_n_activated_experts"),
    ("dspark.stage_count", "compress_ratios"),
    ("dspark.n_layers", "compress_ratios"),
];

/// The drafter of a checkpoint: its configuration as the loader reads it
/// and the metadata that says it.
#[derive(Clone, Debug)]
pub struct DsparkMeta {
    pub config: DsparkConfig,
    /// In the order of the test-model generator's drafter file.
    pub kvs: Vec<(String, MetaValue)>,
}

impl DsparkMeta {
    /// Reads and checks the drafter's keys of `config.json` (`json`, read
    /// from `file`; V4.1's `text_config`) for the main model of family
    /// `family` and configuration `model` (what the loader reads from the
    /// converted main file); `name` is the main file's `general.name` (the
    /// drafter's is `NAME DSpark`).
    pub fn from_config(
        json: &Value,
        file: &Path,
        name: &str,
        model: &CoreConfig,
        family: Arch,
    ) -> Result<DsparkMeta, ConvertError> {
        let err = |msg: String| ConvertError::Input {
            file: file.display().to_string(),
            msg,
        };
        let uint = |key: &str| -> Result<Option<u32>, ConvertError> {
            match json.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        err(format!(
                            "`{key}` is {v}, not a non-negative integer below 2^32"
                        ))
                    }),
            }
        };
        let block_size = uint("dspark_block_size")?.ok_or_else(|| {
            err(
                "no `dspark_block_size`: this checkpoint has no DSpark drafter \
                 (DeepSeek-V4-Flash-DSpark's config.json has the dspark_* keys)"
                    .into(),
            )
        })?;
        let noise = uint("dspark_noise_token_id")?
            .ok_or_else(|| err("no `dspark_noise_token_id`".into()))?;
        let key = "dspark_target_layer_ids";
        let targets = json.get(key).ok_or_else(|| err(format!("no `{key}`")))?;
        let targets = targets
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| err(format!("`{key}` is {targets}, not an array of layer ids")))?;
        let rank = uint("dspark_markov_rank")?.unwrap_or(DEFAULT_MARKOV_RANK as u32);
        // 0 or absent: the main model's (official `get_moe_config`).
        let experts = uint("dspark_n_routed_experts")?
            .filter(|&e| e > 0)
            .unwrap_or(model.n_expert as u32);
        let used = uint("dspark_n_activated_experts")?
            .filter(|&e| e > 0)
            .unwrap_or(model.n_expert_used as u32);
        let n_stages = stage_slots(json, model.n_layer).map_err(err)? as u32;

        let u = MetaValue::U32;
        let arch = match family {
            Arch::V4 => ARCH,
            Arch::V41 => V41_ARCH,
        };
        let k = |x: &str| format!("dspark.{x}");
        let kvs = vec![
            (
                "general.architecture".into(),
                MetaValue::String(arch.into()),
            ),
            (
                "general.name".into(),
                MetaValue::String(format!("{name} DSpark")),
            ),
            (k("block_size"), u(block_size)),
            (k("markov_rank"), u(rank)),
            (k("noise_token_id"), u(noise)),
            (
                k("target_layer_ids"),
                MetaValue::Array(MetaArray::U32(targets)),
            ),
            (k("stage_count"), u(n_stages)),
            (k("n_layers"), u(n_stages)),
            (k("expert_count"), u(experts)),
            (k("expert_used_count"), u(used)),
            (k("embedding_length"), u(model.n_embd as u32)),
            (k("vocab_size"), u(model.n_vocab as u32)),
        ];
        // The loader reads it back from a GGUF holding only the metadata.
        let mut w = GgufWriter::new();
        for (k, v) in &kvs {
            w.add_kv(k, v.clone());
        }
        let bytes = w.to_bytes().map_err(|e| err(format!("metadata: {e}")))?;
        let f = GgufFile::from_vec(bytes).map_err(|e| err(format!("metadata: {e}")))?;
        let config = DsparkConfig::read(&f, model, family).map_err(|e| {
            err(match e {
                ModelError::BadKey {
                    key,
                    expected,
                    found,
                } => format!("`{}`: expected {expected}, found {found}", source_of(&key)),
                ModelError::MissingKey { key } => format!("no `{}`", source_of(&key)),
                other => {
                    format!("{other} (`dspark_n_activated_experts` of `dspark_n_routed_experts`)")
                }
            })
        })?;
        Ok(DsparkMeta { config, kvs })
    }

    /// Adds the metadata to `w`, in order.
    pub fn add_to(&self, w: &mut GgufWriter) {
        for (k, v) in &self.kvs {
            w.add_kv(k, v.clone());
        }
    }
}

/// The `config.json` key a `dspark.*` key comes from.
fn source_of(gguf_key: &str) -> &str {
    SOURCES
        .iter()
        .find(|(g, _)| *g == gguf_key)
        .map_or(gguf_key, |(_, j)| j)
}

/// The drafter's stage count: the `compress_ratios` slots after the
/// model's `n_layer` layers, each of which must be 0 (window-only).
fn stage_slots(json: &Value, n_layer: usize) -> Result<usize, String> {
    let ratios = json
        .get("compress_ratios")
        .and_then(|r| r.as_array())
        .ok_or("no `compress_ratios` array")?;
    let slots = ratios.get(n_layer..).unwrap_or_default();
    if slots.is_empty() {
        return Err(format!(
            "`compress_ratios` has {} entries, none after the `num_hidden_layers` {n_layer} \
             layers for the DSpark stages (one slot per stage)",
            ratios.len()
        ));
    }
    if let Some((k, r)) = slots
        .iter()
        .enumerate()
        .find(|(_, r)| r.as_u64() != Some(0))
    {
        return Err(format!(
            "`compress_ratios[{}]` (DSpark stage {k}) is {r}: the stages are window-only (0)",
            n_layer + k
        ));
    }
    Ok(slots.len())
}

/// The test-model generator's plan (names, shapes, types in `variant`) for
/// the drafter whose directory is `layout` ([`Layout::v4_dspark`],
/// [`Layout::v41_dspark`]): its
/// stages, taps, Markov rank and experts read off the directory, so the
/// caller's check of the plan against the directory, name by name and
/// shape by shape, checks both.
pub fn plan(layout: &Layout, variant: Variant) -> Vec<(String, Vec<u64>, GgmlType)> {
    let c = &layout.config;
    let ne = |name: String, i: usize| layout.get(&name).map_or(0, |t| t.ne[i] as usize);
    let n_stages = (0..)
        .take_while(|k| layout.get(&format!("mtp.{k}.attn_norm.weight")).is_some())
        .count();
    let last = n_stages.saturating_sub(1);
    let n_expert = ne("mtp.0.ffn_gate_inp.weight".into(), 1);
    let ds = DsparkSpec {
        family: match layout.family {
            Family::V4 => Arch::V4,
            Family::V41(_) => Arch::V41,
        },
        block_size: 1,
        markov_rank: ne(format!("mtp.{last}.markov_head.markov_w1.weight"), 0),
        noise_token: 0,
        target_layers: (0..ne("mtp.0.main_proj.weight".into(), 0) / c.n_embd.max(1)).collect(),
        n_stages,
        n_expert,
        n_expert_used: c.n_expert_used.min(n_expert),
    };
    match &layout.family {
        Family::V4 => dspark_tensor_types(&TestModelSpec::from_config(c), &ds, variant, c.n_vocab),
        Family::V41(spec) => v41_dspark_tensor_types(spec, &ds, variant, c.n_vocab),
    }
}
