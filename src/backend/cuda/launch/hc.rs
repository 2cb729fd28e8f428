//! cuda/hc.cu: the hyper-connection stream ops, one thread per output
//! value, grid-stride.

use super::{launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::hc::{HcCollapse, HcExpand, HcInit, HcOneHot};

pub fn hc_init(cx: &mut Cx, o: &HcInit) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.items()));
    launch!(cx, Entry::HcInit, grid, THREADS, 0; o.x, o.out, o.n_hc, o.dim)
}

pub fn hc_collapse(cx: &mut Cx, o: &HcCollapse) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.items()));
    launch!(cx, Entry::HcCollapse, grid, THREADS, 0; o.state, o.pre, o.out, o.n_hc, o.dim)
}

pub fn hc_expand(cx: &mut Cx, o: &HcExpand) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.items()));
    launch!(cx, Entry::HcExpand, grid, THREADS, 0;
        o.state, o.y, o.post, o.comb, o.out, o.n_hc, o.dim)
}

/// Lagged hyper-connections' first collapse: grid-stride over the live
/// rows' n_hc values.
pub fn hc_one_hot(cx: &mut Cx, o: &HcOneHot) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.n_hc));
    launch!(cx, Entry::HcOneHot, grid, THREADS, 0; o.out, o.n_hc)
}
