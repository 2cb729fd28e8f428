//! DeepSeek V4.1 weights bound by the names ds4's
//! `gguf-tools/deepseek41_quantize.py` writes, each checked against the
//! configuration (shape and accepted types), the Engram tables included.
//!
//! The Engram tables (`blk.N.engram_embd.weight`, I8 `[264, rows]`: each row
//! 256 E4M3 codes then 8 E8M0 scales) are bound like any tensor, but only as
//! a file extent: nothing here or in the loader reads them, so the ~189 GiB
//! of the real file stay on disk.

use crate::gguf::{GgufFile, TensorRef};
use crate::model::weights::{routed_types_of, type_mix_of, Binder, Class, TypeShare};
use crate::model::ModelError;

use super::config::{LayerRole, V41Config};

/// A kv-source layer's compressor and index-key projection.
#[derive(Clone, Debug)]
pub struct V41Compressor {
    /// `wkv`: `[D] → [hd]`.
    pub kv: TensorRef,
    /// `wgate`: only when the ratio is above 1.
    pub gate: Option<TensorRef>,
    pub norm: TensorRef,
    /// `indexer.wk`: `[hd] → [index_head_dim]`, fed the pre-RoPE latent.
    pub index_k: TensorRef,
    pub index_k_norm: TensorRef,
}

/// An index-source layer's query projection and head weights.
#[derive(Clone, Debug)]
pub struct V41Indexer {
    pub q_b: TensorRef,
    pub proj: TensorRef,
}

#[derive(Clone, Debug)]
pub struct V41Engram {
    /// `q_weight`, `[hc, D]` (only its product with `k_weight` is used).
    pub q_norm: TensorRef,
    pub k_norm: TensorRef,
    /// `wkv`: `[cols·head_dim] → [(hc + 1)·D]`.
    pub kv: TensorRef,
    /// The raw table, `[row_bytes, rows]` I8; read per row, never resident.
    pub table: TensorRef,
}

// A sibling of V4's LayerWeights, not one type: router bias and shared expert are required here.
#[derive(Clone, Debug)]
pub struct V41LayerWeights {
    pub role: LayerRole,
    pub hc_attn_fn: TensorRef,
    pub hc_attn_scale: TensorRef,
    pub hc_attn_base: TensorRef,
    pub attn_norm: TensorRef,
    pub attn_q_a: TensorRef,
    pub attn_q_a_norm: TensorRef,
    pub attn_q_b: TensorRef,
    pub attn_kv: TensorRef,
    pub attn_kv_a_norm: TensorRef,
    pub attn_sinks: TensorRef,
    pub attn_output_a: TensorRef,
    pub attn_output_b: TensorRef,
    pub compressor: Option<V41Compressor>,
    pub indexer: Option<V41Indexer>,
    pub hc_ffn_fn: TensorRef,
    pub hc_ffn_scale: TensorRef,
    pub hc_ffn_base: TensorRef,
    pub ffn_norm: TensorRef,
    pub ffn_gate_inp: TensorRef,
    pub exp_probs_b: TensorRef,
    /// The image-span routing bias; unused for text.
    pub exp_probs_b_vl: Option<TensorRef>,
    pub ffn_gate_exps: TensorRef,
    pub ffn_up_exps: TensorRef,
    pub ffn_down_exps: TensorRef,
    pub ffn_gate_shexp: TensorRef,
    pub ffn_up_shexp: TensorRef,
    pub ffn_down_shexp: TensorRef,
    pub engram: Option<V41Engram>,
}

#[derive(Clone, Debug)]
pub struct V41Weights {
    pub token_embd: TensorRef,
    pub output_norm: TensorRef,
    pub output: TensorRef,
    pub layers: Vec<V41LayerWeights>,
}

impl V41Weights {
    /// Binds and validates every tensor of a V4.1 main model.
    pub fn bind(file: &GgufFile, cfg: &V41Config) -> Result<V41Weights, ModelError> {
        let b = Binder { file };
        let d = cfg.n_embd;
        let w = V41Weights {
            token_embd: b.bind("token_embd.weight", &[d, cfg.n_vocab], Class::Dense)?,
            output_norm: b.bind("output_norm.weight", &[d], Class::Vector)?,
            output: b.bind("output.weight", &[d, cfg.n_vocab], Class::Dense)?,
            layers: (0..cfg.n_layer)
                .map(|l| bind_layer(&b, cfg, l))
                .collect::<Result<_, _>>()?,
        };
        Ok(w)
    }

    /// Every bound tensor, Engram tables included.
    pub fn all(&self) -> Vec<&TensorRef> {
        let mut v = vec![&self.token_embd, &self.output_norm, &self.output];
        for l in &self.layers {
            v.extend(l.all());
        }
        v
    }

    /// Bytes of the Engram tables (on disk, never resident).
    pub fn engram_table_bytes(&self) -> u64 {
        self.layers
            .iter()
            .filter_map(|l| l.engram.as_ref())
            .map(|e| e.table.n_bytes)
            .sum()
    }

    /// Bytes of everything else: what a backend may map or upload.
    pub fn resident_bytes(&self) -> u64 {
        self.all().iter().map(|t| t.n_bytes).sum::<u64>() - self.engram_table_bytes()
    }

    /// The type mix of the bound tensors, Engram tables included (as I8),
    /// largest share first.
    pub fn type_mix(&self) -> Vec<TypeShare> {
        type_mix_of(&self.all())
    }

    /// The distinct (gate, up, down) type triples of the routed experts, with
    /// how many layers use each (as V4's `Weights::routed_expert_types`).
    pub fn routed_expert_types(&self) -> Vec<([crate::quant::GgmlType; 3], usize)> {
        routed_types_of(
            self.layers
                .iter()
                .map(|l| [l.ffn_gate_exps.ty, l.ffn_up_exps.ty, l.ffn_down_exps.ty]),
        )
    }

    /// Weight bytes read to produce one token at decode time: one embedding
    /// row, every dense tensor, the chosen experts' slabs (top-k of n), the
    /// head; never the Engram tables, whose rows are read from the file
    /// (`EngramStats::bytes_read` counts those).
    pub fn active_bytes_per_token(&self, cfg: &V41Config) -> u64 {
        let mut total = self.token_embd.n_bytes / cfg.n_vocab.max(1) as u64
            + self.output_norm.n_bytes
            + self.output.n_bytes;
        for l in &self.layers {
            let routed = [&l.ffn_gate_exps, &l.ffn_up_exps, &l.ffn_down_exps];
            let table = l.engram.as_ref().map(|e| &e.table);
            for t in l.all() {
                if routed.iter().any(|r| std::ptr::eq(*r, t)) {
                    total += t.n_bytes / cfg.n_expert.max(1) as u64 * cfg.n_expert_used as u64;
                } else if !table.is_some_and(|x| std::ptr::eq(x, t)) {
                    total += t.n_bytes;
                }
            }
        }
        total
    }
}

impl V41LayerWeights {
    pub fn all(&self) -> Vec<&TensorRef> {
        let mut v = vec![
            &self.hc_attn_fn,
            &self.hc_attn_scale,
            &self.hc_attn_base,
            &self.attn_norm,
            &self.attn_q_a,
            &self.attn_q_a_norm,
            &self.attn_q_b,
            &self.attn_kv,
            &self.attn_kv_a_norm,
            &self.attn_sinks,
            &self.attn_output_a,
            &self.attn_output_b,
            &self.hc_ffn_fn,
            &self.hc_ffn_scale,
            &self.hc_ffn_base,
            &self.ffn_norm,
            &self.ffn_gate_inp,
            &self.exp_probs_b,
            &self.ffn_gate_exps,
            &self.ffn_up_exps,
            &self.ffn_down_exps,
            &self.ffn_gate_shexp,
            &self.ffn_up_shexp,
            &self.ffn_down_shexp,
        ];
        v.extend(self.exp_probs_b_vl.as_ref());
        if let Some(c) = &self.compressor {
            v.extend([&c.kv, &c.norm, &c.index_k, &c.index_k_norm]);
            v.extend(c.gate.as_ref());
        }
        if let Some(i) = &self.indexer {
            v.extend([&i.q_b, &i.proj]);
        }
        if let Some(e) = &self.engram {
            v.extend([&e.q_norm, &e.k_norm, &e.kv, &e.table]);
        }
        v
    }
}

fn bind_layer(b: &Binder, cfg: &V41Config, l: usize) -> Result<V41LayerWeights, ModelError> {
    let p = |s: &str| format!("blk.{l}.{s}");
    let d = cfg.n_embd;
    let hc = cfg.hc_count;
    let mix = cfg.hc_mix_dim();
    let hd = cfg.head_dim;
    let role = cfg.roles[l];
    let (e, ff) = (cfg.n_expert, cfg.expert_ff);

    let compressor = match role {
        LayerRole::Source { ratio } => Some(V41Compressor {
            kv: b.bind(&p("attn_compressor_kv.weight"), &[d, hd], Class::Dense)?,
            gate: if ratio > 1 {
                Some(b.bind(&p("attn_compressor_gate.weight"), &[d, hd], Class::Dense)?)
            } else {
                None
            },
            norm: b.bind(&p("attn_compressor_norm.weight"), &[hd], Class::Vector)?,
            index_k: b.bind(
                &p("indexer.attn_k.weight"),
                &[hd, cfg.indexer_head_dim],
                Class::Dense,
            )?,
            index_k_norm: b.bind(
                &p("indexer.k_norm.weight"),
                &[cfg.indexer_head_dim],
                Class::Vector,
            )?,
        }),
        _ => None,
    };
    let indexer = if role.indexes() {
        Some(V41Indexer {
            q_b: b.bind(
                &p("indexer.attn_q_b.weight"),
                &[cfg.q_lora_rank, cfg.indexer_heads * cfg.indexer_head_dim],
                Class::Dense,
            )?,
            proj: b.bind(
                &p("indexer.proj.weight"),
                &[d, cfg.indexer_heads],
                Class::Dense,
            )?,
        })
    } else {
        None
    };
    let engram = match cfg.engram.slot(l) {
        None => None,
        Some(slot) => {
            let eg = &cfg.engram;
            let table_name = p("engram_embd.weight");
            if b.file.tensor_info(&table_name).is_none() {
                return Err(ModelError::BadTensor {
                    name: table_name,
                    msg: format!(
                        "missing: layer {l} is an Engram layer (deepseek41.engram.layer_ids) and needs its {}-row table",
                        eg.rows[slot]
                    ),
                });
            }
            Some(V41Engram {
                q_norm: b.bind(&p("engram_q_norm.weight"), &[d, hc], Class::Vector)?,
                k_norm: b.bind(&p("engram_k_norm.weight"), &[d, hc], Class::Vector)?,
                kv: b.bind(
                    &p("engram_kv.weight"),
                    &[eg.cols() * eg.head_dim, (hc + 1) * d],
                    Class::Dense,
                )?,
                table: b.bind(
                    &table_name,
                    &[eg.row_bytes(), eg.rows[slot] as usize],
                    Class::I8,
                )?,
            })
        }
    };
    // A table on a layer the metadata does not list would be silently unused.
    if engram.is_none() && b.file.tensor_info(&p("engram_embd.weight")).is_some() {
        return Err(ModelError::BadTensor {
            name: p("engram_embd.weight"),
            msg: format!("layer {l} is not in deepseek41.engram.layer_ids"),
        });
    }

    Ok(V41LayerWeights {
        role,
        hc_attn_fn: b.bind(&p("hc_attn_fn.weight"), &[hc * d, mix], Class::Dense)?,
        hc_attn_scale: b.bind(&p("hc_attn_scale.weight"), &[3], Class::Vector)?,
        hc_attn_base: b.bind(&p("hc_attn_base.weight"), &[mix], Class::Vector)?,
        attn_norm: b.bind(&p("attn_norm.weight"), &[d], Class::Vector)?,
        attn_q_a: b.bind(&p("attn_q_a.weight"), &[d, cfg.q_lora_rank], Class::Dense)?,
        attn_q_a_norm: b.bind(
            &p("attn_q_a_norm.weight"),
            &[cfg.q_lora_rank],
            Class::Vector,
        )?,
        attn_q_b: b.bind(
            &p("attn_q_b.weight"),
            &[cfg.q_lora_rank, cfg.q_dim()],
            Class::Dense,
        )?,
        attn_kv: b.bind(&p("attn_kv.weight"), &[d, hd], Class::Dense)?,
        attn_kv_a_norm: b.bind(&p("attn_kv_a_norm.weight"), &[hd], Class::Vector)?,
        attn_sinks: b.bind(&p("attn_sinks.weight"), &[cfg.n_head], Class::Vector)?,
        attn_output_a: b.bind(
            &p("attn_output_a.weight"),
            &[cfg.q_dim() / cfg.o_groups, cfg.o_groups * cfg.o_lora_rank],
            Class::Dense,
        )?,
        attn_output_b: b.bind(
            &p("attn_output_b.weight"),
            &[cfg.o_groups * cfg.o_lora_rank, d],
            Class::Dense,
        )?,
        compressor,
        indexer,
        hc_ffn_fn: b.bind(&p("hc_ffn_fn.weight"), &[hc * d, mix], Class::Dense)?,
        hc_ffn_scale: b.bind(&p("hc_ffn_scale.weight"), &[3], Class::Vector)?,
        hc_ffn_base: b.bind(&p("hc_ffn_base.weight"), &[mix], Class::Vector)?,
        ffn_norm: b.bind(&p("ffn_norm.weight"), &[d], Class::Vector)?,
        ffn_gate_inp: b.bind(&p("ffn_gate_inp.weight"), &[d, e], Class::Dense)?,
        exp_probs_b: b.bind(&p("exp_probs_b.bias"), &[e], Class::Vector)?,
        exp_probs_b_vl: b.bind_opt(&p("exp_probs_b_vl.bias"), &[e], Class::Vector)?,
        ffn_gate_exps: b.bind(&p("ffn_gate_exps.weight"), &[d, ff, e], Class::Expert)?,
        ffn_up_exps: b.bind(&p("ffn_up_exps.weight"), &[d, ff, e], Class::Expert)?,
        ffn_down_exps: b.bind(&p("ffn_down_exps.weight"), &[ff, d, e], Class::Expert)?,
        ffn_gate_shexp: b.bind(&p("ffn_gate_shexp.weight"), &[d, ff], Class::Dense)?,
        ffn_up_shexp: b.bind(&p("ffn_up_shexp.weight"), &[d, ff], Class::Dense)?,
        ffn_down_shexp: b.bind(&p("ffn_down_shexp.weight"), &[ff, d], Class::Dense)?,
        engram,
    })
}
