//! cuda/attention.cu: `attention`, one block per (head, token), a warp per
//! candidate row.

use super::{fixed, launch, per_token, supported, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::attention::Attention;

/// Widest head the kernel's lanes cover.
const MAX_HEAD_DIM: usize = 512;

pub fn attention(cx: &mut Cx, o: &Attention) -> Result<(), BackendError> {
    let hd = o.head_dim;
    supported(hd <= MAX_HEAD_DIM, || {
        format!("attention head dim {hd} (at most {MAX_HEAD_DIM})")
    })?;
    let sinks = cx.small(&o.sinks)?;
    let comp = o.compressed.map(|c| c.rows);
    let ratio = o.compressed.map_or(0, |c| c.ratio);
    let grid = Grid::Blocks(fixed(o.n_head), per_token(1));
    launch!(cx, Entry::Attention, grid, THREADS, 0;
        o.q, o.kv, o.ring, comp, o.selected, sinks, o.out,
        o.window, ratio, o.top_k, o.n_head, o.head_dim, o.block as u32)
}
