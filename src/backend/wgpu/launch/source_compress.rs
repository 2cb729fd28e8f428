//! shaders/source_compress.wgsl: DeepSeek V4.1's compressor of a kv-source
//! layer, one workgroup walking the step's tokens in blocks sized so that
//! no invocation loops more than llvmpipe allows.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::{rope_table, SourceCompressParams};
use super::super::MAX_STATE_CHUNKS;
use super::compress::COMPRESS_BLOCK_TOKENS;
use super::round::MAX_ROW;
use super::{supported, token_block, unsupported, Bindings, Cx, WG};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::source_compress::SourceCompress;
use crate::graph::ops::{self, rope::frequencies};
use crate::graph::StateId;

/// kv, gate, constants, frontier kv, frontier score, rows0, irows0, then
/// rows1..7 and irows1..7 (the rows beyond one binding), the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[
    R, R, R, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, R,
]);

/// Loop iterations one invocation of `source_compress` may spend per dispatch
/// (llvmpipe ends an invocation's loops after 65,535 in all; see
/// `COMPRESS_BLOCK_TOKENS`), with room to spare.
const COMPRESS_ITERATION_BUDGET: usize = 40_000;

/// A state bound whole: the compressor frontier, `ratio` rows that never
/// grow with the context, so it spans several bindings only under a binding
/// limit below `ratio` rows (a few KiB at Flash width), which no chunking of
/// whole rows would help with.
fn frontier_state(cx: &Cx, s: StateId) -> Result<wgpu::Buffer, BackendError> {
    cx.f32_only(s, "source_compress")?;
    // V4.1 runs one session per backend (no batched V4.1 yet): set 0.
    let st = &cx.b.sets[0][s.0 as usize];
    if st.chunks.len() != 1 {
        let d = cx.b.layout.get(s);
        return Err(BackendError::Device {
            device: cx.b.gpu.describe(),
            msg: format!(
                "source_compress: state {} ({} rows of {}, independent of the context) spans {} bindings of at most {} bytes; its kernel binds it whole",
                d.name,
                d.rows,
                d.cols,
                st.chunks.len(),
                cx.b.chunk_bytes
            ),
        });
    }
    Ok(st.chunks[0].clone())
}

pub fn source_compress(cx: &mut Cx, o: &SourceCompress) -> Result<Vec<Work>, BackendError> {
    let (hd, ihd, n_rot) = (o.head_dim, o.index_head_dim, o.rope.n_rot);
    supported(
        hd <= MAX_ROW && ihd <= MAX_ROW && n_rot <= hd.min(ihd),
        || {
            format!("source_compress of rows {hd}, index keys {ihd}, {n_rot} rotated (at most {MAX_ROW}, rotation within both)")
        },
    )?;
    let ratio = o.ratio.max(1);
    let frontier = match (o.frontier, o.gate) {
        (Some(f), Some(g)) if ratio > 1 => Some((f, g)),
        (_, _) if ratio > 1 => {
            return Err(unsupported(format!(
                "source_compress of ratio {ratio} without its frontier or gate"
            )))
        }
        _ => None,
    };
    // The norm, the index norm, wk, the rope table.
    let mut consts = ops::load_f32(cx.file, &o.norm);
    consts.extend(ops::load_f32(cx.file, &o.index_norm));
    consts.extend(ops::load_f32(cx.file, &o.index_wk));
    consts.extend(rope_table(&frequencies(&o.rope)));
    let capacity = cx.b.layout.get(o.rows).rows;
    let cb = cx.constants("v41 compressor constants", &consts);
    let (gate, st_kv, st_score) = match frontier {
        Some((f, g)) => (
            cx.val(g),
            frontier_state(cx, f.kv)?,
            frontier_state(cx, f.score)?,
        ),
        // Dummies 0 and MAX_STATE_CHUNKS: the chunked rows' unused bindings
        // take the others.
        None => (
            cx.dummy(),
            cx.dummy_write(0),
            cx.dummy_write(MAX_STATE_CHUNKS),
        ),
    };
    let (rows, chunk_rows) = cx.f32_chunks(o.rows, "source_compress", Some(0))?;
    let (irows, index_chunk_rows) =
        cx.f32_chunks(o.index_rows, "source_compress", Some(MAX_STATE_CHUNKS))?;
    let p = SourceCompressParams {
        ratio: ratio as u32,
        head_dim: hd as u32,
        index_head_dim: ihd as u32,
        n_rot: n_rot as u32,
        eps: o.eps,
        capacity: capacity.min(cx.b.layout.get(o.index_rows).rows) as u32,
        chunk_rows,
        index_chunk_rows,
        round_rows: o.round_rows as u32,
        ..Default::default()
    };
    let mut s = vec![
        cx.val(o.kv),
        gate,
        cb,
        st_kv,
        st_score,
        rows[0].clone(),
        irows[0].clone(),
    ];
    s.extend_from_slice(&rows[1..]);
    s.extend_from_slice(&irows[1..]);
    // One workgroup walks the tokens in order, in blocks whose loops stay
    // within llvmpipe's budget: per token a thread spends up to
    // ceil(ihd/WG) dot products of hd, and a few passes over ceil(hd/WG)
    // columns of 2·ratio slots.
    let per_token = ihd.div_ceil(WG) * hd + hd.div_ceil(WG) * (2 * ratio + 8) + 8;
    let block = (COMPRESS_ITERATION_BUDGET / per_token).clamp(1, COMPRESS_BLOCK_TOKENS);
    cx.per_block(block, |cx, first| {
        let (t0, t1) = (first as u32, (first + block) as u32);
        let p = SourceCompressParams { t0, t1, ..p };
        cx.kernel(Entry::SourceCompress, &p, &s, token_block(first, 1))
    })
}
