//! Q8_K (type 15, QUANTS.md §8): ds4's CPU activation format for the routed
//! experts. Never stored in a GGUF file.
//!
//! An activation row is cut into 256-value blocks, each stored as int8 codes
//! with one f32 scale plus the 16 sums of consecutive 16-code runs (`bsums`),
//! which let the Q2_K dot product apply its per-sub-block mins without
//! touching the codes again. The quantizer mirrors ds4's rule exactly: the
//! signed element of largest magnitude maps to −127, rounding is half to even.

use bytemuck::{Pod, Zeroable};

/// Values per block: one K-quant super-block, so the K-quant dot products
/// (`q2_k::dot_q8k`) pair blocks one to one.
pub use super::kquant::QK_K;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 292;

/// One Q8_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale; value = d·qs.
    pub d: f32,
    /// Codes.
    pub qs: [i8; QK_K],
    /// `bsums[k] = Σ qs[16k .. 16k+16]`.
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == BLOCK_BYTES);

/// Quantizes 256 values (QUANTS.md §8). Panics if `x.len() != 256`.
pub fn quantize_block(x: &[f32]) -> BlockQ8K {
    assert_eq!(x.len(), QK_K);
    // Signed value of the largest magnitude; strict `>` keeps the first on ties.
    let mut amax = 0.0f32;
    let mut mx = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            mx = v;
        }
    }
    let mut b = BlockQ8K::zeroed();
    if mx == 0.0 {
        return b;
    }
    let iscale = -127.0 / mx;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = (iscale * v).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    for (k, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

/// Quantizes an activation row into blocks. Panics unless
/// `src.len() == 256·dst.len()`.
pub fn quantize_row_blocks(src: &[f32], dst: &mut [BlockQ8K]) {
    assert_eq!(src.len(), dst.len() * QK_K);
    for (b, x) in dst.iter_mut().zip(src.chunks_exact(QK_K)) {
        *b = quantize_block(x);
    }
}

/// Quantizes an activation row into block bytes (292 per 256 values).
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    assert!(src.len() % QK_K == 0 && dst.len() == src.len() / QK_K * BLOCK_BYTES);
    for (x, out) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        out.copy_from_slice(bytemuck::bytes_of(&quantize_block(x)));
    }
}

/// Decodes block bytes back to f32 (`d·qs`).
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK_K == 0 && src.len() == dst.len() / QK_K * BLOCK_BYTES);
    for (bytes, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let b: BlockQ8K = bytemuck::pod_read_unaligned(bytes);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_magnitude_maps_to_minus_127_and_bsums_add_up() {
        let mut x = [0.0f32; 256];
        for (i, v) in x.iter_mut().enumerate() {
            *v = ((i * 37 % 101) as f32 - 50.0) / 7.0;
        }
        x[3] = 20.0;
        x[9] = -20.0; // same magnitude, later: x[3] wins
        let b = quantize_block(&x);
        assert_eq!(b.qs[3], -127);
        assert_eq!(b.qs[9], 127);
        assert_eq!(b.d, 1.0 / (-127.0 / 20.0));
        for k in 0..16 {
            let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b.bsums[k] as i32, s);
        }
        // Ties go to even: with mx = -127, iscale = 1 and 2.5 → 2, 3.5 → 4.
        let mut y = [0.0f32; 256];
        y[0] = -127.0;
        y[1] = 2.5;
        y[2] = 3.5;
        y[3] = -0.5;
        let b = quantize_block(&y);
        assert_eq!(&b.qs[..4], &[-127, 2, 4, 0]);
        assert_eq!(quantize_block(&[0.0; 256]).d, 0.0);
    }
}
