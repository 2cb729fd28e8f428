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
        round_pieces(x, n_tokens * self.dim, self.dim, out, |row| {
            round_row(row, self.n_rot, self.fp8, self.f16)
        });
    }
}

/// Copies the first `n` values of `x` to `out`, then rounds each
/// `piece`-wide run of them in place: what every rounding op does to its
/// tokens' rows.
fn round_pieces(x: &[f32], n: usize, piece: usize, out: &mut [f32], round: impl Fn(&mut [f32])) {
    out[..n].copy_from_slice(&x[..n]);
    out[..n].chunks_exact_mut(piece).for_each(round);
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
        round_pieces(
            x,
            n_tokens * self.cols,
            self.head_dim,
            out,
            small_float::hadamard_fp4_roundtrip,
        );
    }
}

/// The small float an activation is rounded through, with its block scale
/// (the official `act_quant` / `fp4_act_quant`; DeepSeek V4.1 under
/// `--numerics model`, docs/V41.md § Numerics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    /// E4M3 with a power-of-two (UE8M0) scale: GEMM inputs, window KV rows.
    Fp8,
    /// E2M1 with a power-of-two (UE8M0) scale: indexer queries and keys.
    Fp4,
    /// E2M1 with an E4M3 scale: compressed latents.
    Fp4E4m3Scale,
}

impl BlockFormat {
    /// Its number in the GPU kernels' `format` parameter.
    pub fn code(self) -> u32 {
        match self {
            BlockFormat::Fp8 => 0,
            BlockFormat::Fp4 => 1,
            BlockFormat::Fp4E4m3Scale => 2,
        }
    }

    /// Rounds `v` in blocks of `block` (a shorter final block if needed).
    pub fn round(self, v: &mut [f32], block: usize) {
        match self {
            BlockFormat::Fp8 => small_float::fp8_roundtrip(v, block),
            BlockFormat::Fp4 => small_float::fp4_roundtrip_blocks(v, block),
            BlockFormat::Fp4E4m3Scale => small_float::fp4_e4m3_roundtrip_blocks(v, block),
        }
    }
}

/// A round trip of every `cols`-wide row through `format` in blocks of
/// `block`, restarting at every `head` values (the official quantisers
/// block the last dim: one head of the indexer's queries, or the whole row
/// of an activation): what the official graph's simulated quantisation
/// does to an activation.
#[derive(Clone, Debug)]
pub struct BlockRound {
    pub x: ValueId,
    pub out: ValueId,
    pub cols: usize,
    /// Divides `cols`; blocks never cross a head.
    pub head: usize,
    pub block: usize,
    pub format: BlockFormat,
}

impl BlockRound {
    /// Heads per row (one GPU workgroup each).
    pub fn heads(&self) -> usize {
        self.cols / self.head
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        round_pieces(x, n_tokens * self.cols, self.head, out, |head| {
            self.format.round(head, self.block)
        });
    }
}
