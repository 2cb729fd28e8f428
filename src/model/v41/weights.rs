//! DeepSeek V4.1 weights bound by the names ds4's
//! `gguf-tools/deepseek41_quantize.py` writes, each checked against the
//! configuration (shape and accepted types), the Engram tables included.
//!
//! The Engram tables (`blk.N.engram_embd.weight`, I8 `[264, rows]`: each row
//! 256 E4M3 codes then 8 E8M0 scales) are bound like any tensor, but only as
//! a file extent: nothing here or in the loader reads them, so the ~189 GiB
//! of the real file stay on disk.

use crate::gguf::{GgufFile, TensorRef};
use crate::model::weights::{
    bind_attn, bind_hc_mix, bind_moe, routed_types_of, type_mix_of, AttnWeights, Binder, Class,
    HcMixWeights, MoeWeights, TypeShare,
};
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

/// A V4.1 layer: V4's shared parts (HC mixes, attention projections, MoE,
/// here always with a router bias and a shared expert), V4.1's compressor
/// and indexer by layer role, and the Engram module.
#[derive(Clone, Debug)]
pub struct V41LayerWeights {
    pub role: LayerRole,
    pub hc_attn: HcMixWeights,
    pub attn: AttnWeights,
    pub compressor: Option<V41Compressor>,
    pub indexer: Option<V41Indexer>,
    pub hc_ffn: HcMixWeights,
    pub ffn: MoeWeights,
    /// The image-span routing bias; unused for text.
    pub exp_probs_b_vl: Option<TensorRef>,
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
        let b = Binder { file, base: 0 };
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
        routed_types_of(self.layers.iter().map(|l| l.ffn.routed().map(|t| t.ty)))
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
            let routed = l.ffn.routed();
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
        let mut v: Vec<&TensorRef> = self.hc_attn.all().into();
        v.extend(self.attn.all());
        v.extend(self.hc_ffn.all());
        v.extend(self.ffn.all());
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
    let hd = cfg.head_dim;
    let role = cfg.roles[l];
    let e = cfg.n_expert;

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

    let prefix = format!("blk.{l}.");
    let bias = b.bind(&p("exp_probs_b.bias"), &[e], Class::Vector)?;
    Ok(V41LayerWeights {
        role,
        hc_attn: bind_hc_mix(b, cfg, &prefix, "attn")?,
        attn: bind_attn(b, cfg, &prefix)?,
        compressor,
        indexer,
        hc_ffn: bind_hc_mix(b, cfg, &prefix, "ffn")?,
        ffn: bind_moe(b, cfg, &prefix, Some(bias), None, true)?,
        exp_probs_b_vl: b.bind_opt(&p("exp_probs_b_vl.bias"), &[e], Class::Vector)?,
        engram,
    })
}
