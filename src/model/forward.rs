//! The DeepSeek V4 forward pass, written once as a recorded graph.
//!
//! Reads top to bottom like MODEL.md §3: embedding → per layer (HC collapse →
//! attention with compressor and indexer → HC expand → HC collapse → MoE with
//! shared expert → HC expand) → output HC collapse → norm → head. Shapes in
//! comments are per token; `T` is the step's token count.

use super::state::{KvLayout, LayerState};
use super::{ModelConfig, Weights};
use crate::gguf::TensorRef;
use crate::graph::ops::attention::{Attention, CompressedRows, RingWrite};
use crate::graph::ops::basic::{Add, Embed, Scale, TakeLast};
use crate::graph::ops::compress::{Compress, RowRounding};
use crate::graph::ops::gather::GatherLast;
use crate::graph::ops::hc::{HcCollapse, HcExpand, HcInit, HcMix};
use crate::graph::ops::indexer::IndexerTopK;
use crate::graph::ops::matmul::MatMul;
use crate::graph::ops::moe::{MoeExperts, Router, SwiGlu};
use crate::graph::ops::norm::RmsNorm;
use crate::graph::ops::rope::{Rope, RopeConfig};
use crate::graph::ops::round::{HadamardFp4, KvRound};
use crate::graph::ops::{Op, Rows};
use crate::graph::{Graph, Recorder, ValueId, ValueName};

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

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token of the step (generation).
    Last,
    /// Every token of the step (validation, perplexity).
    All,
    /// The last row of each session's piece, in row `state` of a fixed
    /// value of `n` rows (a step of up to `n` sessions, issue 18): a
    /// prefill piece pays the vocabulary projection once, not per row.
    LastPerState(usize),
}

#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub numerics: Numerics,
    pub logits: Logits,
    /// Values to keep readable after a step (`--dump NAME@LAYER`).
    pub keep: Vec<ValueName>,
}

struct Ctx<'a> {
    r: Recorder,
    cfg: &'a ModelConfig,
    numerics: Numerics,
    tokens: ValueId,
}

impl Ctx<'_> {
    fn matmul(&mut self, name: &str, w: &TensorRef, x: ValueId) -> ValueId {
        record_matmul(&mut self.r, name, w, x, 1)
    }

    fn grouped_matmul(&mut self, name: &str, w: &TensorRef, x: ValueId, groups: usize) -> ValueId {
        record_matmul(&mut self.r, name, w, x, groups)
    }

    fn rms_norm(
        &mut self,
        name: &str,
        x: ValueId,
        dim: usize,
        weight: Option<&TensorRef>,
    ) -> ValueId {
        record_rms_norm(&mut self.r, self.cfg.rms_eps, name, x, dim, weight)
    }

    fn rope(
        &mut self,
        name: &str,
        x: ValueId,
        heads: usize,
        head_dim: usize,
        l: usize,
        inverse: bool,
    ) -> ValueId {
        record_rope(
            &mut self.r,
            self.cfg.rope(l),
            name,
            x,
            heads,
            head_dim,
            inverse,
        )
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

    /// HC collapse before a sublayer: returns (x, post, comb).
    fn hc_pre(
        &mut self,
        tag: &str,
        state: ValueId,
        f: &TensorRef,
        scale: &TensorRef,
        base: &TensorRef,
    ) -> (ValueId, ValueId, ValueId) {
        let hc = self.hc();
        let (pre, post, comb) = record_hc_mixes(&mut self.r, &hc, tag, state, [f, scale, base]);
        let x = record_hc_collapse(&mut self.r, &hc, &format!("{tag}_in"), state, pre); // D
        (x, post, comb)
    }

    /// HC expand after a sublayer: the new n·D state.
    fn hc_post(
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

    /// Attention sublayer (MODEL.md §3.4–3.6). Returns y (D).
    fn attention(
        &mut self,
        l: usize,
        w: &super::LayerWeights,
        st: &LayerState,
        x: ValueId,
    ) -> ValueId {
        let cfg = self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.n_head);
        let model = self.numerics == Numerics::Model;

        let xn = self.rms_norm("attn_norm", x, cfg.n_embd, Some(&w.attn_norm)); // D
        let qa = self.matmul("q_a", &w.attn_q_a, xn); // QL
        let qr = self.rms_norm("q_a_norm", qa, cfg.q_lora_rank, Some(&w.attn_q_a_norm)); // QL
        let q = self.matmul("q", &w.attn_q_b, qr); // H·HD
        let q = self.rms_norm("q_head_norm", q, hd, None); // H·HD, per-head RMS
        let q = self.rope("q_rope", q, nh, hd, l, false);
        let kv = self.matmul("kv_proj", &w.attn_kv, xn); // HD
        let kv = self.rms_norm("kv_norm", kv, hd, Some(&w.attn_kv_a_norm));
        let kv = self.rope("kv_rope", kv, 1, hd, l, false);
        let kv = if model {
            let out = self.r.tokens_f32("kv", hd);
            self.r.op(Op::KvRound(KvRound {
                x: kv,
                out,
                dim: hd,
                n_rot: cfg.n_rot,
                fp8: true,
                f16: true,
            }));
            out
        } else {
            kv
        };

        // Compressors run before attention: a row completed by token p is
        // visible to p itself.
        let ratio = w.kind.ratio();
        if let (Some(cw), Some(cs)) = (&w.compressor, &st.compressor) {
            let ck = self.matmul("comp_kv", &cw.kv, xn); // coff·HD
            let cg = self.matmul("comp_gate", &cw.gate, xn);
            self.r.op(Op::Compress(Compress {
                kv: ck,
                gate: cg,
                ape: cw.ape.clone(),
                norm: cw.norm.clone(),
                state_kv: cs.kv,
                state_score: cs.score,
                rows: cs.rows,
                ratio,
                head_dim: hd,
                overlapped: cw.overlapped,
                rope: cfg.rope(l),
                rounding: if model {
                    RowRounding::Fp8F16
                } else {
                    RowRounding::None
                },
                eps: cfg.rms_eps,
            }));
        }
        let mut selected = None;
        if let (Some(iw), Some(is)) = (&w.indexer, &st.indexer) {
            let (ih, ihd) = (cfg.indexer_heads, cfg.indexer_head_dim);
            let ik = self.matmul("index_comp_kv", &iw.compressor.kv, xn); // 2·IHD
            let ig = self.matmul("index_comp_gate", &iw.compressor.gate, xn);
            self.r.op(Op::Compress(Compress {
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
            let qi = self.matmul("index_q", &iw.q_b, qr); // IH·IHD
            let qi = self.rope("index_q_rope", qi, ih, ihd, l, false);
            let qi = if model {
                let out = self.r.tokens_f32("index_q_fp4", ih * ihd);
                self.r.op(Op::HadamardFp4(HadamardFp4 {
                    x: qi,
                    out,
                    cols: ih * ihd,
                    head_dim: ihd,
                }));
                out
            } else {
                qi
            };
            let wi = self.matmul("index_weights_raw", &iw.proj, xn); // IH
            let wi_scaled = self.r.tokens_f32("index_weights", ih);
            self.r.op(Op::Scale(Scale {
                x: wi,
                out: wi_scaled,
                factor: 1.0 / ((ihd * ih) as f32).sqrt(),
                cols: self.r.value(wi_scaled).cols,
            }));
            let sel = self.r.tokens_i32("index_selected", cfg.indexer_top_k);
            self.r.op(Op::IndexerTopK(IndexerTopK {
                q: qi,
                weights: wi_scaled,
                rows: is.rows,
                ratio,
                top_k: cfg.indexer_top_k,
                n_head: ih,
                head_dim: ihd,
                out: sel,
            }));
            selected = Some(sel);
        }

        let o = self.r.tokens_f32("attn_heads", nh * hd); // H·HD
        self.r.op(Op::Attention(Attention {
            q,
            kv,
            ring: st.ring,
            window: cfg.sliding_window,
            compressed: st.compressor.map(|c| CompressedRows {
                rows: c.rows,
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
        let low = self.grouped_matmul("attn_low", &w.attn_output_a, o, cfg.o_groups); // OG·OL
        self.matmul("attn_out", &w.attn_output_b, low) // D
    }

    /// FFN sublayer (MODEL.md §3.7–3.8). Returns y (D).
    fn moe(&mut self, l: usize, w: &super::LayerWeights, x: ValueId) -> ValueId {
        let cfg = self.cfg;
        let shared = match (&w.ffn_gate_shexp, &w.ffn_up_shexp, &w.ffn_down_shexp) {
            (Some(g), Some(u), Some(d)) => Some([g, u, d]),
            _ => None,
        };
        let step = MoeStep {
            eps: cfg.rms_eps,
            n_embd: cfg.n_embd,
            n_expert: cfg.n_expert,
            k: cfg.n_expert_used,
            scale: cfg.expert_weights_scale,
            normalize: cfg.expert_weights_norm,
            clamp: cfg.swiglu_clamp[l],
            tokens: self.tokens,
            ffn_norm: &w.ffn_norm,
            gate_inp: &w.ffn_gate_inp,
            bias: w.exp_probs_b.as_ref(),
            tid2eid: w.tid2eid.as_ref(),
            exps: [&w.ffn_gate_exps, &w.ffn_up_exps, &w.ffn_down_exps],
            shared,
        };
        record_moe(&mut self.r, &step, x)
    }
}

/// The hyper-connection sizes and constants (MODEL.md §3.3).
pub(crate) struct HcDims {
    pub n: usize,
    pub d: usize,
    pub sinkhorn_iters: usize,
    pub eps: f32,
    pub rms_eps: f32,
}

/// A sublayer's HC mixes from the whole n·D state; `fsb` = fn, scale, base.
/// Returns (pre, post, comb).
pub(crate) fn record_hc_mixes(
    r: &mut Recorder,
    hc: &HcDims,
    tag: &str,
    state: ValueId,
    fsb: [&TensorRef; 3],
) -> (ValueId, ValueId, ValueId) {
    let (n, d) = (hc.n, hc.d);
    let flat = record_rms_norm(r, hc.rms_eps, &format!("{tag}_hc_norm"), state, n * d, None); // n·D
    let logits = record_matmul(r, &format!("{tag}_hc_logits"), fsb[0], flat, 1); // (2+n)·n
    let pre = r.tokens_f32(&format!("{tag}_hc_pre"), n);
    let post = r.tokens_f32(&format!("{tag}_hc_post"), n);
    let comb = r.tokens_f32(&format!("{tag}_hc_comb"), n * n);
    r.op(Op::HcMix(HcMix {
        logits,
        scale: fsb[1].clone(),
        base: fsb[2].clone(),
        pre,
        post: Some(post),
        comb: Some(comb),
        n_hc: n,
        sinkhorn_iters: hc.sinkhorn_iters,
        eps: hc.eps,
    }));
    (pre, post, comb)
}

/// Collapses the n·D state to D with the `pre` weights.
pub(crate) fn record_hc_collapse(
    r: &mut Recorder,
    hc: &HcDims,
    name: &str,
    state: ValueId,
    pre: ValueId,
) -> ValueId {
    let out = r.tokens_f32(name, hc.d);
    r.op(Op::HcCollapse(HcCollapse {
        state,
        pre,
        out,
        n_hc: hc.n,
        dim: hc.d,
    }));
    out
}

/// Expands a sublayer's output `y` back into the n·D state.
pub(crate) fn record_hc_expand(
    r: &mut Recorder,
    hc: &HcDims,
    tag: &str,
    state: ValueId,
    y: ValueId,
    post: ValueId,
    comb: ValueId,
) -> ValueId {
    let out = r.tokens_f32(&format!("{tag}_hc_state"), hc.n * hc.d);
    r.op(Op::HcExpand(HcExpand {
        state,
        y,
        post,
        comb,
        out,
        n_hc: hc.n,
        dim: hc.d,
    }));
    out
}

/// `w · x` for every token (`groups` > 1: block-diagonal), out = `w.ne[1]`
/// columns. Shared by the V4 and V4.1 forwards.
pub(crate) fn record_matmul(
    r: &mut Recorder,
    name: &str,
    w: &TensorRef,
    x: ValueId,
    groups: usize,
) -> ValueId {
    let out = r.tokens_f32(name, w.ne[1] as usize);
    r.op(Op::MatMul(MatMul {
        w: w.clone(),
        x,
        out,
        groups,
        rows: Rows::value(r.value(out)),
    }));
    out
}

/// RMS norm of `x` in rows of `dim`, optionally weighted.
pub(crate) fn record_rms_norm(
    r: &mut Recorder,
    eps: f32,
    name: &str,
    x: ValueId,
    dim: usize,
    weight: Option<&TensorRef>,
) -> ValueId {
    let cols = r.value(x).cols;
    let out = r.tokens_f32(name, cols);
    r.op(Op::RmsNorm(RmsNorm {
        x,
        out,
        dim,
        weight: weight.cloned(),
        eps,
        rows: Rows::of(r.value(out), dim),
    }));
    out
}

/// RoPE (or its inverse) on `heads` heads of `head_dim`.
pub(crate) fn record_rope(
    r: &mut Recorder,
    rope: RopeConfig,
    name: &str,
    x: ValueId,
    heads: usize,
    head_dim: usize,
    inverse: bool,
) -> ValueId {
    let out = r.tokens_f32(name, heads * head_dim);
    r.op(Op::Rope(Rope {
        x,
        out,
        heads,
        head_dim,
        rope,
        inverse,
    }));
    out
}

/// What one MoE sublayer needs (MODEL.md §3.8); V4 and V4.1 differ only in
/// these values (V4.1 has no hash routing and always a shared expert).
pub(crate) struct MoeStep<'a> {
    pub eps: f32,
    pub n_embd: usize,
    pub n_expert: usize,
    pub k: usize,
    pub scale: f32,
    pub normalize: bool,
    pub clamp: f32,
    pub tokens: ValueId,
    pub ffn_norm: &'a TensorRef,
    pub gate_inp: &'a TensorRef,
    pub bias: Option<&'a TensorRef>,
    pub tid2eid: Option<&'a TensorRef>,
    /// Routed experts: gate, up, down.
    pub exps: [&'a TensorRef; 3],
    /// Shared expert: gate, up, down.
    pub shared: Option<[&'a TensorRef; 3]>,
}

/// MoE sublayer: norm → router → routed experts (+ shared expert). Returns y (D).
pub(crate) fn record_moe(r: &mut Recorder, s: &MoeStep, x: ValueId) -> ValueId {
    let xn = record_rms_norm(r, s.eps, "ffn_norm", x, s.n_embd, Some(s.ffn_norm)); // D
    let logits = record_matmul(r, "router_logits", s.gate_inp, xn, 1); // E
    let sel = r.tokens_i32("experts", s.k); // K
    let weights = r.tokens_f32("expert_weights", s.k);
    r.op(Op::Router(Router {
        logits,
        tokens: s.tokens,
        bias: s.bias.cloned(),
        tid2eid: s.tid2eid.cloned(),
        selected: sel,
        weights,
        n_expert: s.n_expert,
        k: s.k,
        scale: s.scale,
        normalize: s.normalize,
    }));
    let routed = r.tokens_f32("moe_routed", s.n_embd); // D
    r.op(Op::MoeExperts(MoeExperts {
        x: xn,
        selected: sel,
        weights,
        gate: s.exps[0].clone(),
        up: s.exps[1].clone(),
        down: s.exps[2].clone(),
        clamp: s.clamp,
        k: s.k,
        out: routed,
    }));
    let Some([sg, su, sd]) = s.shared else {
        return routed;
    };
    let g = record_matmul(r, "shared_gate", sg, xn, 1); // FF
    let u = record_matmul(r, "shared_up", su, xn, 1);
    let h = r.tokens_f32("shared_h", sg.ne[1] as usize);
    r.op(Op::SwiGlu(SwiGlu {
        gate: g,
        up: u,
        out: h,
        clamp: s.clamp,
        cols: r.value(h).cols,
    }));
    let shared = record_matmul(r, "shared_out", sd, h, 1); // D
    let y = r.tokens_f32("ffn_out", s.n_embd);
    r.op(Op::Add(Add {
        a: routed,
        b: shared,
        out: y,
        cols: r.value(y).cols,
    }));
    y
}

/// What the output head needs after the final HC collapse.
pub(crate) struct HeadStep<'a> {
    pub eps: f32,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub output_norm: &'a TensorRef,
    pub output: &'a TensorRef,
    pub logits: Logits,
}

/// Output norm and projection of the collapsed `x` (D) to logits.
pub(crate) fn record_head(r: &mut Recorder, s: &HeadStep, x: ValueId) -> ValueId {
    let d = s.n_embd;
    match s.logits {
        Logits::All => {
            let xn = record_rms_norm(r, s.eps, "out_norm", x, d, Some(s.output_norm));
            record_matmul(r, "logits", s.output, xn, 1)
        }
        Logits::Last | Logits::LastPerState(_) => {
            let rows = match s.logits {
                Logits::LastPerState(n) => n.max(1),
                _ => 1,
            };
            let last = r.fixed_f32("out_last", rows, d);
            r.op(match s.logits {
                Logits::LastPerState(_) => Op::GatherLast(GatherLast {
                    x,
                    out: last,
                    cols: d,
                    states: rows,
                }),
                _ => Op::TakeLast(TakeLast {
                    x,
                    out: last,
                    cols: d,
                }),
            });
            let xn = r.fixed_f32("out_norm", rows, d);
            r.op(Op::RmsNorm(RmsNorm {
                x: last,
                out: xn,
                dim: d,
                weight: Some(s.output_norm.clone()),
                eps: s.eps,
                rows: Rows::of(r.value(xn), d),
            }));
            let logits = r.fixed_f32("logits", rows, s.n_vocab);
            r.op(Op::MatMul(MatMul {
                w: s.output.clone(),
                x: xn,
                out: logits,
                groups: 1,
                rows: Rows::value(r.value(logits)),
            }));
            logits
        }
    }
}

/// Ends the recording and marks the `keep` values readable.
pub(crate) fn finish_graph(
    r: Recorder,
    tokens: ValueId,
    logits: ValueId,
    inputs: Vec<ValueId>,
    keep: &[ValueName],
) -> Graph {
    let mut g = r.finish(tokens, logits, inputs);
    let keep: Vec<ValueId> = keep.iter().filter_map(|n| g.find(n)).collect();
    g.keep.extend(keep);
    g.keep.sort();
    g.keep.dedup();
    g
}

/// Records the whole forward pass for steps of up to `max_tokens` tokens.
pub fn record(
    cfg: &ModelConfig,
    w: &Weights,
    kv: &KvLayout,
    max_tokens: usize,
    opts: &ForwardOptions,
) -> Graph {
    let mut r = Recorder::new(max_tokens);
    let tokens = r.tokens_i32("tokens", 1);
    let mut c = Ctx {
        r,
        cfg,
        numerics: opts.numerics,
        tokens,
    };
    let (n, d) = (cfg.hc_count, cfg.n_embd);

    let e = c.r.tokens_f32("embed", d); // D
    c.r.op(Op::Embed(Embed {
        table: w.token_embd.clone(),
        tokens,
        out: e,
    }));
    let mut state = c.r.tokens_f32("hc_state", n * d); // n·D
    c.r.op(Op::HcInit(HcInit {
        x: e,
        out: state,
        n_hc: n,
        dim: d,
    }));

    for (l, (lw, st)) in w.layers.iter().zip(&kv.layers).enumerate() {
        c.r.set_layer(Some(l));
        let (x, post, comb) = c.hc_pre(
            "attn",
            state,
            &lw.hc_attn_fn,
            &lw.hc_attn_scale,
            &lw.hc_attn_base,
        );
        let y = c.attention(l, lw, st, x);
        state = c.hc_post("attn", state, y, post, comb);
        let (x, post, comb) = c.hc_pre(
            "ffn",
            state,
            &lw.hc_ffn_fn,
            &lw.hc_ffn_scale,
            &lw.hc_ffn_base,
        );
        let y = c.moe(l, lw, x);
        state = c.hc_post("ffn", state, y, post, comb);
        c.r.flush();
    }
    c.r.set_layer(None);

    // Output head (MODEL.md §3.10): collapse with `pre` only, norm, project.
    let flat = c.rms_norm("out_hc_norm", state, n * d, None);
    let m = c.matmul("out_hc_logits", &w.output_hc_fn, flat); // n
    let pre = c.r.tokens_f32("out_hc_pre", n);
    c.r.op(Op::HcMix(HcMix {
        logits: m,
        scale: w.output_hc_scale.clone(),
        base: w.output_hc_base.clone(),
        pre,
        post: None,
        comb: None,
        n_hc: n,
        sinkhorn_iters: cfg.hc_sinkhorn_iters,
        eps: cfg.hc_eps,
    }));
    let hc = c.hc();
    let x = record_hc_collapse(&mut c.r, &hc, "out_in", state, pre);
    let head = HeadStep {
        eps: cfg.rms_eps,
        n_embd: d,
        n_vocab: cfg.n_vocab,
        output_norm: &w.output_norm,
        output: &w.output,
        logits: opts.logits,
    };
    let logits = record_head(&mut c.r, &head, x);
    finish_graph(c.r, tokens, logits, Vec::new(), &opts.keep)
}
