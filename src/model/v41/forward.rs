//! The DeepSeek V4.1 forward pass, from the official `inference/model.py`
//! (docs/V41.md), recorded with the same sub-steps as V4 (`model::block`).
//!
//! Three things differ from V4, and only they are written here:
//! 1. **Engram**: layers that have it add n-gram table rows to the whole HC
//!    state before their attention (`engram`).
//! 2. **Lagged HC mixes**: a sublayer is collapsed with the mix computed one
//!    sublayer earlier (the attention with the previous layer's FFN mix, a
//!    one-hot at layer 0; the MoE with the attention's mix), and the output
//!    head collapses with the last FFN mix instead of a learned head mix.
//! 3. **Shared kv and index sources**: a layer's compressed rows and top-k
//!    come from the kv-source and index-source layers its role names, with
//!    the V4.1 compressor and the candidate blocks (`sparse`).
//!
//! Smaller differences: no per-head query norm, the router normalises only
//! with more than one expert, and under `--numerics model` the official
//! graph's simulated quantisation (docs/V41.md § Numerics): FP8 inputs of
//! the FP8/FP4 GEMMs, the whole window row in FP8, the compressed latents
//! in FP4 with E4M3 scales, the indexer's queries and keys in FP4.

use std::sync::Arc;

use super::{LayerRole, V41Config, V41LayerWeights, V41Weights};
use crate::graph::ops::attention::CompressedRows;
use crate::graph::ops::candidate::{CandidateBlocks, CandidateTopK};
use crate::graph::ops::engram::{EngramGate, EngramHash, EngramLookup};
use crate::graph::ops::hc::HcOneHot;
use crate::graph::ops::indexer::IndexerTopK;
use crate::graph::ops::source_compress::{Frontier, SourceCompress};
use crate::graph::ops::v41::V41Op;
use crate::graph::ops::Op;
use crate::graph::{Graph, StateId, StateLayout, ValueId, ValueName};
use crate::model::block::attention::{AttnOptions, IndexRounding, KvRounding, Projected, Sparse};
use crate::model::block::Builder;
use crate::model::forward::Numerics;
use crate::model::logits::Logits;
use crate::model::weights::{AttnWeights, HcMixWeights, MoeWeights};
use crate::model::LayerWeights;

/// Persistent state of one V4.1 layer.
#[derive(Clone, Copy, Debug)]
pub struct V41LayerState {
    /// Raw KV rows of the last `window` positions, slot = position mod window.
    pub ring: StateId,
    /// kv-source layers: roped latent rows, index keys, and (ratio > 1) the
    /// partial group.
    pub rows: Option<StateId>,
    pub index_rows: Option<StateId>,
    pub frontier: Option<Frontier>,
}

/// The state layout of a V4.1 session of `ctx` tokens.
#[derive(Clone, Debug)]
pub struct V41KvLayout {
    pub ctx: usize,
    pub layout: StateLayout,
    pub layers: Vec<V41LayerState>,
    /// The last `max_ngram − 1` compressed ids (−1 = none).
    pub engram_history: StateId,
}

impl V41KvLayout {
    pub fn new(cfg: &V41Config, ctx: usize) -> V41KvLayout {
        let mut layout = StateLayout::default();
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (l, role) in cfg.roles.iter().enumerate() {
            let ring = layout.add("kv_ring", Some(l), cfg.sliding_window, cfg.head_dim, 0.0);
            let mut st = V41LayerState {
                ring,
                rows: None,
                index_rows: None,
                frontier: None,
            };
            if let LayerRole::Source { ratio } = *role {
                let cap = ctx / ratio + 2;
                st.rows = Some(layout.add("comp_rows", Some(l), cap, cfg.head_dim, 0.0));
                st.index_rows =
                    Some(layout.add("index_rows", Some(l), cap, cfg.indexer_head_dim, 0.0));
                if ratio > 1 {
                    st.frontier = Some(Frontier {
                        kv: layout.add("comp_state_kv", Some(l), ratio, cfg.head_dim, 0.0),
                        score: layout.add(
                            "comp_state_score",
                            Some(l),
                            ratio,
                            cfg.head_dim,
                            crate::graph::ops::compress::EMPTY_SCORE,
                        ),
                    });
                }
            }
            layers.push(st);
        }
        let engram_history = layout.add("engram_history", None, 1, cfg.engram.max_ngram - 1, -1.0);
        V41KvLayout {
            ctx,
            layout,
            layers,
            engram_history,
        }
    }
}

#[derive(Clone, Debug)]
pub struct V41ForwardOptions {
    pub numerics: Numerics,
    pub logits: Logits,
    /// Values to keep readable after a step.
    pub keep: Vec<ValueName>,
    /// Where the Engram rows come from. `false`: the graph hashes the ids and
    /// reads the table rows itself (through the file map; tests, tiny
    /// models). `true`: each Engram layer has an input value
    /// `engram_rows@L` (`[T, cols·head_dim]`, see [`engram_input`]) that the
    /// host fills before the step from `engram::hash_rows` and an
    /// `EngramReader` (positioned reads, hot-row cache), so the tables are
    /// never mapped.
    pub engram_from_host: bool,
}

/// The `engram_rows@L` input of layer `l` in a graph recorded with
/// `engram_from_host`.
pub fn engram_input(g: &Graph, l: usize) -> Option<ValueId> {
    g.find(&ValueName {
        name: "engram_rows".into(),
        layer: Some(l),
    })
}

/// What a V4.1 graph carries from layer to layer besides the HC state.
struct Carry {
    /// The latest index source's top-k, per layer index.
    topk: Vec<Option<ValueId>>,
    /// The candidate source's kept blocks.
    blocks: Option<ValueId>,
    /// The graph's hashed rows; `None` when the host feeds `engram_rows@L`.
    hashed: Option<ValueId>,
    /// Host-fed inputs (kept: written before the step, so no slot reuse).
    inputs: Vec<ValueId>,
    /// `--numerics model`: the official rounding steps.
    model: bool,
}

/// The Engram module of layer `l` (research §2.5), on the whole HC state.
fn engram(
    b: &mut Builder,
    cfg: &V41Config,
    carry: &mut Carry,
    l: usize,
    w: &V41LayerWeights,
    state: ValueId,
) -> ValueId {
    let eg = &cfg.engram;
    let (Some(ew), Some(slot)) = (&w.engram, eg.slot(l)) else {
        return state;
    };
    let e = b.r.tokens_f32("engram_rows", eg.cols() * eg.head_dim);
    match carry.hashed {
        Some(rows) => b.r.op(Op::V41(V41Op::EngramLookup(EngramLookup {
            rows,
            slot,
            n_layers: eg.layer_ids.len(),
            cols: eg.cols(),
            head_dim: eg.head_dim,
            table: ew.table.clone(),
            out: e,
        }))),
        None => carry.inputs.push(e),
    }
    let e = b.gemm_input("engram_rows_fp8", e, carry.model);
    let kv = b.matmul("engram_kv", &ew.kv, e);
    let out = b.r.tokens_f32("engram_hc_state", cfg.hc_count * cfg.n_embd);
    b.r.op(Op::V41(V41Op::EngramGate(EngramGate {
        state,
        kv,
        q_weight: ew.q_norm.clone(),
        k_weight: ew.k_norm.clone(),
        n_hc: cfg.hc_count,
        dim: cfg.n_embd,
        eps: cfg.rms_eps,
        out,
    })));
    out
}

/// The sparse part of a V4.1 layer, by its role: a kv source runs the V4.1
/// compressor (latent rows and index keys); an index source picks rows from
/// its kv source's keys (above the candidate source only among the
/// candidate blocks, and the candidate source publishes those); a reuse
/// layer reads the latest index source's top-k.
fn sparse(
    b: &mut Builder,
    cfg: &V41Config,
    carry: &mut Carry,
    l: usize,
    w: &V41LayerWeights,
    kv_layout: &V41KvLayout,
    p: Projected,
) -> Sparse {
    let st = &kv_layout.layers[l];
    let role = w.role;
    let ratio = role.ratio();
    if let (Some(cw), Some(rows), Some(index_rows)) = (&w.compressor, st.rows, st.index_rows) {
        let ck = b.matmul("comp_kv", &cw.kv, p.xn);
        let cg = cw.gate.as_ref().map(|g| b.matmul("comp_gate", g, p.xn));
        b.r.op(Op::V41(V41Op::SourceCompress(SourceCompress {
            kv: ck,
            gate: cg,
            norm: cw.norm.clone(),
            index_wk: cw.index_k.clone(),
            index_norm: cw.index_k_norm.clone(),
            frontier: st.frontier,
            rows,
            index_rows,
            ratio,
            head_dim: cfg.head_dim,
            index_head_dim: cfg.indexer_head_dim,
            rope: cfg.rope(l),
            eps: cfg.rms_eps,
            round_rows: carry.model,
        })));
    }
    let kv_source = match role {
        LayerRole::Window => None,
        LayerRole::Source { .. } => Some(l),
        LayerRole::Reindex { kv_source, .. } | LayerRole::Reuse { kv_source, .. } => {
            Some(kv_source)
        }
    };
    let mut selected = None;
    if let (Some(iw), Some(src)) = (&w.indexer, kv_source) {
        let (ih, ihd) = (cfg.indexer_heads, cfg.indexer_head_dim);
        let keys = kv_layout.layers[src]
            .index_rows
            .expect("a kv source has index rows");
        let rounding = if carry.model {
            IndexRounding::Fp4
        } else {
            IndexRounding::None
        };
        let (qi, wis) = b.indexer_query(l, &iw.q_b, &iw.proj, p, rounding);
        let sel = b.r.tokens_i32("index_selected", cfg.indexer_top_k);
        match carry.blocks {
            Some(blocks) if cfg.uses_candidates(l) => {
                b.r.op(Op::V41(V41Op::CandidateTopK(CandidateTopK {
                    q: qi,
                    weights: wis,
                    rows: keys,
                    blocks,
                    ratio,
                    top_k: cfg.indexer_top_k,
                    n_head: ih,
                    head_dim: ihd,
                    topk_blocks: cfg.candidate_topk_blocks,
                    block_size: cfg.candidate_block_size,
                    out: sel,
                })))
            }
            _ => b.r.op(Op::IndexerTopK(IndexerTopK {
                q: qi,
                weights: wis,
                rows: keys,
                ratio,
                top_k: cfg.indexer_top_k,
                n_head: ih,
                head_dim: ihd,
                out: sel,
            })),
        }
        if cfg.candidate_source == Some(l) {
            let blocks =
                b.r.tokens_i32("candidate_blocks", cfg.candidate_topk_blocks);
            b.r.op(Op::V41(V41Op::CandidateBlocks(CandidateBlocks {
                q: qi,
                weights: wis,
                rows: keys,
                ratio,
                n_head: ih,
                head_dim: ihd,
                topk_blocks: cfg.candidate_topk_blocks,
                block_size: cfg.candidate_block_size,
                out: blocks,
            })));
            carry.blocks = Some(blocks);
        }
        selected = Some(sel);
    } else if let LayerRole::Reuse { index_source, .. } = role {
        selected = carry.topk[index_source];
    }
    carry.topk[l] = selected;
    Sparse {
        compressed: kv_source.map(|s| CompressedRows {
            rows: kv_layout.layers[s].rows.expect("a kv source has rows"),
            ratio,
        }),
        selected,
    }
}

/// The weights of a V4.1 block's sublayers (a layer's, or a DSpark stage's).
#[derive(Clone, Copy)]
pub(crate) struct BlockParts<'a> {
    pub hc_attn: &'a HcMixWeights,
    pub attn: &'a AttnWeights,
    pub hc_ffn: &'a HcMixWeights,
    pub ffn: &'a MoeWeights,
}

impl<'a> From<&'a V41LayerWeights> for BlockParts<'a> {
    fn from(w: &'a V41LayerWeights) -> Self {
        BlockParts {
            hc_attn: &w.hc_attn,
            attn: &w.attn,
            hc_ffn: &w.hc_ffn,
            ffn: &w.ffn,
        }
    }
}

/// A DSpark stage's (a window-only block in the shared layer type).
impl<'a> From<&'a LayerWeights> for BlockParts<'a> {
    fn from(w: &'a LayerWeights) -> Self {
        BlockParts {
            hc_attn: &w.hc_attn,
            attn: &w.attn,
            hc_ffn: &w.hc_ffn,
            ffn: &w.ffn,
        }
    }
}

/// The attention options of V4.1's layers: no per-head query norm; under
/// model numerics the whole window row in FP8 and the FP8 GEMMs' inputs
/// rounded.
pub(crate) fn v41_attn_options(numerics: Numerics) -> AttnOptions {
    let model = numerics == Numerics::Model;
    AttnOptions {
        q_head_norm: false,
        kv_round: if model {
            KvRounding::Fp8Row
        } else {
            KvRounding::None
        },
        act_fp8: model,
        draft_block: false,
    }
}

/// One V4.1 block on the n·D `state` (after its Engram module), with the
/// lagged HC mixes: the attention collapses with `pre_mix` (the mix one
/// sublayer earlier), the MoE with the attention's. Returns the new state
/// and the FFN's mix, which the next sublayer collapses with. `model`:
/// the FP8 rounding of the MoE's inputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lagged_block(
    b: &mut Builder,
    l: usize,
    w: BlockParts,
    ring: StateId,
    attn: AttnOptions,
    model: bool,
    state: ValueId,
    pre_mix: ValueId,
    sparse: impl FnOnce(&mut Builder, Projected) -> Sparse,
) -> (ValueId, ValueId) {
    let a = b.hc_mixes("attn", state, w.hc_attn);
    let x = b.hc_collapse("attn_in", state, pre_mix);
    let y = b.attention(l, w.attn, ring, attn, x, sparse);
    let state = b.hc_expand("attn", state, y, &a);
    let f = b.hc_mixes("ffn", state, w.hc_ffn);
    let x = b.hc_collapse("ffn_in", state, a.pre);
    let normalize = b.cfg.expert_weights_norm && b.cfg.n_expert_used > 1;
    let y = b.moe(l, w.ffn, x, normalize, model, model);
    (b.hc_expand("ffn", state, y, &f), f.pre)
}

/// A one-hot mix on the first stream: what layer 0's attention (and a
/// DSpark draft's first stage) collapses with.
pub(crate) fn first_stream_mix(b: &mut Builder) -> ValueId {
    let n = b.cfg.hc_count;
    let pre_mix = b.r.tokens_f32("hc_pre0", n);
    b.r.op(Op::V41(V41Op::HcOneHot(HcOneHot {
        out: pre_mix,
        n_hc: n,
    })));
    pre_mix
}

/// Records the V4.1 forward pass for steps of up to `max_tokens` tokens.
pub fn record(
    cfg: &V41Config,
    w: &V41Weights,
    kv: &V41KvLayout,
    max_tokens: usize,
    opts: &V41ForwardOptions,
) -> Graph {
    let mut b = Builder::new(cfg, max_tokens);
    let mut carry = Carry {
        topk: vec![None; cfg.n_layer],
        blocks: None,
        hashed: None,
        inputs: Vec::new(),
        model: opts.numerics == Numerics::Model,
    };
    let eg = &cfg.engram;
    let attn = v41_attn_options(opts.numerics);

    // Engram rows depend on the ids alone: hashed once, before any layer.
    if !opts.engram_from_host {
        let rows =
            b.r.tokens_i32("engram_hash", eg.layer_ids.len() * eg.cols());
        b.r.op(Op::V41(V41Op::EngramHash(EngramHash {
            tokens: b.tokens,
            history: kv.engram_history,
            layout: Arc::new(eg.hash_layout()),
            out: rows,
        })));
        carry.hashed = Some(rows);
    }
    let mut state = b.embed(&w.token_embd);
    // Lagged HC: a sublayer is collapsed with the mix computed one sublayer
    // earlier; layer 0's attention with a one-hot on the first stream.
    let mut pre_mix = first_stream_mix(&mut b);

    for (l, lw) in w.layers.iter().enumerate() {
        b.r.set_layer(Some(l));
        state = engram(&mut b, cfg, &mut carry, l, lw, state);
        let ring = kv.layers[l].ring;
        let model = carry.model;
        (state, pre_mix) = lagged_block(
            &mut b,
            l,
            lw.into(),
            ring,
            attn,
            model,
            state,
            pre_mix,
            |b, p| sparse(b, cfg, &mut carry, l, lw, kv, p),
        );
        b.r.flush();
    }
    b.r.set_layer(None);

    // No learned output head mix in V4.1: the last FFN mix collapses.
    let x = b.hc_collapse("out_in", state, pre_mix);
    let logits = b.head(x, &w.output_norm, &w.output, opts.logits);
    b.finish(logits, std::mem::take(&mut carry.inputs), &opts.keep)
}
