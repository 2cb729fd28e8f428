//! cuda/matmul.cu: `matmul_<type>` (a warp per weight row, tiles of up to
//! 8 tokens) and, for prefill steps, the tensor-core `mma_<type>`.

use super::{fixed, launch, per_tokens, supported, unsupported, Cx, Grid, THREADS};
use crate::backend::cuda::kernels::Kernel;
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::matmul::MatMul;

/// Prefill steps of at least this many tokens take the tensor-core matmul
/// (when enabled): below it a 32-token tile is mostly padding, and decode
/// (1 token) stays on the bandwidth-bound CUDA-core kernel.
pub const MMA_MIN_TOKENS: u32 = 32;

/// Token rows per tile of `matmul_<type>` (`MM_TT`).
const TILE_TOKENS: usize = 8;

pub fn matmul(cx: &mut Cx, o: &MatMul) -> Result<(), BackendError> {
    let kernel = Kernel::typed(Entry::MatMul, o.w.ty);
    kernel.name().map_err(unsupported)?;
    let (n_in, n_out) = (o.in_dim(), o.out_dim());
    let groups = o.groups;
    supported(groups > 0 && n_out % groups == 0, || {
        format!("matmul {} ({n_in} × {n_out}, {groups} groups)", o.w.name)
    })?;
    let fixed_rows = o.rows.fixed_only().unwrap_or(0);
    let per_token_rows = o.rows.fixed_only().is_none();
    let w = cx.tensor(&o.w)?;
    let row_bytes = o.w.row_bytes();
    let tiles = if per_token_rows {
        per_tokens(TILE_TOKENS as u32)
    } else {
        fixed(fixed_rows.div_ceil(TILE_TOKENS))
    };
    let grid = Grid::Blocks(fixed(n_out.div_ceil(8)), tiles);
    launch!(cx, kernel, grid, THREADS, 0;
        w, row_bytes, n_in, n_out, o.groups, o.x, o.out, fixed_rows)?;
    // Tensor cores for prefill steps: whole 32-value units and 64-row tiles
    // that never straddle an output group.
    let per_group = n_out / o.groups;
    if cx.tensor_cores
        && per_token_rows
        && cx.max_tokens() as u32 >= MMA_MIN_TOKENS
        && n_in % 32 == 0
        && (o.groups == 1 || per_group % 64 == 0)
    {
        cx.only_for(0..=MMA_MIN_TOKENS - 1);
        let grid = Grid::Blocks(fixed(n_out.div_ceil(64)), per_tokens(32));
        let mma = Kernel::typed(Entry::Mma, o.w.ty);
        launch!(cx, mma, grid, 128, 0; w, row_bytes, n_in, n_out, o.groups, o.x, o.out)?;
        cx.only_for(MMA_MIN_TOKENS..=u32::MAX);
    }
    Ok(())
}
