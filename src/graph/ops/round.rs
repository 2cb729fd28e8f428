//! The official numerics' rounding steps (MODEL.md §3.5.1), on by default
//! (`--numerics model`) and off with `--numerics plain`.

use super::CpuCx;
use crate::graph::ValueId;
use crate::quant::{f16, small_float};

/// Finalises attention KV rows before they are cached: FP8 (E4M3) round trip
/// of the non-rotary dims, then f16 storage.
#[derive(Clone, Debug)]
pub struct KvRound {
    pub x: ValueId,
    pub out: ValueId,
    pub dim: usize,
    pub n_rot: usize,
    pub fp8: bool,
    pub f16: bool,
}

impl KvRound {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let n = n_tokens * self.dim;
        out[..n].copy_from_slice(&x[..n]);
        for row in out[..n].chunks_exact_mut(self.dim) {
            round_row(row, self.n_rot, self.fp8, self.f16);
        }
    }
}

/// FP8 simulation (optional) then f16 rounding (optional) of one cached row.
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

/// Hadamard transform + FP4 (E2M1) round trip of every `head_dim`-wide head
/// (indexer queries and keys).
#[derive(Clone, Debug)]
pub struct HadamardFp4 {
    pub x: ValueId,
    pub out: ValueId,
    pub cols: usize,
    pub head_dim: usize,
}

impl HadamardFp4 {
    /// Transformed blocks of `head_dim` per token (one GPU workgroup each).
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
            small_float::hadamard_fp4_roundtrip(head);
        }
    }
}
