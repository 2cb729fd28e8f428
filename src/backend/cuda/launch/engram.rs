//! cuda/engram.cu: DeepSeek V4.1's Engram gate.

use super::{fixed, launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::engram::EngramGate;

/// One block per (token, stream).
pub fn engram_gate(cx: &mut Cx, o: &EngramGate) -> Result<(), BackendError> {
    let qw = cx.small(&o.q_weight)?;
    let kw = cx.small(&o.k_weight)?;
    let grid = Grid::Blocks(per_token(o.n_hc), fixed(1));
    launch!(cx, Entry::EngramGate, grid, THREADS, 0;
        o.state, o.kv, qw, kw, o.out, o.n_hc, o.dim, o.eps)
}
