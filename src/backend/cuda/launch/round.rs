//! cuda/round.cu: the KV rounding (`kv_round`, one warp per 64-value FP8
//! block) and the Hadamard + FP4 round trip (`hadamard_fp4`, one block per
//! head), and the block round trip of V4.1's activations (`block_round`,
//! one block per row, one thread per scale block).

use super::{fixed, launch, per_token, supported, unsupported, Cx, Grid};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::round::{BlockRound, HadamardFp4, KvRound};

pub fn kv_round(cx: &mut Cx, o: &KvRound) -> Result<(), BackendError> {
    let block = 32 * o.dim.div_ceil(64) as u32;
    let dim = o.dim;
    supported(block <= 1024, || {
        format!("kv_round of {dim} dims (at most 2048)")
    })?;
    let grid = Grid::Blocks(per_token(1), fixed(1));
    launch!(cx, Entry::KvRound, grid, block, 0; o.x, o.out, o.dim, o.n_rot, o.fp8, o.f16)
}

pub fn hadamard_fp4(cx: &mut Cx, o: &HadamardFp4) -> Result<(), BackendError> {
    let hd = o.head_dim;
    if !hd.is_power_of_two() || hd > 1024 || o.cols % hd != 0 {
        return Err(unsupported(format!("hadamard_fp4 over heads of {hd}")));
    }
    let grid = Grid::Blocks(per_token(o.blocks()), fixed(1));
    let (block, shared) = (hd.max(32) as u32, 4 * hd as u32);
    launch!(cx, Entry::HadamardFp4, grid, block, shared; o.x, o.out, o.cols, hd)
}

pub fn block_round(cx: &mut Cx, o: &BlockRound) -> Result<(), BackendError> {
    let grid = Grid::Blocks(per_token(o.heads()), fixed(1));
    launch!(cx, Entry::BlockRound, grid, 256, 0;
        o.x, o.out, o.head, o.heads(), o.block, o.format.code())
}
