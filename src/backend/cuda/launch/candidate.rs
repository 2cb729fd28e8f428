//! cuda/candidate.cu: DeepSeek V4.1's two-level top-k, blocks looping
//! over the tokens as the indexer's (cuda/indexer.cu), each with a scratch
//! row of keys.

use super::indexer::MAX_BLOCKS;
use super::{fixed, launch, Cx, Dev, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::candidate::{CandidateBlocks, CandidateTopK};

/// Blocks of a selection launch and their scratch of `max_items` keys each.
fn select_scratch(cx: &mut Cx, max_items: usize) -> Result<(usize, Dev), BackendError> {
    let blocks = cx.max_tokens().clamp(1, MAX_BLOCKS);
    let p = cx.scratch(blocks * max_items.max(1) * 4)?;
    Ok((blocks, p))
}

pub fn candidate_blocks(cx: &mut Cx, o: &CandidateBlocks) -> Result<(), BackendError> {
    let bs = o.block_size.max(1);
    let max_items = cx.layout.get(o.rows).rows.div_ceil(bs);
    let (blocks, sc) = select_scratch(cx, max_items)?;
    let grid = Grid::Blocks(fixed(blocks), fixed(1));
    launch!(cx, Entry::CandidateBlocks, grid, THREADS, 0;
        o.q, o.weights, o.rows, o.out, sc, o.ratio.max(1), o.n_head, o.head_dim,
        o.topk_blocks, bs, max_items.max(1))
}

pub fn candidate_topk(cx: &mut Cx, o: &CandidateTopK) -> Result<(), BackendError> {
    let bs = o.block_size.max(1);
    let max_items = o.topk_blocks * bs;
    let (blocks, sc) = select_scratch(cx, max_items)?;
    let grid = Grid::Blocks(fixed(blocks), fixed(1));
    launch!(cx, Entry::CandidateTopK, grid, THREADS, 0;
        o.q, o.weights, o.rows, o.blocks, o.out, sc, o.ratio.max(1), o.top_k, o.n_head,
        o.head_dim, o.topk_blocks, bs, max_items.max(1))
}
