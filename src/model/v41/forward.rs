//! The DeepSeek V4.1 forward pass, recorded once as a graph beside V4's
//! (`model::forward`), from the official `inference/model.py` (docs/V41.md).
//!
//! Per layer: Engram (layers that have it, on the whole HC state) → the
//! attention sublayer, collapsed with the *incoming* mix (lagged HC: the
//! previous layer's FFN mix, a one-hot at layer 0) → HC expand → the MoE
//! sublayer, collapsed with the attention's mix → HC expand; the FFN's mix is
//! handed on. Attention: no per-head q norm; kv sources run the V4.1
//! compressor (latent rows and index keys); index sources pick rows (layers
//! above the candidate source only among its candidate blocks); reuse layers
//! read the latest source's rows and top-k. Plain f32 numerics only: the
//! official fp8/fp4 simulation is not modelled.

use std::sync::Arc;

use super::{LayerRole, V41Config, V41LayerWeights, V41Weights};
use crate::gguf::TensorRef;
use crate::graph::ops::attention::{Attention, CompressedRows, RingWrite};
use crate::graph::ops::basic::{Embed, Scale};
use crate::graph::ops::hc::HcInit;
use crate::graph::ops::indexer::IndexerTopK;
use crate::graph::ops::v41::{
    CandidateBlocks, CandidateTopK, EngramGate, EngramHash, EngramLookup, Frontier, HcOneHot,
    V41Compress, V41Op,
};
use crate::graph::ops::Op;
use crate::graph::{Graph, Recorder, StateId, StateLayout, ValueId, ValueName};
use crate::model::forward::{
    finish_graph, record_hc_collapse, record_hc_expand, record_hc_mixes, record_head,
    record_matmul, record_moe, record_rms_norm, record_rope, HcDims, HeadStep, Logits, MoeStep,
};

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

struct Ctx<'a> {
    r: Recorder,
    cfg: &'a V41Config,
    tokens: ValueId,
    /// The latest index source's top-k, per layer index.
    topk: Vec<Option<ValueId>>,
    /// The candidate source's kept blocks.
    blocks: Option<ValueId>,
    /// The graph's hashed rows; `None` when the host feeds `engram_rows@L`.
    hashed: Option<ValueId>,
    /// Host-fed inputs (kept: written before the step, so no slot reuse).
    inputs: Vec<ValueId>,
}

impl Ctx<'_> {
    fn matmul(&mut self, name: &str, w: &TensorRef, x: ValueId) -> ValueId {
        record_matmul(&mut self.r, name, w, x, 1)
    }

    fn grouped_matmul(&mut self, name: &str, w: &TensorRef, x: ValueId, groups: usize) -> ValueId {
        record_matmul(&mut self.r, name, w, x, groups)
    }

    fn rms_norm(&mut self, name: &str, x: ValueId, dim: usize, w: Option<&TensorRef>) -> ValueId {
        record_rms_norm(&mut self.r, self.cfg.rms_eps, name, x, dim, w)
    }

    fn rope(
        &mut self,
        name: &str,
        x: ValueId,
        heads: usize,
        hd: usize,
        l: usize,
        inverse: bool,
    ) -> ValueId {
        record_rope(&mut self.r, self.cfg.rope(l), name, x, heads, hd, inverse)
    }

    fn hc(&self) -> HcDims {
        HcDims {
            n: self.cfg.hc_count,
            d: self.cfg.n_embd,
            sinkhorn_iters: self.cfg.hc_sinkhorn_iters,
            eps: self.cfg.hc_eps,
            rms_eps: self.cfg.rms_eps,
        }
    }

    /// The sublayer's mixes from the whole HC state: (pre, post, comb).
    fn mixes(
        &mut self,
        tag: &str,
        state: ValueId,
        f: &TensorRef,
        scale: &TensorRef,
        base: &TensorRef,
    ) -> (ValueId, ValueId, ValueId) {
        let hc = self.hc();
        record_hc_mixes(&mut self.r, &hc, tag, state, [f, scale, base])
    }

    fn collapse(&mut self, name: &str, state: ValueId, pre: ValueId) -> ValueId {
        let hc = self.hc();
        record_hc_collapse(&mut self.r, &hc, name, state, pre)
    }

    fn expand(
        &mut self,
        tag: &str,
        state: ValueId,
        y: ValueId,
        post: ValueId,
        comb: ValueId,
    ) -> ValueId {
        let hc = self.hc();
        record_hc_expand(&mut self.r, &hc, tag, state, y, post, comb)
    }

    fn engram(&mut self, l: usize, w: &V41LayerWeights, state: ValueId) -> ValueId {
        let cfg = self.cfg;
        let eg = &cfg.engram;
        let (Some(ew), Some(slot)) = (&w.engram, eg.slot(l)) else {
            return state;
        };
        let e = self.r.tokens_f32("engram_rows", eg.cols() * eg.head_dim);
        match self.hashed {
            Some(rows) => self.r.op(Op::V41(V41Op::EngramLookup(EngramLookup {
                rows,
                slot,
                n_layers: eg.layer_ids.len(),
                cols: eg.cols(),
                head_dim: eg.head_dim,
                table: ew.table.clone(),
                out: e,
            }))),
            None => self.inputs.push(e),
        }
        let kv = self.matmul("engram_kv", &ew.kv, e);
        let out = self
            .r
            .tokens_f32("engram_hc_state", cfg.hc_count * cfg.n_embd);
        self.r.op(Op::V41(V41Op::EngramGate(EngramGate {
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

    // Not shared with V4's: KV and top-k come from source layers (LayerRole), not each layer's own.
    fn attention(
        &mut self,
        l: usize,
        w: &V41LayerWeights,
        kv_layout: &V41KvLayout,
        x: ValueId,
    ) -> ValueId {
        let cfg = self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.n_head);
        let st = &kv_layout.layers[l];
        let xn = self.rms_norm("attn_norm", x, cfg.n_embd, Some(&w.attn_norm));
        let qa = self.matmul("q_a", &w.attn_q_a, xn);
        let qr = self.rms_norm("q_a_norm", qa, cfg.q_lora_rank, Some(&w.attn_q_a_norm));
        let q = self.matmul("q", &w.attn_q_b, qr); // no per-head norm in V4.1
        let q = self.rope("q_rope", q, nh, hd, l, false);
        let kv = self.matmul("kv_proj", &w.attn_kv, xn);
        let kv = self.rms_norm("kv_norm", kv, hd, Some(&w.attn_kv_a_norm));
        let kv = self.rope("kv_rope", kv, 1, hd, l, false);

        let role = w.role;
        let ratio = role.ratio();
        if let (Some(cw), Some(rows), Some(index_rows)) = (&w.compressor, st.rows, st.index_rows) {
            let ck = self.matmul("comp_kv", &cw.kv, xn);
            let cg = cw.gate.as_ref().map(|g| self.matmul("comp_gate", g, xn));
            self.r.op(Op::V41(V41Op::Compress(V41Compress {
                kv: ck,
                gate: cg,
                norm: cw.norm.clone(),
                index_wk: cw.index_k.clone(),
                index_norm: cw.index_k_norm.clone(),
                frontier: st.frontier,
                rows,
                index_rows,
                ratio,
                head_dim: hd,
                index_head_dim: cfg.indexer_head_dim,
                rope: cfg.rope(l),
                eps: cfg.rms_eps,
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
            let qi = self.matmul("index_q", &iw.q_b, qr);
            let qi = self.rope("index_q_rope", qi, ih, ihd, l, false);
            let wi = self.matmul("index_weights_raw", &iw.proj, xn);
            let wis = self.r.tokens_f32("index_weights", ih);
            self.r.op(Op::Scale(Scale {
                x: wi,
                out: wis,
                factor: 1.0 / ((ihd * ih) as f32).sqrt(),
                cols: self.r.value(wis).cols,
            }));
            let sel = self.r.tokens_i32("index_selected", cfg.indexer_top_k);
            match self.blocks {
                Some(blocks) if cfg.uses_candidates(l) => {
                    self.r.op(Op::V41(V41Op::CandidateTopK(CandidateTopK {
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
                _ => self.r.op(Op::IndexerTopK(IndexerTopK {
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
                let blocks = self
                    .r
                    .tokens_i32("candidate_blocks", cfg.candidate_topk_blocks);
                self.r.op(Op::V41(V41Op::CandidateBlocks(CandidateBlocks {
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
                self.blocks = Some(blocks);
            }
            selected = Some(sel);
        } else if let LayerRole::Reuse { index_source, .. } = role {
            selected = self.topk[index_source];
        }
        self.topk[l] = selected;

        let o = self.r.tokens_f32("attn_heads", nh * hd);
        self.r.op(Op::Attention(Attention {
            q,
            kv,
            ring: st.ring,
            window: cfg.sliding_window,
            compressed: kv_source.map(|s| CompressedRows {
                rows: kv_layout.layers[s].rows.expect("a kv source has rows"),
                ratio,
            }),
            selected,
            top_k: cfg.indexer_top_k,
            sinks: w.attn_sinks.clone(),
            n_head: nh,
            head_dim: hd,
            out: o,
        }));
        self.r.op(Op::RingWrite(RingWrite {
            kv,
            ring: st.ring,
            window: cfg.sliding_window,
            dim: hd,
        }));
        let o = self.rope("attn_heads_unrope", o, nh, hd, l, true);
        let low = self.grouped_matmul("attn_low", &w.attn_output_a, o, cfg.o_groups);
        self.matmul("attn_out", &w.attn_output_b, low)
    }

    fn moe(&mut self, w: &V41LayerWeights, x: ValueId) -> ValueId {
        let cfg = self.cfg;
        // Same sublayer as V4; V4.1 has no hash routing, always a bias and a shared expert.
        let step = MoeStep {
            eps: cfg.rms_eps,
            n_embd: cfg.n_embd,
            n_expert: cfg.n_expert,
            k: cfg.n_expert_used,
            scale: cfg.routed_scale,
            normalize: cfg.norm_topk_prob && cfg.n_expert_used > 1,
            clamp: cfg.swiglu_limit,
            tokens: self.tokens,
            ffn_norm: &w.ffn_norm,
            gate_inp: &w.ffn_gate_inp,
            bias: Some(&w.exp_probs_b),
            tid2eid: None,
            exps: [&w.ffn_gate_exps, &w.ffn_up_exps, &w.ffn_down_exps],
            shared: Some([&w.ffn_gate_shexp, &w.ffn_up_shexp, &w.ffn_down_shexp]),
        };
        record_moe(&mut self.r, &step, x)
    }
}

/// Records the V4.1 forward pass for steps of up to `max_tokens` tokens.
pub fn record(
    cfg: &V41Config,
    w: &V41Weights,
    kv: &V41KvLayout,
    max_tokens: usize,
    opts: &V41ForwardOptions,
) -> Graph {
    let mut r = Recorder::new(max_tokens);
    let tokens = r.tokens_i32("tokens", 1);
    let mut c = Ctx {
        r,
        cfg,
        tokens,
        topk: vec![None; cfg.n_layer],
        blocks: None,
        hashed: None,
        inputs: Vec::new(),
    };
    let (n, d) = (cfg.hc_count, cfg.n_embd);
    let eg = &cfg.engram;

    // Engram rows depend on the ids alone: hashed once, before any layer.
    if !opts.engram_from_host {
        let rows =
            c.r.tokens_i32("engram_hash", eg.layer_ids.len() * eg.cols());
        c.r.op(Op::V41(V41Op::EngramHash(EngramHash {
            tokens,
            history: kv.engram_history,
            layout: Arc::new(eg.hash_layout()),
            out: rows,
        })));
        c.hashed = Some(rows);
    }
    let e = c.r.tokens_f32("embed", d);
    c.r.op(Op::Embed(Embed {
        table: w.token_embd.clone(),
        tokens,
        out: e,
    }));
    let mut state = c.r.tokens_f32("hc_state", n * d);
    c.r.op(Op::HcInit(HcInit {
        x: e,
        out: state,
        n_hc: n,
        dim: d,
    }));
    let mut pre_mix = c.r.tokens_f32("hc_pre0", n);
    c.r.op(Op::V41(V41Op::HcOneHot(HcOneHot {
        out: pre_mix,
        n_hc: n,
    })));

    for (l, lw) in w.layers.iter().enumerate() {
        c.r.set_layer(Some(l));
        state = c.engram(l, lw, state);
        let (a_pre, a_post, a_comb) = c.mixes(
            "attn",
            state,
            &lw.hc_attn_fn,
            &lw.hc_attn_scale,
            &lw.hc_attn_base,
        );
        let x = c.collapse("attn_in", state, pre_mix);
        let y = c.attention(l, lw, kv, x);
        state = c.expand("attn", state, y, a_post, a_comb);
        let (f_pre, f_post, f_comb) = c.mixes(
            "ffn",
            state,
            &lw.hc_ffn_fn,
            &lw.hc_ffn_scale,
            &lw.hc_ffn_base,
        );
        let x = c.collapse("ffn_in", state, a_pre);
        let y = c.moe(lw, x);
        state = c.expand("ffn", state, y, f_post, f_comb);
        pre_mix = f_pre;
        c.r.flush();
    }
    c.r.set_layer(None);

    // No learned output head mix in V4.1: the last FFN mix collapses.
    let x = c.collapse("out_in", state, pre_mix);
    let head = HeadStep {
        eps: cfg.rms_eps,
        n_embd: d,
        n_vocab: cfg.n_vocab,
        output_norm: &w.output_norm,
        output: &w.output,
        logits: opts.logits,
    };
    let logits = record_head(&mut c.r, &head, x);
    let inputs = std::mem::take(&mut c.inputs);
    finish_graph(c.r, tokens, logits, inputs, &opts.keep)
}
