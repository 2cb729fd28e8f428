//! cuda/indexer.cu: `indexer_topk`, min(max_tokens, 64) blocks looping over
//! the tokens, each with a scratch row of keys.

use super::{fixed, launch, Cx, Grid};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::indexer::IndexerTopK;

/// Most blocks of a selection launch (each loops over its tokens).
pub const MAX_BLOCKS: usize = 64;

pub fn indexer_topk(cx: &mut Cx, o: &IndexerTopK) -> Result<(), BackendError> {
    let max_rows = cx.layout.get(o.rows).rows;
    let blocks = cx.max_tokens().min(MAX_BLOCKS);
    let scratch = cx.scratch(blocks * max_rows.max(1) * 4)?;
    let grid = Grid::Blocks(fixed(blocks), fixed(1));
    launch!(cx, Entry::IndexerTopK, grid, 256, 0;
        o.q, o.weights, o.rows, o.out, scratch, o.ratio, o.top_k, o.n_head, o.head_dim, max_rows)
}
