//! shaders/round.wgsl: the FP8 round trip of rows in blocks (one workgroup
//! per row segment of up to MAXROW values) and the FP4 round trip of heads,
//! with or without the Hadamard rotation (one workgroup per head).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::RoundParams;
use super::{groups_per_token, supported, unsupported, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::round::{Fp4Round, Fp8Round, Fp8Rows};

/// x, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, W]);

/// The widest row the workgroup holds (`MAXROW` in shaders/rowops.wgsl).
pub const MAX_ROW: usize = 1024;

pub fn fp8_round(cx: &mut Cx, o: &Fp8Round) -> Result<Vec<Work>, BackendError> {
    let s = [cx.val(o.x), cx.val(o.out)];
    fp8_rows(cx, &o.spec, 1, &s)
}

/// `rows_per_token` rows of `o.dim` per token rounded as `o` says, from
/// `bufs[0]` into `bufs[1]` (the routed experts' hidden rows use it too).
pub fn fp8_rows(
    cx: &mut Cx,
    o: &Fp8Rows,
    rows_per_token: usize,
    bufs: &[wgpu::Buffer; 2],
) -> Result<Vec<Work>, BackendError> {
    let block = o.block;
    supported(block > 0 && MAX_ROW % block == 0, || {
        format!("FP8 blocks of {block} (a divisor of {MAX_ROW})")
    })?;
    let p = RoundParams {
        dim: o.dim as u32,
        rows_per_token: rows_per_token as u32,
        n_rot: o.n_rot as u32,
        fp8: o.fp8 as u32,
        f16: o.f16 as u32,
        block: block as u32,
        ..Default::default()
    };
    let segs = o.dim.div_ceil(MAX_ROW);
    cx.one(
        Entry::Fp8Round,
        &p,
        bufs,
        groups_per_token(rows_per_token * segs),
    )
}

pub fn fp4_round(cx: &mut Cx, o: &Fp4Round) -> Result<Vec<Work>, BackendError> {
    let hd = o.head_dim;
    if hd > MAX_ROW || (o.hadamard && !hd.is_power_of_two()) {
        return Err(unsupported(format!(
            "FP4 over heads of {hd} (hadamard {})",
            o.hadamard
        )));
    }
    let p = RoundParams {
        dim: hd as u32,
        rows_per_token: o.blocks() as u32,
        hadamard: o.hadamard as u32,
        ..Default::default()
    };
    let s = [cx.val(o.x), cx.val(o.out)];
    cx.one(Entry::Fp4Round, &p, &s, groups_per_token(o.blocks()))
}
