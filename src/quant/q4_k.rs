//! Q4_K (type 12, QUANTS.md §5): 256 values as 8 sub-blocks of 32 4-bit
//! codes, each with a 6-bit scale and 6-bit min against two f16 super-scales.
//!
//! The q4 Flash files store the routed experts and MTP experts this way.
//! Decoding follows gguf-py's arithmetic order exactly (`(d·sc)·q − dmin·m`,
//! each product rounded to f32) so dequantized rows are bit-identical to it;
//! the quantizer is the shared importance-weighted affine fit in `kquant.rs`.

// Element indices map straight into the packed layout; index loops read
// closer to QUANTS.md than iterator chains here.
#![allow(clippy::needless_range_loop)]

use super::f16::f16_bits_to_f32;
use super::kquant::{self, fit_superblock, Shape};
use bytemuck::{Pod, Zeroable};

/// Values per super-block.
pub use super::kquant::QK_K;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 144;

/// One Q4_K super-block as stored in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-scale for the sub-scales, f16 bits.
    pub d: u16,
    /// Super-scale for the sub-mins, f16 bits.
    pub dmin: u16,
    /// Eight 6-bit scales and eight 6-bit mins, packed (see [`unpack_scales`]).
    pub scales: [u8; 12],
    /// 4-bit codes: byte `32c + l` holds value `64c + l` (low nibble) and
    /// `64c + 32 + l` (high nibble).
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == BLOCK_BYTES);

/// Unpacks the 6-bit (scale, min) pairs of the 8 sub-blocks.
pub fn unpack_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, m)
}

/// Inverse of [`unpack_scales`]; inputs must be < 64.
pub fn pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    s
}

fn blocks(src: &[u8]) -> impl Iterator<Item = BlockQ4K> + '_ {
    super::blocks(src)
}

/// Code of element `y` (0..256) of a block.
#[inline]
fn code(b: &BlockQ4K, y: usize) -> u8 {
    let byte = b.qs[32 * (y / 64) + y % 32];
    if y % 64 < 32 {
        byte & 15
    } else {
        byte >> 4
    }
}

/// Decodes a Q4_K row. Panics if `src` is not exactly `dst.len()/256` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK_K == 0 && src.len() == dst.len() / QK_K * BLOCK_BYTES);
    for (b, out) in blocks(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_bits_to_f32(b.d);
        let dmin = f16_bits_to_f32(b.dmin);
        let (sc, m) = unpack_scales(&b.scales);
        // Per 64-value chunk: low nibbles are sub-block 2c, high nibbles 2c+1.
        // Factors hoisted; each element keeps `(d·sc)·q − dmin·m` exactly.
        for c in 0..4 {
            let qs = &b.qs[32 * c..32 * c + 32];
            for (half, shift) in [(0usize, 0u32), (1, 4)] {
                let j = 2 * c + half;
                let (dl, ml) = (d * sc[j] as f32, dmin * m[j] as f32);
                for (o, &byte) in out[64 * c + 32 * half..][..32].iter_mut().zip(qs) {
                    *o = dl * ((byte >> shift) & 15) as f32 - ml;
                }
            }
        }
    }
}

/// Dot of a Q4_K row with `x`. Per sub-block
/// `(d·sc)·Σ q·x − (dmin·m)·Σ x`, all in f32; equal to dequantize-then-dot
/// up to f32 rounding.
pub fn dot_row(src: &[u8], x: &[f32]) -> f32 {
    assert!(x.len() % QK_K == 0 && src.len() == x.len() / QK_K * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, xs) in blocks(src).zip(x.chunks_exact(QK_K)) {
        let d = f16_bits_to_f32(b.d);
        let dmin = f16_bits_to_f32(b.dmin);
        let (sc, m) = unpack_scales(&b.scales);
        for j in 0..8 {
            let (mut sqx, mut sx) = (0.0f32, 0.0f32);
            for y in 32 * j..32 * j + 32 {
                sqx += code(&b, y) as f32 * xs[y];
                sx += xs[y];
            }
            acc += d * sc[j] as f32 * sqx - dmin * m[j] as f32 * sx;
        }
    }
    acc
}

const SHAPE: Shape = Shape {
    sub: 32,
    nmax: 15,
    smax: 63,
};

/// Quantizes one super-block of 256 values with weights `w` (see `kquant.rs`).
pub fn quantize_block(x: &[f32], w: &[f32]) -> BlockQ4K {
    let fit = fit_superblock(x, w, &SHAPE);
    let sc: [u8; 8] = fit.sc[..].try_into().unwrap();
    let m: [u8; 8] = fit.m[..].try_into().unwrap();
    let mut qs = [0u8; 128];
    for c in 0..4 {
        for l in 0..32 {
            qs[32 * c + l] = fit.q[64 * c + l] | (fit.q[64 * c + 32 + l] << 4);
        }
    }
    BlockQ4K {
        d: fit.d,
        dmin: fit.dmin,
        scales: pack_scales(&sc, &m),
        qs,
    }
}

/// Quantizes a row; `importance` (one weight per element, e.g. an imatrix
/// row) sets the per-element weight of the squared error.
pub fn quantize_row(src: &[f32], dst: &mut [u8], importance: Option<&[f32]>) {
    kquant::quantize_row(src, dst, importance, quantize_block);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        for seed in 0..64u8 {
            let sc: [u8; 8] =
                std::array::from_fn(|j| seed.wrapping_mul(7).wrapping_add(9 * j as u8) & 63);
            let m: [u8; 8] =
                std::array::from_fn(|j| seed.wrapping_mul(13).wrapping_add(5 * j as u8 + 1) & 63);
            assert_eq!(unpack_scales(&pack_scales(&sc, &m)), (sc, m));
        }
    }
}
