//! The MoE sublayer (MODEL.md §3.7–3.8): norm → router → routed experts,
//! plus the shared expert where the layer has one. Both families record it
//! the same way; V4 adds hash routing on its first layers (the router's
//! `tid2eid` table), V4.1 always has a router bias and a shared expert.

use super::Builder;
use crate::graph::ops::basic::Add;
use crate::graph::ops::moe::{MoeExperts, Router, SwiGlu};
use crate::graph::ops::Op;
use crate::graph::ValueId;
use crate::model::weights::MoeWeights;

impl Builder<'_> {
    /// The MoE sublayer of layer `l` on the collapsed `x` (D): top-k
    /// weights renormalised when `normalize`; under `act_fp8` (V4.1 model
    /// numerics) the experts' w1/w3 inputs and the shared expert's w2 input
    /// go through the FP8 round trip, while the router reads the plain norm
    /// output; `mid_fp8` rounds the routed experts' weighted w2 inputs the
    /// same way. Returns y (D).
    pub fn moe(
        &mut self,
        l: usize,
        w: &MoeWeights,
        x: ValueId,
        normalize: bool,
        act_fp8: bool,
        mid_fp8: bool,
    ) -> ValueId {
        let cfg = self.cfg;
        let (d, k) = (cfg.n_embd, cfg.n_expert_used);
        let clamp = cfg.swiglu_clamp[l];
        let xn = self.rms_norm("ffn_norm", x, d, Some(&w.norm)); // D
        let logits = self.matmul("router_logits", &w.gate_inp, xn); // E
        let sel = self.r.tokens_i32("experts", k); // K
        let weights = self.r.tokens_f32("expert_weights", k);
        self.r.op(Op::Router(Router {
            logits,
            tokens: self.tokens,
            bias: w.bias.clone(),
            tid2eid: w.tid2eid.clone(),
            selected: sel,
            weights,
            n_expert: cfg.n_expert,
            k,
            scale: cfg.expert_weights_scale,
            normalize,
        }));
        let xq = self.gemm_input("ffn_norm_fp8", xn, act_fp8);
        let routed = self.r.tokens_f32("moe_routed", d); // D
        self.r.op(Op::MoeExperts(MoeExperts {
            x: xq,
            selected: sel,
            weights,
            gate: w.gate_exps.clone(),
            up: w.up_exps.clone(),
            down: w.down_exps.clone(),
            clamp,
            k,
            out: routed,
            mid_fp8,
        }));
        let Some(sh) = &w.shared else {
            return routed;
        };
        let g = self.matmul("shared_gate", &sh.gate, xq); // FF
        let u = self.matmul("shared_up", &sh.up, xq);
        let h = self.r.tokens_f32("shared_h", sh.gate.ne[1] as usize);
        self.r.op(Op::SwiGlu(SwiGlu {
            gate: g,
            up: u,
            out: h,
            clamp,
            cols: self.r.value(h).cols,
        }));
        let h = self.gemm_input("shared_h_fp8", h, act_fp8);
        let shared = self.matmul("shared_out", &sh.down, h); // D
        let y = self.r.tokens_f32("ffn_out", d);
        self.r.op(Op::Add(Add {
            a: routed,
            b: shared,
            out: y,
            cols: self.r.value(y).cols,
        }));
        y
    }
}
