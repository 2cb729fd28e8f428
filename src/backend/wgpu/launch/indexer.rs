//! shaders/indexer.wgsl: `indexer_topk`, one workgroup per token, per
//! session, in blocks of tokens whose score scratch fits one binding.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::IndexerParams;
use super::{token_block, Bindings, Cx};
use crate::backend::kernels::{Entry, Family};
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::indexer::IndexerTopK;

/// q, weights, keys0, scratch, out, keys1..7 (the indexer rows beyond one
/// binding), the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, R, R, W, W, R, R, R, R, R, R, R, R]);

pub fn indexer_topk(cx: &mut Cx, o: &IndexerTopK) -> Result<Vec<Work>, BackendError> {
    let max_rows = cx.b.layout.get(o.rows).rows;
    // Score rows of a block of tokens: the step's tokens run in blocks (one
    // dispatch each) small enough that the block's scratch fits one
    // binding; decode is one block of one.
    let row_bytes = (max_rows * 4).max(4) as u64;
    let block = cx.scratch_block("one token's indexer scores", row_bytes)?;
    let scratch = cx.score_scratch("indexer scores", block as u64 * row_bytes)?;
    let p = IndexerParams {
        ratio: o.ratio as u32,
        top_k: o.top_k as u32,
        n_head: o.n_head as u32,
        head_dim: o.head_dim as u32,
        max_rows: max_rows as u32,
        chunk_rows: cx.state_chunks(0, o.rows, false).1,
        ..Default::default()
    };
    let storage = |r: &Cx, set: usize| {
        let keys = r.state_chunks(set, o.rows, false).0;
        let mut s = vec![
            r.val(o.q),
            r.val(o.weights),
            keys[0].clone(),
            scratch.clone(),
            r.val(o.out),
        ];
        s.extend_from_slice(&keys[1..]);
        Ok(s)
    };
    let m = cx.kv_module(Family::Indexer, &[o.rows])?;
    cx.per_block(block, |cx, first| {
        let p = IndexerParams {
            t0: first as u32,
            ..p
        };
        let size = token_block(first, block);
        cx.kernel_sets(m, Entry::IndexerTopK, &p, storage, size)
    })
}
