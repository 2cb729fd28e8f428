//! cuda/ring.cu: `ring_write`, the last `window` rows of the step into the
//! session's ring, one thread per value.

use super::{launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::attention::RingWrite;

pub fn ring_write(cx: &mut Cx, o: &RingWrite) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.dim));
    launch!(cx, Entry::RingWrite, grid, THREADS, 0; o.kv, o.ring, o.window, o.dim)
}
