//! shaders/hc_mix.wgsl: `hc_mix`, one workgroup per token.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::HcMixParams;
use super::{groups_per_token, supported, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::hc::HcMix;

/// logits, scale, base, pre, post, comb.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, R, W, W, W]);

/// Most hyper-connection streams the kernel holds.
const MAX_HC: usize = 8;

pub fn hc_mix(cx: &mut Cx, o: &HcMix) -> Result<Vec<Work>, BackendError> {
    let n_hc = o.n_hc;
    supported(n_hc <= MAX_HC, || {
        format!("{n_hc} HC streams (at most {MAX_HC})")
    })?;
    let p = HcMixParams {
        n_hc: o.n_hc as u32,
        mix_dim: o.mix_dim() as u32,
        sinkhorn_iters: o.sinkhorn_iters as u32,
        has_post: o.post.is_some() as u32,
        eps: o.eps,
        ..Default::default()
    };
    // Absent outputs get distinct write dummies.
    let post = o.post.map_or_else(|| cx.dummy_write(0), |v| cx.val(v));
    let comb = o.comb.map_or_else(|| cx.dummy_write(1), |v| cx.val(v));
    let s = [
        cx.val(o.logits),
        cx.small(&o.scale)?,
        cx.small(&o.base)?,
        cx.val(o.pre),
        post,
        comb,
    ];
    cx.one(Entry::HcMix, &p, &s, groups_per_token(1))
}
