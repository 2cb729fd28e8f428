//! cuda/embed.cu: `embed_<type>`, one thread per 32-value unit of the live
//! rows (per value when the width is not whole units).

use super::{launch, per_token, unsupported, Cx, Grid, THREADS};
use crate::backend::cuda::kernels::Kernel;
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::basic::Embed;

pub fn embed(cx: &mut Cx, o: &Embed) -> Result<(), BackendError> {
    let kernel = Kernel::typed(Entry::Embed, o.table.ty);
    kernel.name().map_err(unsupported)?;
    let d = o.dim();
    let items = if d % 32 == 0 { d / 32 } else { d };
    let table = cx.tensor(&o.table)?;
    let grid = Grid::Threads(per_token(items));
    launch!(cx, kernel, grid, THREADS, 0; table, o.table.row_bytes(), d, o.tokens, o.out)
}
