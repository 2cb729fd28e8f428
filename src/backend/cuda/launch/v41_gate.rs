//! cuda/v41_gate.cu: DeepSeek V4.1's stream ops.

use super::{fixed, launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::v41::{EngramGate, HcOneHot};

/// Grid-stride over the live rows' n_hc values.
pub fn hc_one_hot(cx: &mut Cx, o: &HcOneHot) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.n_hc));
    launch!(cx, Entry::V41HcOneHot, grid, THREADS, 0; o.out, o.n_hc)
}

/// One block per (token, stream).
pub fn engram_gate(cx: &mut Cx, o: &EngramGate) -> Result<(), BackendError> {
    let qw = cx.small(&o.q_weight)?;
    let kw = cx.small(&o.k_weight)?;
    let grid = Grid::Blocks(per_token(o.n_hc), fixed(1));
    launch!(cx, Entry::V41EngramGate, grid, THREADS, 0;
        o.state, o.kv, qw, kw, o.out, o.n_hc, o.dim, o.eps)
}
