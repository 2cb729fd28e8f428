//! shaders/engram.wgsl: DeepSeek V4.1's Engram gate.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::EngramParams;
use super::{groups_per_token, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::engram::EngramGate;

/// state, kv, q weight, k weight, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, R, R, W]);

/// One workgroup per (token, stream).
pub fn engram_gate(cx: &mut Cx, o: &EngramGate) -> Result<Vec<Work>, BackendError> {
    let p = EngramParams {
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
    cx.one(Entry::EngramGate, &p, &s, groups_per_token(o.n_hc))
}
