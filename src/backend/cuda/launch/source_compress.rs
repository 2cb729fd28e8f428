//! cuda/source_compress.cu: DeepSeek V4.1's compressor of a kv-source layer,
//! one block walking the step's tokens (the frontier carries).

use super::{fixed, launch, supported, unsupported, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::source_compress::SourceCompress;

pub fn source_compress(cx: &mut Cx, o: &SourceCompress) -> Result<(), BackendError> {
    let (hd, ihd, n_rot) = (o.head_dim, o.index_head_dim, o.rope.n_rot);
    supported(hd <= 1024 && ihd <= 1024 && n_rot <= hd.min(ihd), || {
        format!("source_compress of rows {hd}, index keys {ihd}, {n_rot} rotated (at most 1024, rotation within both)")
    })?;
    let ratio = o.ratio.max(1);
    // Ratio 1 keeps no frontier: its pointers are null.
    let (gate, frontier) = match (o.frontier, o.gate) {
        (Some(f), Some(g)) if ratio > 1 => (Some(g), Some(f)),
        _ if ratio > 1 => {
            return Err(unsupported(format!(
                "source_compress of ratio {ratio} without its frontier or gate"
            )))
        }
        _ => (None, None),
    };
    let norm = cx.small(&o.norm)?;
    let wk = cx.small(&o.index_wk)?;
    let index_norm = cx.small(&o.index_norm)?;
    let f = cx.freqs(&o.rope)?;
    let capacity = cx
        .layout
        .get(o.rows)
        .rows
        .min(cx.layout.get(o.index_rows).rows);
    let grid = Grid::Blocks(fixed(1), fixed(1));
    launch!(cx, Entry::SourceCompress, grid, THREADS, 0;
        o.kv, gate, norm, wk, index_norm, frontier.map(|f| f.kv), frontier.map(|f| f.score),
        o.rows, o.index_rows, f, ratio, hd, ihd, n_rot, o.eps, capacity, o.round_rows)
}
