//! V4.1's metadata: a V4.1 `config.json` (the text fields under
//! `text_config`) and the Engram tables the official code derives at run
//! time, read into the V4.1 loader's [`V41Config`] and the `deepseek41`
//! keys (docs/V41.md), with the same reader and read-back checks as V4's
//! (the parent module).

use std::path::Path;

use serde_json::Value;

use super::{check_model_type, Json, ModelType};
use crate::convert::ConvertError;
use crate::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use crate::model::v41::config::ARCH as V41_ARCH;
use crate::model::v41::engram::bucket_primes;
use crate::model::v41::V41Config;
use crate::model::ModelError;
use crate::testmodel::v41::V41Spec;

/// The two Engram tables the official `inference/engram.py` derives at
/// run time rather than storing them (research note §2.5): the compressed
/// token map (Unicode normalisation of every token, which ds4 does not
/// implement) and the hash multipliers (numpy PCG64 draws), both computed
/// by `tools/checkpoint/engram_tables.py` with the official algorithm into
/// [`EngramTables::FILE`] beside the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramTables {
    /// One compressed id per vocabulary id.
    pub token_map: Vec<u32>,
    /// `max_ngram` per Engram layer, layer-major.
    pub multipliers: Vec<u64>,
}

impl EngramTables {
    /// Its name in the checkpoint folder.
    pub const FILE: &'static str = "engram_tables.json";

    /// Reads `path`, naming it on failure (a missing file says how to make it).
    pub fn read(path: &Path) -> Result<EngramTables, ConvertError> {
        let err = |msg: String| ConvertError::Input {
            file: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(format!(
                "cannot read the Engram tables ({e}); make them with \
                 `tools/checkpoint/engram_tables.py CHECKPOINT_DIR` (docs/TOOLS.md, V4.1)"
            ))
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
        let ints = |key: &str| -> Result<Vec<u64>, ConvertError> {
            v.get(key)
                .and_then(|a| a.as_array())
                .ok_or_else(|| err(format!("no `{key}` array")))?
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        err(format!("`{key}` holds {x}, not a non-negative integer"))
                    })
                })
                .collect()
        };
        let token_map = ints("token_map")?
            .into_iter()
            .map(|x| u32::try_from(x).map_err(|_| err(format!("`token_map` holds {x} ≥ 2^32"))))
            .collect::<Result<_, _>>()?;
        Ok(EngramTables {
            token_map,
            multipliers: ints("multipliers")?,
        })
    }
}

/// A V4.1 checkpoint's configuration: what ds4's V4.1 loader reads from the
/// converted file, the generator's spec of its shapes (the name map and the
/// tensor types follow it) and the `deepseek41` metadata that says it.
#[derive(Clone, Debug)]
pub struct V41Meta {
    /// What [`V41Config::from_gguf`] reads from [`V41Meta::kvs`].
    pub config: V41Config,
    pub spec: V41Spec,
    /// `general.*`, then `deepseek41.*` as ds4's `deepseek41_metadata.py`
    /// writes them (docs/V41.md), tokenizer keys excluded.
    pub kvs: Vec<(String, MetaValue)>,
}

/// The `deepseek41.*` u32 keys, each the `text_config` field of its name.
const V41_U32: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_lora_rank",
    "o_groups",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "max_position_embeddings",
    "sliding_window",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "candidate_topk_blocks",
    "candidate_block_size",
    "hc_mult",
    "hc_sinkhorn_iters",
    "rope_theta",
    "compress_rope_theta",
];

/// The `deepseek41.*` f32 keys.
const V41_F32: &[&str] = &[
    "rms_norm_eps",
    "hc_eps",
    "swiglu_limit",
    "routed_scaling_factor",
];

impl Json<'_> {
    fn uints(&self, key: &str) -> Result<Vec<u32>, ConvertError> {
        let v = self.req(key)?;
        v.as_array()
            .ok_or_else(|| self.err(format!("`{key}` is {v}, not an array")))?
            .iter()
            .enumerate()
            .map(|(i, x)| self.u32_of(&format!("{key}[{i}]"), x))
            .collect()
    }
}

impl V41Meta {
    /// Reads and checks a V4.1 `config.json` (`json`, read from `file`; the
    /// text fields under `text_config`); `name` is `general.name`. The
    /// Engram primes come from the official prime search (checked against
    /// `engram_num_embeddings`), the pad is `token_map[engram_pad_token_id]`;
    /// `tables` (read from the file it names) gives the token map and the
    /// multipliers, and without it (the name map alone, which does not
    /// depend on them) a map of zeros and multipliers of 1 stand in. The
    /// metadata is read back by the V4.1 loader, so any value it would
    /// refuse is refused here, naming `config.json` (or the tables' file)
    /// and the key.
    pub fn from_config(
        json: &Value,
        file: &Path,
        name: &str,
        tables: Option<(&EngramTables, &Path)>,
    ) -> Result<V41Meta, ConvertError> {
        let top = Json { json, file };
        if check_model_type(&top)? != ModelType::V41 {
            return Err(top.err("not a DeepSeek V4.1 config".into()));
        }
        let text = json
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(json);
        let j = Json { json: text, file };
        let n_layer = j.positive("num_hidden_layers")? as usize;
        let n_vocab = j.positive("vocab_size")? as usize;
        let mut kvs: Vec<(String, MetaValue)> = Vec::new();
        let mut add = |k: &str, v: MetaValue| {
            let key = if k.starts_with("general.") {
                k.to_string()
            } else {
                format!("{V41_ARCH}.{k}")
            };
            kvs.push((key, v));
        };
        add("general.architecture", MetaValue::String(V41_ARCH.into()));
        add("general.name", MetaValue::String(name.into()));
        add("config", MetaValue::String(json.to_string()));
        for &k in V41_U32 {
            add(k, MetaValue::U32(j.uint(k)?));
        }
        let kv_heads = match j.get("num_key_value_heads") {
            Some(v) => j.u32_of("num_key_value_heads", v)?,
            None => 1,
        };
        add("num_key_value_heads", MetaValue::U32(kv_heads));
        // The official "no candidate source" is a negative id; ds4 stores
        // u32, so the layer count stands for none.
        let cand = j.req("candidate_source_layer_id")?;
        let cand = match cand.as_i64() {
            Some(x) if x < 0 => n_layer as u32,
            _ => j.u32_of("candidate_source_layer_id", cand)?,
        };
        add("candidate_source_layer_id", MetaValue::U32(cand));
        for &k in V41_F32 {
            add(k, MetaValue::F32(j.float(k)?));
        }
        for (k, default) in [
            ("scoring_func", None),
            ("topk_method", None),
            ("hidden_act", Some("silu")),
        ] {
            let v = match (j.get(k), default) {
                (None, Some(d)) => d,
                _ => j.str(k)?,
            };
            add(k, MetaValue::String(v.into()));
        }
        add("norm_topk_prob", MetaValue::Bool(j.norm_topk_prob()?));
        // One ratio per layer (the release lists the MTP layers' too).
        let ratios = j.uints("compress_ratios")?;
        if ratios.len() < n_layer {
            return Err(j.err(format!(
                "`compress_ratios` has {} entries, `num_hidden_layers` is {n_layer}",
                ratios.len()
            )));
        }
        add(
            "compress_ratios",
            MetaValue::Array(MetaArray::U32(ratios[..n_layer].to_vec())),
        );
        for k in ["kv_source_layer_ids", "index_source_layer_ids"] {
            add(k, MetaValue::Array(MetaArray::U32(j.uints(k)?)));
        }
        if j.get("rope_scaling").is_some_and(|v| !v.is_null()) {
            for k in [
                "factor",
                "beta_fast",
                "beta_slow",
                "original_max_position_embeddings",
            ] {
                let key = format!("rope_scaling.{k}");
                add(&key, MetaValue::F32(j.float(&key)?));
            }
        }

        // Engram: the layout from the prime search, the tables from the file.
        add(
            "engram.encoding",
            MetaValue::String("e4m3_e8m0_32_row264".into()),
        );
        let layers = j.uints("engram_layer_ids")?;
        let max_ngram = j.positive("engram_max_ngram_size")? as usize;
        let heads = j.positive("engram_n_heads")? as usize;
        let start = j.positive("engram_vocab_size")? as u64;
        let primes = bucket_primes(layers.len(), max_ngram, heads, start);
        let cols = (max_ngram.max(1) - 1) * heads;
        let rows: Vec<u64> = primes.chunks(cols.max(1)).map(|c| c.iter().sum()).collect();
        let stated: Vec<u64> = j
            .uints("engram_num_embeddings")?
            .into_iter()
            .map(u64::from)
            .collect();
        if stated != rows {
            return Err(j.err(format!(
                "`engram_num_embeddings` is {stated:?}, but the official prime search from \
                 `engram_vocab_size` {start} gives tables of {rows:?} rows"
            )));
        }
        let compressed = j.positive("engram_compressed_vocab_size")?;
        let pad_token = j.uint("engram_pad_token_id")? as usize;
        let (token_map, multipliers) = match tables {
            Some((t, _)) => (t.token_map.clone(), t.multipliers.clone()),
            None => (vec![0; n_vocab], vec![1; layers.len() * max_ngram]),
        };
        let tables_file = tables.map_or(file, |(_, f)| f);
        let pad = *token_map
            .get(pad_token)
            .ok_or_else(|| ConvertError::Input {
                file: tables_file.display().to_string(),
                msg: format!(
                "`token_map` has {} entries, `engram_pad_token_id` {pad_token} is not among them",
                token_map.len()
            ),
            })?;
        add(
            "engram.layer_ids",
            MetaValue::Array(MetaArray::U32(layers.clone())),
        );
        let narrow = |v: &[u64]| MetaArray::U32(v.iter().map(|&x| x as u32).collect());
        add("engram.rows", MetaValue::Array(narrow(&rows)));
        add("engram.compressed_vocab_size", MetaValue::U32(compressed));
        add("engram.pad_id", MetaValue::U32(pad));
        add(
            "engram.token_map",
            MetaValue::Array(MetaArray::U32(token_map)),
        );
        add("engram.primes", MetaValue::Array(narrow(&primes)));
        add(
            "engram.multipliers",
            MetaValue::Array(MetaArray::U64(multipliers)),
        );

        // The V4.1 loader reads it back from a GGUF holding only the metadata.
        let mut w = GgufWriter::new();
        for (k, v) in &kvs {
            w.add_kv(k, v.clone());
        }
        let bytes = w.to_bytes().map_err(|e| j.err(format!("metadata: {e}")))?;
        let f = GgufFile::from_vec(bytes).map_err(|e| j.err(format!("metadata: {e}")))?;
        let config = V41Config::from_gguf(&f).map_err(|e| v41_refusal(file, tables_file, e))?;
        let spec = V41Spec::from_config(&config, start);
        Ok(V41Meta { config, spec, kvs })
    }

    /// Adds the metadata to `w`, in order.
    pub fn add_to(&self, w: &mut GgufWriter) {
        for (k, v) in &self.kvs {
            w.add_kv(k, v.clone());
        }
    }
}

/// The V4.1 loader's refusal of the metadata in the checkpoint's terms: the
/// keys are `text_config`'s own names, the token map and multipliers are
/// the tables' file's.
fn v41_refusal(config: &Path, tables: &Path, e: ModelError) -> ConvertError {
    let strip = |k: &str| {
        k.strip_prefix(V41_ARCH)
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(k)
            .to_string()
    };
    let (key, msg) = match e {
        ModelError::BadKey {
            key,
            expected,
            found,
        } => (strip(&key), format!("expected {expected}, found {found}")),
        ModelError::MissingKey { key } => (strip(&key), "missing".into()),
        other => (String::new(), other.to_string()),
    };
    let file = match key.as_str() {
        "engram.token_map" | "engram.multipliers" => tables,
        _ => config,
    };
    let msg = if key.is_empty() {
        msg
    } else {
        format!("`{key}`: {msg}")
    };
    ConvertError::Input {
        file: file.display().to_string(),
        msg,
    }
}
