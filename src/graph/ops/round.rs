//! The official numerics' rounding steps (MODEL.md §3.5.1, docs/V41.md), on
//! by default (`--numerics model`) and off with `--numerics plain`: one FP8
//! round trip of rows in blocks ([`Fp8Round`]: V4's cached KV rows, V4.1's
//! window KV and the input of every FP8/FP4 GEMM) and one FP4 round trip of
//! heads ([`Fp4Round`]: the indexer queries, V4 with its Hadamard rotation).

use super::CpuCx;
use crate::graph::ValueId;
use crate::quant::small_float::{self, Fp4Scale};
use crate::quant::f16;

/// How [`Fp8Round`] rounds each `dim`-wide row: FP8 (E4M3) in blocks of
/// `block` over its first `dim − n_rot` dims (UE8M0 scales), then
/// optionally f16 storage of the whole row. V4's KV rows: blocks of 64, the
/// RoPE dims left alone, f16; V4.1's window rows and FP8 GEMM inputs:
/// blocks of 32 over the whole row ([`Fp8Rows::v41`]), no f16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Rows {
    pub dim: usize,
    pub n_rot: usize,
    /// FP8 block width (64 V4, 32 V4.1).
    pub block: usize,
    pub fp8: bool,
    pub f16: bool,
}

impl Fp8Rows {
    /// V4.1's `act_quant(x, 32, "ue8m0")` on rows of `dim`.
    pub fn v41(dim: usize) -> Fp8Rows {
        Fp8Rows {
            dim,
            n_rot: 0,
            block: small_float::V41_FP8_BLOCK,
            fp8: true,
            f16: false,
        }
    }

    /// FP8 blocks per row (the last one may be short).
    pub fn blocks(&self) -> usize {
        self.dim.div_ceil(self.block)
    }

    /// Rounds one row in place.
    pub fn apply(&self, row: &mut [f32]) {
        if self.fp8 {
            let q = self.dim.saturating_sub(self.n_rot);
            small_float::fp8_blocks(&mut row[..q], self.block);
        }
        if self.f16 {
            round_f16(row);
        }
    }
}

/// The FP8 round trip of one row per token (see [`Fp8Rows`]).
#[derive(Clone, Debug)]
pub struct Fp8Round {
    pub x: ValueId,
    pub out: ValueId,
    pub spec: Fp8Rows,
}

impl Fp8Round {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let n = n_tokens * self.spec.dim;
        out[..n].copy_from_slice(&x[..n]);
        for row in out[..n].chunks_exact_mut(self.spec.dim) {
            self.spec.apply(row);
        }
    }
}

/// V4's FP8 simulation (blocks of 64, RoPE dims left alone) then f16
/// rounding of one cached row, each optional.
pub fn round_row(row: &mut [f32], n_rot: usize, fp8: bool, to_f16: bool) {
    if fp8 {
        small_float::fp8_kv_roundtrip(row, n_rot);
    }
    if to_f16 {
        round_f16(row);
    }
}

pub fn round_f16(row: &mut [f32]) {
    for v in row {
        *v = f16::f16_bits_to_f32(f16::f32_to_f16_bits(*v));
    }
}

/// FP4 (E2M1) round trip of every `head_dim`-wide head in blocks of 32
/// (a head narrower than 32 is one block) with UE8M0 scales, after a
/// Walsh–Hadamard rotation of the head when `hadamard`: V4's indexer
/// queries (rotated), V4.1's (not rotated).
#[derive(Clone, Debug)]
pub struct Fp4Round {
    pub x: ValueId,
    pub out: ValueId,
    pub cols: usize,
    pub head_dim: usize,
    pub hadamard: bool,
}

impl Fp4Round {
    /// Heads per token (one GPU workgroup each).
    pub fn blocks(&self) -> usize {
        self.cols / self.head_dim
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let n = n_tokens * self.cols;
        out[..n].copy_from_slice(&x[..n]);
        for head in out[..n].chunks_exact_mut(self.head_dim) {
            if self.hadamard {
                small_float::hadamard_inplace(head);
            }
            small_float::fp4_blocks(head, small_float::FP4_BLOCK, Fp4Scale::Ue8m0);
        }
    }
}
