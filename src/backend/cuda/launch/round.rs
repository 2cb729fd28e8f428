//! cuda/round.cu: the FP8 round trip of rows in blocks (`fp8_round`, one
//! thread per block) and the FP4 round trip of heads, with or without the
//! Hadamard rotation (`fp4_round`, one block per head).

use super::{fixed, launch, per_token, unsupported, Cx, Dev, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::round::{Fp4Round, Fp8Round, Fp8Rows};

pub fn fp8_round(cx: &mut Cx, o: &Fp8Round) -> Result<(), BackendError> {
    let (x, out) = (Dev(cx.value(o.x)), Dev(cx.value(o.out)));
    fp8_rows(cx, &o.spec, 1, x, out)
}

/// `rows_per_token` rows of `o.dim` per token rounded as `o` says, from `x`
/// into `out` (may be `x`: the routed experts' hidden rows use it too).
pub fn fp8_rows(
    cx: &mut Cx,
    o: &Fp8Rows,
    rows_per_token: usize,
    x: Dev,
    out: Dev,
) -> Result<(), BackendError> {
    if o.block == 0 {
        return Err(unsupported("fp8_round in blocks of 0".into()));
    }
    let grid = Grid::Threads(per_token(rows_per_token * o.blocks()));
    launch!(cx, Entry::Fp8Round, grid, THREADS, 0;
        x, out, o.dim, o.n_rot, o.block, o.fp8, o.f16, rows_per_token)
}

pub fn fp4_round(cx: &mut Cx, o: &Fp4Round) -> Result<(), BackendError> {
    let hd = o.head_dim;
    if hd == 0 || hd > 1024 || (o.hadamard && !hd.is_power_of_two()) || o.cols % hd != 0 {
        return Err(unsupported(format!(
            "fp4_round over heads of {hd} (hadamard {})",
            o.hadamard
        )));
    }
    let grid = Grid::Blocks(per_token(o.blocks()), fixed(1));
    let (block, shared) = (hd.next_multiple_of(32) as u32, 4 * hd as u32);
    launch!(cx, Entry::Fp4Round, grid, block, shared; o.x, o.out, o.cols, hd, o.hadamard)
}
