//! cuda/hc_mix.cu: `hc_mix`, one thread per token (Sinkhorn in registers).

use super::{fixed, launch, per_tokens, supported, Cx, Grid};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::hc::HcMix;

/// Most hyper-connection streams the kernel holds in registers.
const MAX_HC: usize = 8;

pub fn hc_mix(cx: &mut Cx, o: &HcMix) -> Result<(), BackendError> {
    let scale = cx.small(&o.scale)?;
    let base = cx.small(&o.base)?;
    let n_hc = o.n_hc;
    supported(n_hc <= MAX_HC, || {
        format!("{n_hc} hyper-connection streams (at most {MAX_HC})")
    })?;
    let grid = Grid::Blocks(per_tokens(64), fixed(1));
    launch!(cx, Entry::HcMix, grid, 64, 0;
        o.logits, scale, base, o.pre, o.post, o.comb, o.n_hc, o.mix_dim(), o.sinkhorn_iters, o.eps)
}
