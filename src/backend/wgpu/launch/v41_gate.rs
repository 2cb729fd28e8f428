//! shaders/v41_gate.wgsl: DeepSeek V4.1's stream ops.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::V41GateParams;
use super::{groups_per_token, per_token, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::v41::{EngramGate, HcOneHot};

/// state, kv, q weight, k weight, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, R, R, W]);

/// One thread per value.
pub fn hc_one_hot(cx: &mut Cx, o: &HcOneHot) -> Result<Vec<Work>, BackendError> {
    let p = V41GateParams {
        n_hc: o.n_hc as u32,
        ..Default::default()
    };
    let d = cx.dummy();
    let s = [d.clone(), d.clone(), d.clone(), d, cx.val(o.out)];
    cx.one(Entry::V41HcOneHot, &p, &s, per_token(o.n_hc))
}

/// One workgroup per (token, stream).
pub fn engram_gate(cx: &mut Cx, o: &EngramGate) -> Result<Vec<Work>, BackendError> {
    let p = V41GateParams {
        n_hc: o.n_hc as u32,
        dim: o.dim as u32,
        eps: o.eps,
        _pad0: 0,
    };
    let s = [
        cx.val(o.state),
        cx.val(o.kv),
        cx.small(&o.q_weight)?,
        cx.small(&o.k_weight)?,
        cx.val(o.out),
    ];
    cx.one(Entry::V41EngramGate, &p, &s, groups_per_token(o.n_hc))
}
