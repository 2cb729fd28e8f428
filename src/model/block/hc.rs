//! Hyper-connections (MODEL.md §3.3): the n·D state is collapsed to D
//! before each sublayer with a `pre` mix and expanded after it with `post`
//! and `comb`. The mixes come from the whole state; which mix collapses a
//! sublayer is the family's choice (V4: the sublayer's own, V4.1: the mix
//! computed one sublayer earlier).

use super::Builder;
use crate::gguf::TensorRef;
use crate::graph::ops::hc::{HcCollapse, HcExpand, HcMix};
use crate::graph::ops::Op;
use crate::graph::ValueId;
use crate::model::weights::HcMixWeights;

/// One sublayer's mixes: `pre` (n), `post` (n), `comb` (n·n).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mixes {
    pub pre: ValueId,
    pub post: ValueId,
    pub comb: ValueId,
}

impl Builder<'_> {
    /// The mixes of sublayer `tag` from the whole n·D state.
    pub fn hc_mixes(&mut self, tag: &str, state: ValueId, w: &HcMixWeights) -> Mixes {
        let logits = self.hc_logits(tag, state, &w.func); // (2+n)·n
        let n = self.cfg.hc_count;
        let pre = self.r.tokens_f32(&format!("{tag}_hc_pre"), n);
        let post = self.r.tokens_f32(&format!("{tag}_hc_post"), n);
        let comb = self.r.tokens_f32(&format!("{tag}_hc_comb"), n * n);
        self.hc_mix(logits, &w.scale, &w.base, pre, Some(post), Some(comb));
        Mixes { pre, post, comb }
    }

    /// The output head's `pre` mix (V4: no post, no comb).
    pub fn hc_head_mix(
        &mut self,
        tag: &str,
        state: ValueId,
        func: &TensorRef,
        scale: &TensorRef,
        base: &TensorRef,
    ) -> ValueId {
        let logits = self.hc_logits(tag, state, func); // n
        let pre = self
            .r
            .tokens_f32(&format!("{tag}_hc_pre"), self.cfg.hc_count);
        self.hc_mix(logits, scale, base, pre, None, None);
        pre
    }

    /// The mixer's raw logits from the RMS-normed flat state.
    fn hc_logits(&mut self, tag: &str, state: ValueId, func: &TensorRef) -> ValueId {
        let nd = self.cfg.hc_count * self.cfg.n_embd;
        let flat = self.rms_norm(&format!("{tag}_hc_norm"), state, nd, None); // n·D
        self.matmul(&format!("{tag}_hc_logits"), func, flat)
    }

    fn hc_mix(
        &mut self,
        logits: ValueId,
        scale: &TensorRef,
        base: &TensorRef,
        pre: ValueId,
        post: Option<ValueId>,
        comb: Option<ValueId>,
    ) {
        self.r.op(Op::HcMix(HcMix {
            logits,
            scale: scale.clone(),
            base: base.clone(),
            pre,
            post,
            comb,
            n_hc: self.cfg.hc_count,
            sinkhorn_iters: self.cfg.hc_sinkhorn_iters,
            eps: self.cfg.hc_eps,
        }));
    }

    /// Collapses the n·D state to D with the `pre` weights.
    pub fn hc_collapse(&mut self, name: &str, state: ValueId, pre: ValueId) -> ValueId {
        let (n, d) = (self.cfg.hc_count, self.cfg.n_embd);
        let out = self.r.tokens_f32(name, d);
        self.r.op(Op::HcCollapse(HcCollapse {
            state,
            pre,
            out,
            n_hc: n,
            dim: d,
        }));
        out
    }

    /// Expands a sublayer's output `y` back into the n·D state.
    pub fn hc_expand(&mut self, tag: &str, state: ValueId, y: ValueId, m: &Mixes) -> ValueId {
        let (n, d) = (self.cfg.hc_count, self.cfg.n_embd);
        let out = self.r.tokens_f32(&format!("{tag}_hc_state"), n * d);
        self.r.op(Op::HcExpand(HcExpand {
            state,
            y,
            post: m.post,
            comb: m.comb,
            out,
            n_hc: n,
            dim: d,
        }));
        out
    }
}
