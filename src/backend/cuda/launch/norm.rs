//! cuda/norm.cu: `rms_norm`, one block per norm row.

use super::{fixed, launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::norm::RmsNorm;

pub fn rms_norm(cx: &mut Cx, o: &RmsNorm) -> Result<(), BackendError> {
    let w = cx.small_opt(&o.weight)?;
    let rows = match o.rows.fixed_only() {
        None => per_token(o.rows.per_token),
        Some(_) => fixed(o.rows.fixed),
    };
    let grid = Grid::Blocks(rows, fixed(1));
    let (per_token_rows, fixed_rows) = (o.rows.per_token, o.rows.fixed);
    launch!(cx, Entry::RmsNorm, grid, THREADS, 0;
        o.x, w, o.out, o.dim, o.eps, per_token_rows, fixed_rows)
}
