//! cuda/router.cu: `router`, one block per token.

use super::{fixed, launch, per_token, supported, Cx, Dev, Grid};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::moe::Router;

/// Most experts the kernel ranks.
const MAX_EXPERTS: usize = 1024;

pub fn router(cx: &mut Cx, o: &Router) -> Result<(), BackendError> {
    let n = o.n_expert;
    supported(n <= MAX_EXPERTS, || {
        format!("router over {n} experts (at most {MAX_EXPERTS})")
    })?;
    let bias = cx.small_opt(&o.bias)?;
    let table = match &o.tid2eid {
        Some(t) => cx.tensor(t)?,
        None => Dev::NULL,
    };
    let grid = Grid::Blocks(per_token(1), fixed(1));
    launch!(cx, Entry::Router, grid, 256, 0;
        o.logits, o.tokens, bias, table, o.table_cols(), o.selected, o.weights,
        o.n_expert, o.k, o.scale, o.normalize)
}
