//! shaders/round.wgsl: the KV rounding and the Hadamard + FP4 round trip,
//! one workgroup per row (one row held in workgroup memory), and the block
//! round trip of V4.1's activations (one workgroup per row, in place in
//! global memory).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::RoundParams;
use super::{groups_per_token, supported, unsupported, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::round::{BlockRound, HadamardFp4, KvRound};

/// x, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, W]);

/// The widest row the workgroup holds (`MAXROW` in shaders/rowops.wgsl).
pub const MAX_ROW: usize = 1024;

pub fn kv_round(cx: &mut Cx, o: &KvRound) -> Result<Vec<Work>, BackendError> {
    let dim = o.dim;
    supported(dim <= MAX_ROW, || {
        format!("KV rows of {dim} (at most {MAX_ROW})")
    })?;
    let p = RoundParams {
        dim: o.dim as u32,
        rows_per_token: 1,
        n_rot: o.n_rot as u32,
        fp8: o.fp8 as u32,
        f16: o.f16 as u32,
        ..Default::default()
    };
    let s = [cx.val(o.x), cx.val(o.out)];
    cx.one(Entry::KvRound, &p, &s, groups_per_token(1))
}

pub fn hadamard_fp4(cx: &mut Cx, o: &HadamardFp4) -> Result<Vec<Work>, BackendError> {
    if o.head_dim > MAX_ROW || !o.head_dim.is_power_of_two() {
        return Err(unsupported(format!("Hadamard width {}", o.head_dim)));
    }
    let p = RoundParams {
        dim: o.head_dim as u32,
        rows_per_token: o.blocks() as u32,
        ..Default::default()
    };
    let s = [cx.val(o.x), cx.val(o.out)];
    cx.one(Entry::HadamardFp4, &p, &s, groups_per_token(o.blocks()))
}

pub fn block_round(cx: &mut Cx, o: &BlockRound) -> Result<Vec<Work>, BackendError> {
    let p = RoundParams {
        dim: o.head as u32,
        rows_per_token: o.heads() as u32,
        block: o.block as u32,
        format: o.format.code(),
        ..Default::default()
    };
    let s = [cx.val(o.x), cx.val(o.out)];
    cx.one(Entry::BlockRound, &p, &s, groups_per_token(o.heads()))
}
