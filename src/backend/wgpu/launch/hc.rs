//! shaders/hc.wgsl: the hyper-connection stream ops, one thread per output
//! value.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::HcParams;
use super::{per_token, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::{Size, Work};
use crate::backend::BackendError;
use crate::graph::ops::hc::{HcCollapse, HcExpand, HcInit, HcOneHot};

/// state, y, pre or post, comb, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, R, R, W]);

/// The parameters and the dispatch size (one thread per output value,
/// `per_token` values per token).
fn params(n_hc: usize, dim: usize, per_token_values: usize) -> (HcParams, Size) {
    let p = HcParams {
        n_hc: n_hc as u32,
        dim: dim as u32,
        ..Default::default()
    };
    (p, per_token(per_token_values))
}

/// x is bound as `y` (one row per token).
pub fn hc_init(cx: &mut Cx, o: &HcInit) -> Result<Vec<Work>, BackendError> {
    let (p, size) = params(o.n_hc, o.dim, o.items());
    let d = cx.dummy();
    let s = [d.clone(), cx.val(o.x), d.clone(), d, cx.val(o.out)];
    cx.one(Entry::HcInit, &p, &s, size)
}

pub fn hc_collapse(cx: &mut Cx, o: &HcCollapse) -> Result<Vec<Work>, BackendError> {
    let (p, size) = params(o.n_hc, o.dim, o.items());
    let d = cx.dummy();
    let s = [cx.val(o.state), d.clone(), cx.val(o.pre), d, cx.val(o.out)];
    cx.one(Entry::HcCollapse, &p, &s, size)
}

pub fn hc_expand(cx: &mut Cx, o: &HcExpand) -> Result<Vec<Work>, BackendError> {
    let (p, size) = params(o.n_hc, o.dim, o.items());
    let s = [
        cx.val(o.state),
        cx.val(o.y),
        cx.val(o.post),
        cx.val(o.comb),
        cx.val(o.out),
    ];
    cx.one(Entry::HcExpand, &p, &s, size)
}

/// Lagged hyper-connections' first collapse: `[1, 0, …]` per token.
pub fn hc_one_hot(cx: &mut Cx, o: &HcOneHot) -> Result<Vec<Work>, BackendError> {
    let (p, size) = params(o.n_hc, 0, o.n_hc);
    let d = cx.dummy();
    let s = [d.clone(), d.clone(), d.clone(), d, cx.val(o.out)];
    cx.one(Entry::HcOneHot, &p, &s, size)
}
