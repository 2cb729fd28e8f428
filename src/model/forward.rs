//! The DeepSeek V4 forward pass, written once as a recorded graph.
//!
//! Reads top to bottom like MODEL.md §3: embedding → per layer (HC collapse →
//! attention with compressor and indexer → HC expand → HC collapse → MoE with
//! shared expert → HC expand) → output HC collapse → norm → head. Shapes in
//! comments are per token; `T` is the step's token count. The sub-steps are
//! the shared builders of `model::block`; what is V4's own here is each
//! layer's compressor and indexer (`sparse`) and the learned output mix.

use super::block::attention::{AttnOptions, IndexRounding, KvRounding, Projected, Sparse};
use super::block::Builder;
use super::logits::Logits;
use super::state::{KvLayout, LayerState};
use super::{LayerWeights, ModelConfig, Weights};
use crate::graph::ops::attention::CompressedRows;
use crate::graph::ops::compress::{Compress, RowRounding};
use crate::graph::ops::indexer::IndexerTopK;
use crate::graph::ops::Op;
use crate::graph::{Graph, ValueId, ValueName};

/// Which rounding steps the graph applies (MODEL.md §3.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// The official numerics, as ds4: FP8 KV rows, f16 cache storage, the
    /// indexer's Hadamard + FP4. The default.
    Model,
    /// Exactly those three rounding steps off (validation against transformers).
    Plain,
}

impl Numerics {
    pub fn parse(s: &str) -> Option<Numerics> {
        match s {
            "model" => Some(Numerics::Model),
            "plain" => Some(Numerics::Plain),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub numerics: Numerics,
    pub logits: Logits,
    /// Values to keep readable after a step (`--dump NAME@LAYER`).
    pub keep: Vec<ValueName>,
}

/// The sparse part of a V4 layer (MODEL.md §3.5–3.6): its own compressor
/// (CSA: overlapped, HCA: not) and, on CSA layers, its own indexer over the
/// indexer compressor's keys.
fn sparse(
    b: &mut Builder,
    l: usize,
    w: &LayerWeights,
    st: &LayerState,
    numerics: Numerics,
    p: Projected,
) -> Sparse {
    let cfg = b.cfg;
    let model = numerics == Numerics::Model;
    let ratio = w.kind.ratio();
    let (Some(cw), Some(cs)) = (&w.compressor, &st.compressor) else {
        return Sparse::default();
    };
    let ck = b.matmul("comp_kv", &cw.kv, p.xn); // coff·HD
    let cg = b.matmul("comp_gate", &cw.gate, p.xn);
    b.r.op(Op::Compress(Compress {
        kv: ck,
        gate: cg,
        ape: cw.ape.clone(),
        norm: cw.norm.clone(),
        state_kv: cs.kv,
        state_score: cs.score,
        rows: cs.rows,
        ratio,
        head_dim: cfg.head_dim,
        overlapped: cw.overlapped,
        rope: cfg.rope(l),
        rounding: if model {
            RowRounding::Fp8F16
        } else {
            RowRounding::None
        },
        eps: cfg.rms_eps,
    }));
    let compressed = Some(CompressedRows {
        rows: cs.rows,
        ratio,
    });
    let (Some(iw), Some(is)) = (&w.indexer, &st.indexer) else {
        return Sparse {
            compressed,
            selected: None,
        };
    };
    let (ih, ihd) = (cfg.indexer_heads, cfg.indexer_head_dim);
    let ik = b.matmul("index_comp_kv", &iw.compressor.kv, p.xn); // 2·IHD
    let ig = b.matmul("index_comp_gate", &iw.compressor.gate, p.xn);
    b.r.op(Op::Compress(Compress {
        kv: ik,
        gate: ig,
        ape: iw.compressor.ape.clone(),
        norm: iw.compressor.norm.clone(),
        state_kv: is.kv,
        state_score: is.score,
        rows: is.rows,
        ratio,
        head_dim: ihd,
        overlapped: true,
        rope: cfg.rope(l),
        rounding: if model {
            RowRounding::HadamardFp4F16
        } else {
            RowRounding::None
        },
        eps: cfg.rms_eps,
    }));
    let rounding = if model {
        IndexRounding::HadamardFp4
    } else {
        IndexRounding::None
    };
    let (qi, wi) = b.indexer_query(l, &iw.q_b, &iw.proj, p, rounding);
    let sel = b.r.tokens_i32("index_selected", cfg.indexer_top_k);
    b.r.op(Op::IndexerTopK(IndexerTopK {
        q: qi,
        weights: wi,
        rows: is.rows,
        ratio,
        top_k: cfg.indexer_top_k,
        n_head: ih,
        head_dim: ihd,
        out: sel,
    }));
    Sparse {
        compressed,
        selected: Some(sel),
    }
}

/// The attention options of V4 under `numerics`.
pub(crate) fn attn_options(numerics: Numerics) -> AttnOptions {
    AttnOptions {
        q_head_norm: true,
        kv_round: if numerics == Numerics::Model {
            KvRounding::Fp8NonRotaryF16
        } else {
            KvRounding::None
        },
        act_fp8: false,
        draft_block: false,
    }
}

/// One V4 block (MODEL.md §3.2–3.9) on the n·D `state`: HC collapse →
/// attention with the layer's compressor and indexer → HC expand → HC
/// collapse → MoE with shared expert → HC expand. Returns the new state.
/// The MTP block (`model::mtp`) is one of these, window-only.
pub(crate) fn block(
    b: &mut Builder,
    l: usize,
    lw: &LayerWeights,
    st: &LayerState,
    numerics: Numerics,
    state: ValueId,
) -> ValueId {
    block_with(b, l, lw, st, numerics, attn_options(numerics), state)
}

/// [`block`] with the attention options given (a DSpark stage's draft
/// block: [`AttnOptions::draft_block`]).
pub(crate) fn block_with(
    b: &mut Builder,
    l: usize,
    lw: &LayerWeights,
    st: &LayerState,
    numerics: Numerics,
    attn: AttnOptions,
    state: ValueId,
) -> ValueId {
    let m = b.hc_mixes("attn", state, &lw.hc_attn);
    let x = b.hc_collapse("attn_in", state, m.pre); // D
    let y = b.attention(l, &lw.attn, st.ring, attn, x, |b, p| {
        sparse(b, l, lw, st, numerics, p)
    });
    let state = b.hc_expand("attn", state, y, &m);
    let m = b.hc_mixes("ffn", state, &lw.hc_ffn);
    let x = b.hc_collapse("ffn_in", state, m.pre);
    let y = b.moe(l, &lw.ffn, x, b.cfg.expert_weights_norm, false, false);
    b.hc_expand("ffn", state, y, &m)
}

/// The value holding the n·D state after the last layer, before the
/// output head (what the MTP block drafts from, MODEL.md §6).
pub fn final_state(cfg: &ModelConfig) -> ValueName {
    ValueName {
        name: "ffn_hc_state".into(),
        layer: Some(cfg.n_layer - 1),
    }
}

/// Records the whole forward pass for steps of up to `max_tokens` tokens.
pub fn record(
    cfg: &ModelConfig,
    w: &Weights,
    kv: &KvLayout,
    max_tokens: usize,
    opts: &ForwardOptions,
) -> Graph {
    let mut b = Builder::new(cfg, max_tokens);
    let mut state = b.embed(&w.token_embd); // n·D

    for (l, (lw, st)) in w.layers.iter().zip(&kv.layers).enumerate() {
        b.r.set_layer(Some(l));
        state = block(&mut b, l, lw, st, opts.numerics, state);
        b.r.flush();
    }
    b.r.set_layer(None);

    // Output head (MODEL.md §3.10): collapse with `pre` only, norm, project.
    let pre = b.hc_head_mix(
        "out",
        state,
        &w.output_hc_fn,
        &w.output_hc_scale,
        &w.output_hc_base,
    );
    let x = b.hc_collapse("out_in", state, pre);
    let logits = b.head(x, &w.output_norm, &w.output, opts.logits);
    b.finish(logits, Vec::new(), &opts.keep)
}
