//! shaders/candidate.wgsl: DeepSeek V4.1's two-level top-k, one workgroup
//! per token in blocks of tokens whose score scratch fits one binding, as
//! the indexer's (`launch/indexer.rs`).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::CandidateParams;
use super::{token_block, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::candidate::{CandidateBlocks, CandidateTopK};
use crate::graph::{StateId, ValueId};

/// q, weights, keys0, blocks, scratch, out, keys1..7 (the index keys beyond
/// one binding), the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, R, R, R, W, W, R, R, R, R, R, R, R, R]);

pub fn candidate_blocks(cx: &mut Cx, o: &CandidateBlocks) -> Result<Vec<Work>, BackendError> {
    let max_rows = cx.b.layout.get(o.rows).rows;
    let p = CandidateParams {
        ratio: o.ratio.max(1) as u32,
        n_head: o.n_head as u32,
        head_dim: o.head_dim as u32,
        topk_blocks: o.topk_blocks as u32,
        block_size: o.block_size.max(1) as u32,
        max_items: max_rows.div_ceil(o.block_size.max(1)).max(1) as u32,
        ..Default::default()
    };
    let io = (o.q, o.weights, o.rows, None, o.out);
    select(cx, Entry::CandidateBlocks, p, io)
}

pub fn candidate_topk(cx: &mut Cx, o: &CandidateTopK) -> Result<Vec<Work>, BackendError> {
    let p = CandidateParams {
        ratio: o.ratio.max(1) as u32,
        top_k: o.top_k as u32,
        n_head: o.n_head as u32,
        head_dim: o.head_dim as u32,
        topk_blocks: o.topk_blocks as u32,
        block_size: o.block_size.max(1) as u32,
        max_items: (o.topk_blocks * o.block_size).max(1) as u32,
        ..Default::default()
    };
    let io = (o.q, o.weights, o.rows, Some(o.blocks), o.out);
    select(cx, Entry::CandidateTopK, p, io)
}

/// One selection kernel per block of tokens whose scratch rows of
/// `max_items` keys fit one binding; `io`: q, weights, keys, the kept
/// blocks (level two), out.
fn select(
    cx: &mut Cx,
    entry: Entry,
    p: CandidateParams,
    (q, weights, keys, blocks, out): (ValueId, ValueId, StateId, Option<ValueId>, ValueId),
) -> Result<Vec<Work>, BackendError> {
    let row_bytes = (p.max_items as u64 * 4).max(4);
    let block = cx.scratch_block("one token's selection scores", row_bytes)?;
    let scratch = cx.score_scratch("V4.1 selection scores", block as u64 * row_bytes)?;
    let (kc, chunk_rows) = cx.f32_chunks(keys, entry.name(), None)?;
    let p = CandidateParams { chunk_rows, ..p };
    let mut s = vec![
        cx.val(q),
        cx.val(weights),
        kc[0].clone(),
        blocks.map_or_else(|| cx.dummy(), |b| cx.val(b)),
        scratch,
        cx.val(out),
    ];
    s.extend_from_slice(&kc[1..]);
    cx.per_block(block, |cx, first| {
        let p = CandidateParams {
            t0: first as u32,
            ..p
        };
        cx.kernel(entry, &p, &s, token_block(first, block))
    })
}
