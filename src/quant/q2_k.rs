//! Q2_K (type 10, QUANTS.md §4): 256 values as 16 sub-blocks of 16 2-bit
//! codes, each with a 4-bit scale and 4-bit min against two f16 super-scales.
//!
//! The q2 Flash files store the routed down-projection experts this way.
//! Decoding follows gguf-py's arithmetic order exactly (`(d·sc)·q − dmin·m`)
//! so dequantized rows are bit-identical to it; the quantizer is the shared
//! importance-weighted affine fit in `kquant.rs`. [`dot_q8k`] is the integer
//! dot product against ds4's Q8_K activations (QUANTS.md §8).

// Element indices map straight into the packed layout; index loops read
// closer to QUANTS.md than iterator chains here.
#![allow(clippy::needless_range_loop)]

use super::f16::f16_bits_to_f32;
use super::kquant::{self, fit_superblock, Shape};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// Values per super-block.
pub use super::kquant::QK_K;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 84;

/// One Q2_K super-block as stored in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per 16-value sub-block: low nibble scale, high nibble min.
    pub scales: [u8; 16],
    /// 2-bit codes: bits `2j..2j+1` of byte `32h + l` hold value `128h + 32j + l`.
    pub qs: [u8; 64],
    /// Super-scale for the sub-scales, f16 bits.
    pub d: u16,
    /// Super-scale for the sub-mins, f16 bits.
    pub dmin: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == BLOCK_BYTES);

fn blocks(src: &[u8]) -> impl Iterator<Item = BlockQ2K> + '_ {
    super::blocks(src)
}

/// Code of element `y` (0..256) of a block.
#[inline]
fn code(b: &BlockQ2K, y: usize) -> u8 {
    let (h, j, l) = (y / 128, (y % 128) / 32, y % 32);
    (b.qs[32 * h + l] >> (2 * j)) & 3
}

/// Decodes a Q2_K row. Panics if `src` is not exactly `dst.len()/256` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK_K == 0 && src.len() == dst.len() / QK_K * BLOCK_BYTES);
    for (b, out) in blocks(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_bits_to_f32(b.d);
        let dmin = f16_bits_to_f32(b.dmin);
        // Loops in storage order (half, bit pair, byte); per-sub-block factors
        // hoisted. Each element still computes `(d·sc)·q − dmin·m` with the
        // same operands, so the values are bit-identical to the direct form.
        for half in 0..2 {
            let qs = &b.qs[32 * half..32 * half + 32];
            for j in 0..4 {
                for part in 0..2 {
                    let s = b.scales[8 * half + 2 * j + part];
                    let (dl, ml) = (d * (s & 15) as f32, dmin * (s >> 4) as f32);
                    let o = &mut out[128 * half + 32 * j + 16 * part..][..16];
                    for (l, v) in o.iter_mut().enumerate() {
                        let q = (qs[16 * part + l] >> (2 * j)) & 3;
                        *v = dl * q as f32 - ml;
                    }
                }
            }
        }
    }
}

/// Dot of a Q2_K row with `x`. Per sub-block `(d·sc)·Σ q·x − (dmin·m)·Σ x`,
/// all in f32; equal to dequantize-then-dot up to f32 rounding.
pub fn dot_row(src: &[u8], x: &[f32]) -> f32 {
    assert!(x.len() % QK_K == 0 && src.len() == x.len() / QK_K * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, xs) in blocks(src).zip(x.chunks_exact(QK_K)) {
        let d = f16_bits_to_f32(b.d);
        let dmin = f16_bits_to_f32(b.dmin);
        for sb in 0..16 {
            let (mut sqx, mut sx) = (0.0f32, 0.0f32);
            for y in 16 * sb..16 * sb + 16 {
                sqx += code(&b, y) as f32 * xs[y];
                sx += xs[y];
            }
            let s = b.scales[sb];
            acc += d * (s & 15) as f32 * sqx - dmin * (s >> 4) as f32 * sx;
        }
    }
    acc
}

/// Integer dot product of a Q2_K row with Q8_K activations, as ds4's CPU
/// path evaluates it (QUANTS.md §8): exact integer sums per sub-block, the
/// min term through the activation's `bsums`, scales applied once per
/// super-block. Panics if the row has a different number of blocks than `y`.
pub fn dot_q8k(src: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(src.len(), y.len() * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, a) in blocks(src).zip(y) {
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for sb in 0..16 {
            let mut s = 0i32;
            for i in 16 * sb..16 * sb + 16 {
                s += code(&b, i) as i32 * a.qs[i] as i32;
            }
            sum_q += (b.scales[sb] & 15) as i32 * s;
            sum_m += (b.scales[sb] >> 4) as i32 * a.bsums[sb] as i32;
        }
        acc += f16_bits_to_f32(b.d) * a.d * sum_q as f32
            - f16_bits_to_f32(b.dmin) * a.d * sum_m as f32;
    }
    acc
}

const SHAPE: Shape = Shape {
    sub: 16,
    nmax: 3,
    smax: 15,
};

/// Quantizes one super-block of 256 values with weights `w` (see `kquant.rs`).
pub fn quantize_block(x: &[f32], w: &[f32]) -> BlockQ2K {
    let fit = fit_superblock(x, w, &SHAPE);
    let mut scales = [0u8; 16];
    for (s, (&sc, &m)) in scales.iter_mut().zip(fit.sc.iter().zip(&fit.m)) {
        *s = sc | (m << 4);
    }
    let mut qs = [0u8; 64];
    for (y, &q) in fit.q.iter().enumerate() {
        let (h, j, l) = (y / 128, (y % 128) / 32, y % 32);
        qs[32 * h + l] |= q << (2 * j);
    }
    BlockQ2K {
        scales,
        qs,
        d: fit.d,
        dmin: fit.dmin,
    }
}

/// Quantizes a row; `importance` (one weight per element, e.g. an imatrix
/// row) sets the per-element weight of the squared error.
pub fn quantize_row(src: &[f32], dst: &mut [u8], importance: Option<&[f32]>) {
    kquant::quantize_row(src, dst, importance, quantize_block);
}
