//! cuda/gather.cu: `gather_last`, each session's last row, one thread per
//! value.

use super::{fixed, launch, Cx, Dev, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::gather::GatherLast;

/// One state set: every row is state 0 (a null row-state array); several:
/// the step's row states, uploaded by `run_step`.
pub fn gather_last(cx: &mut Cx, o: &GatherLast) -> Result<(), BackendError> {
    let grid = Grid::Threads(fixed(o.states * o.cols));
    let row_states = Dev(cx.row_states);
    launch!(cx, Entry::GatherLast, grid, THREADS, 0; o.x, o.out, row_states, o.cols, o.states)
}
