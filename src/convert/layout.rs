//! What a conversion writes: the output's metadata and tensor directory in
//! ds4's layout, each tensor with the checkpoint tensor(s) it comes from.
//!
//! The tensor names, shapes, order and storage classes are the test-model
//! generator's (`testmodel`), which writes exactly ds4's published layout;
//! the shapes come from the checkpoint's `config.json`. The HF name of each
//! tensor is GGUF.md §9's middle column: the HF shape is the GGUF `ne`
//! reversed, routed experts are one HF tensor per expert stacked into one
//! 3-D GGUF tensor, and the hash table narrows I64 to I32.

use std::path::Path;

use serde_json::Value;

use super::ConvertError;
use crate::gguf::{GgufWriter, MetaValue};
use crate::testmodel::{self, Class, TestModelSpec, Vocab};

/// The model families the converter knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// DeepSeek V4 Flash (and its 0731 refresh): `deepseek4`.
    V4,
    /// DeepSeek V4.1 Flash: `deepseek41`.
    V41,
}

/// Where an output tensor's values come from.
#[derive(Clone, Debug)]
pub enum HfRef {
    /// One checkpoint tensor of HF shape `ne` reversed.
    One(String),
    /// One HF tensor per expert (`{}` is the expert index), stacked.
    Experts(String, usize),
}

/// One tensor of the output, in file order.
#[derive(Clone, Debug)]
pub struct OutTensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub(crate) class: Class,
    pub src: HfRef,
}

/// The output plan: metadata already in a writer, and the tensors.
pub struct Plan {
    pub family: Family,
    pub writer: GgufWriter,
    pub tensors: Vec<OutTensor>,
}

/// `config.json`, with the error context of its path.
pub struct HfConfig {
    pub path: String,
    pub json: Value,
}

impl HfConfig {
    pub fn read(dir: &Path) -> Result<HfConfig, ConvertError> {
        let p = dir.join("config.json");
        let path = p.display().to_string();
        let bytes = std::fs::read(&p).map_err(|e| ConvertError::Checkpoint {
            file: path.clone(),
            msg: format!("cannot read: {e}"),
        })?;
        let json = serde_json::from_slice(&bytes).map_err(|e| ConvertError::Checkpoint {
            file: path.clone(),
            msg: format!("not JSON: {e}"),
        })?;
        Ok(HfConfig { path, json })
    }

    /// The text model's fields (V4.1 nests them under `text_config`).
    fn text(&self) -> &Value {
        self.json.get("text_config").unwrap_or(&self.json)
    }

    fn err(&self, msg: String) -> ConvertError {
        ConvertError::Checkpoint {
            file: self.path.clone(),
            msg,
        }
    }

    fn value(&self, keys: &[&str]) -> Option<&Value> {
        let t = self.text();
        keys.iter().find_map(|k| match k.split_once('.') {
            Some((a, b)) => t.get(a).and_then(|v| v.get(b)),
            None => t.get(*k),
        })
    }

    /// A non-negative integer under the first of `keys` present.
    pub fn uint(&self, keys: &[&str]) -> Result<usize, ConvertError> {
        let v = self
            .value(keys)
            .ok_or_else(|| self.err(format!("no {}", keys.join(" / "))))?;
        v.as_u64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
            .map(|x| x as usize)
            .ok_or_else(|| self.err(format!("{}: {v} is not a non-negative integer", keys[0])))
    }

    pub fn uint_or(&self, keys: &[&str], default: usize) -> Result<usize, ConvertError> {
        if self.value(keys).is_some() {
            self.uint(keys)
        } else {
            Ok(default)
        }
    }

    pub fn float(&self, keys: &[&str]) -> Result<f64, ConvertError> {
        let v = self
            .value(keys)
            .ok_or_else(|| self.err(format!("no {}", keys.join(" / "))))?;
        v.as_f64()
            .ok_or_else(|| self.err(format!("{}: {v} is not a number", keys[0])))
    }

    pub fn float_or(&self, keys: &[&str], default: f64) -> Result<f64, ConvertError> {
        if self.value(keys).is_some() {
            self.float(keys)
        } else {
            Ok(default)
        }
    }

    pub fn uints(&self, keys: &[&str]) -> Result<Vec<usize>, ConvertError> {
        let v = self
            .value(keys)
            .ok_or_else(|| self.err(format!("no {}", keys.join(" / "))))?;
        v.as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect())
            .ok_or_else(|| self.err(format!("{}: not an array of integers", keys[0])))
    }

    fn str_or(&self, keys: &[&str], default: &str) -> String {
        self.value(keys)
            .and_then(|v| v.as_str())
            .unwrap_or(default)
            .to_string()
    }

    /// Which family the checkpoint is.
    pub fn family(&self) -> Result<Family, ConvertError> {
        let mt = self
            .json
            .get("model_type")
            .or_else(|| self.text().get("model_type"))
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let arch = self.json.get("architectures").map(|a| a.to_string()).unwrap_or_default();
        if mt == "deepseek_v41" || arch.contains("DeepseekV41") {
            Ok(Family::V41)
        } else if mt == "deepseek_v4" || arch.contains("DeepseekV4") {
            Ok(Family::V4)
        } else {
            Err(self.err(format!(
                "model_type {mt:?} / architectures {arch}: not DeepSeek V4 or V4.1"
            )))
        }
    }

    /// The V4 shapes and constants.
    pub fn v4_spec(&self, name: &str) -> Result<TestModelSpec, ConvertError> {
        let n_layer = self.uint(&["num_hidden_layers", "n_layers"])?;
        let ratios = self.uints(&["compress_ratios"])?;
        if ratios.len() < n_layer {
            return Err(self.err(format!(
                "compress_ratios has {} entries for {n_layer} layers",
                ratios.len()
            )));
        }
        let score = self.str_or(&["scoring_func", "score_func"], "sqrtsoftplus");
        if score != "sqrtsoftplus" {
            return Err(self.err(format!("scoring_func {score:?}: ds4 runs sqrtsoftplus only")));
        }
        let shared = self.uint_or(&["n_shared_experts"], 1)?;
        if shared > 1 {
            return Err(self.err(format!("{shared} shared experts: ds4 runs one")));
        }
        let spec = TestModelSpec {
            name: name.to_string(),
            n_embd: self.uint(&["hidden_size", "dim"])?,
            n_head: self.uint(&["num_attention_heads", "n_heads"])?,
            head_dim: self.uint(&["head_dim"])?,
            n_rot: self.uint(&["qk_rope_head_dim", "rope_head_dim"])?,
            q_lora_rank: self.uint(&["q_lora_rank"])?,
            o_lora_rank: self.uint(&["o_lora_rank"])?,
            o_groups: self.uint(&["o_groups"])?,
            sliding_window: self.uint(&["sliding_window", "window_size"])?,
            compress_ratios: ratios[..n_layer].to_vec(),
            // V4's rule (official model.py): ratio-4 layers carry the
            // overlapped compressor and the indexer.
            csa_ratio: 4,
            indexer_heads: self.uint(&["index_n_heads"])?,
            indexer_head_dim: self.uint(&["index_head_dim"])?,
            indexer_top_k: self.uint(&["index_topk"])?,
            n_expert: self.uint(&["n_routed_experts"])?,
            n_expert_used: self.uint(&["num_experts_per_tok", "n_activated_experts"])?,
            expert_ff: self.uint(&["moe_intermediate_size", "moe_inter_dim"])?,
            n_expert_shared: shared,
            n_hash_layers: self.uint_or(&["num_hash_layers", "n_hash_layers"], 0)?,
            hc_count: self.uint(&["hc_mult"])?,
            hc_sinkhorn_iters: self.uint_or(&["hc_sinkhorn_iters"], 20)?,
            rope_base: self.float(&["rope_theta"])? as f32,
            compress_rope_base: self.float(&["compress_rope_theta"])? as f32,
            yarn_factor: self.float(&["rope_scaling.factor", "rope_factor"])? as f32,
            yarn_original_context: self.uint(&[
                "rope_scaling.original_max_position_embeddings",
                "original_seq_len",
            ])? as u32,
            swiglu_clamp: self.float(&["swiglu_limit"])? as f32,
            expert_weights_scale: self.float(&["routed_scaling_factor", "route_scale"])? as f32,
            context_length: self.uint_or(&["max_position_embeddings", "max_seq_len"], 1 << 20)?
                as u32,
            init_gain: 1.0,
            random_blocks: false,
            seed: 0,
        };
        if spec.n_hash_layers > n_layer {
            return Err(self.err(format!(
                "num_hash_layers {} exceeds the {n_layer} layers",
                spec.n_hash_layers
            )));
        }
        Ok(spec)
    }
}

/// The HF name of a V4 / V4.1 GGUF tensor (GGUF.md §9).
pub fn hf_ref(gguf: &str, n_expert: usize) -> Option<HfRef> {
    let one = |s: String| Some(HfRef::One(s));
    let top = match gguf {
        "token_embd.weight" => Some("embed.weight"),
        "output.weight" => Some("head.weight"),
        "output_norm.weight" => Some("norm.weight"),
        "output_hc_fn.weight" => Some("hc_head_fn"),
        "output_hc_base.weight" => Some("hc_head_base"),
        "output_hc_scale.weight" => Some("hc_head_scale"),
        _ => None,
    };
    if let Some(t) = top {
        return one(t.into());
    }
    let (prefix, rest) = if let Some(r) = gguf.strip_prefix("blk.") {
        let (l, rest) = r.split_once('.')?;
        (format!("layers.{l}."), rest)
    } else if let Some(r) = gguf.strip_prefix("mtp.") {
        let (l, rest) = r.split_once('.')?;
        (format!("mtp.{l}."), rest)
    } else {
        return None;
    };
    let stem = rest.strip_suffix(".weight").or_else(|| rest.strip_suffix(".bias"))?;
    let experts = |w: &str| {
        Some(HfRef::Experts(
            format!("{prefix}ffn.experts.{{}}.{w}.weight"),
            n_expert,
        ))
    };
    let sub = match stem {
        "hc_attn_fn" | "hc_attn_base" | "hc_attn_scale" | "hc_ffn_fn" | "hc_ffn_base"
        | "hc_ffn_scale" | "hc_head_fn" | "hc_head_base" | "hc_head_scale" => stem.to_string(),
        "attn_norm" | "ffn_norm" | "enorm" | "hnorm" | "norm" | "e_proj" | "h_proj" => {
            format!("{stem}.weight")
        }
        "attn_sinks" => "attn.attn_sink".into(),
        "attn_q_a" => "attn.wq_a.weight".into(),
        "attn_q_a_norm" => "attn.q_norm.weight".into(),
        "attn_q_b" => "attn.wq_b.weight".into(),
        "attn_kv" => "attn.wkv.weight".into(),
        "attn_kv_a_norm" => "attn.kv_norm.weight".into(),
        "attn_output_a" => "attn.wo_a.weight".into(),
        "attn_output_b" => "attn.wo_b.weight".into(),
        "attn_compressor_ape" => "attn.compressor.ape".into(),
        "attn_compressor_kv" => "attn.compressor.wkv.weight".into(),
        "attn_compressor_gate" => "attn.compressor.wgate.weight".into(),
        "attn_compressor_norm" => "attn.compressor.norm.weight".into(),
        "indexer.attn_q_b" => "attn.indexer.wq_b.weight".into(),
        "indexer.proj" => "attn.indexer.weights_proj.weight".into(),
        "indexer.attn_k" => "attn.indexer.wk.weight".into(),
        "indexer.k_norm" => "attn.indexer.k_norm.weight".into(),
        "indexer_compressor_ape" => "attn.indexer.compressor.ape".into(),
        "indexer_compressor_kv" => "attn.indexer.compressor.wkv.weight".into(),
        "indexer_compressor_gate" => "attn.indexer.compressor.wgate.weight".into(),
        "indexer_compressor_norm" => "attn.indexer.compressor.norm.weight".into(),
        "ffn_gate_inp" => "ffn.gate.weight".into(),
        "exp_probs_b" => "ffn.gate.bias".into(),
        "exp_probs_b_vl" => "ffn.gate.bias_vl".into(),
        "ffn_gate_tid2eid" => "ffn.gate.tid2eid".into(),
        "ffn_gate_shexp" => "ffn.shared_experts.w1.weight".into(),
        "ffn_up_shexp" => "ffn.shared_experts.w3.weight".into(),
        "ffn_down_shexp" => "ffn.shared_experts.w2.weight".into(),
        "ffn_gate_exps" => return experts("w1"),
        "ffn_up_exps" => return experts("w3"),
        "ffn_down_exps" => return experts("w2"),
        "engram_q_norm" => "engram.q_weight".into(),
        "engram_k_norm" => "engram.k_weight".into(),
        "engram_kv" => "engram.wkv.weight".into(),
        "engram_embd" => "engram.embed.weight".into(),
        _ => return None,
    };
    one(format!("{prefix}{sub}"))
}

/// Replaces the values of existing keys (the generator's constants) with the
/// checkpoint's, keeping the key order.
fn edit_kvs(w: GgufWriter, edits: &[(String, MetaValue)]) -> GgufWriter {
    let mut out = GgufWriter::new();
    for (k, v) in w.kvs() {
        match edits.iter().find(|(e, _)| e == k) {
            Some((_, nv)) => out.add_kv(k, nv.clone()),
            None => out.add_kv(k, v.clone()),
        }
    }
    out
}

/// The V4 plan: the generator's layout for the checkpoint's shapes, its
/// metadata with the checkpoint's own constants.
pub fn plan_v4(cfg: &HfConfig, vocab: &Vocab, name: &str) -> Result<Plan, ConvertError> {
    let spec = cfg.v4_spec(name)?;
    let n_vocab = cfg.uint(&["vocab_size"])?;
    if n_vocab != vocab.tokens.len() {
        return Err(cfg.err(format!(
            "vocab_size {n_vocab} but tokenizer.json has {} tokens",
            vocab.tokens.len()
        )));
    }
    let mut w = GgufWriter::new();
    testmodel::add_metadata(&mut w, &spec, vocab);
    let k = |x: &str| format!("deepseek4.{x}");
    let f = |v: f64| MetaValue::F32(v as f32);
    let edits = vec![
        (
            k("attention.layer_norm_rms_epsilon"),
            f(cfg.float_or(&["rms_norm_eps", "norm_eps"], 1e-6)?),
        ),
        (k("hyper_connection.epsilon"), f(cfg.float_or(&["hc_eps"], 1e-6)?)),
        (
            k("rope.scaling.yarn_beta_fast"),
            f(cfg.float_or(&["rope_scaling.beta_fast", "beta_fast"], 32.0)?),
        ),
        (
            k("rope.scaling.yarn_beta_slow"),
            f(cfg.float_or(&["rope_scaling.beta_slow", "beta_slow"], 1.0)?),
        ),
        (
            k("nextn_predict_layers"),
            MetaValue::U32(cfg.uint_or(&["num_nextn_predict_layers", "n_mtp_layers"], 1)? as u32),
        ),
    ];
    let mut w = edit_kvs(w, &edits);
    let plan = testmodel::plan_main(&spec, n_vocab);
    let tensors = plan
        .into_iter()
        .map(|p| {
            let src = hf_ref(&p.name, spec.n_expert).ok_or_else(|| {
                ConvertError::Internal(format!("no HF name for {}", p.name))
            })?;
            Ok(OutTensor {
                name: p.name,
                ne: p.ne,
                class: p.class,
                src,
            })
        })
        .collect::<Result<Vec<_>, ConvertError>>()?;
    let _ = &mut w;
    Ok(Plan {
        family: Family::V4,
        writer: w,
        tensors,
    })
}
