//! cuda/rope.cu: `rope`, one thread per value of the live rows.

use super::{launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::rope::Rope;

pub fn rope(cx: &mut Cx, o: &Rope) -> Result<(), BackendError> {
    let f = cx.freqs(&o.rope)?;
    let grid = Grid::Threads(per_token(o.items()));
    launch!(cx, Entry::Rope, grid, THREADS, 0;
        o.x, o.out, f, o.rope.n_rot / 2, o.heads, o.head_dim, o.inverse)
}
