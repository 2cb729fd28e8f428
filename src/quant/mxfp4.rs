//! MXFP4 (type 39, QUANTS.md §11): 32 E2M1 values sharing one E8M0 scale.
//!
//! ds4's `ds4f-mxfp4` file stores DeepSeek's own FP4 routed-expert weights in
//! this block without loss. Decoding is exact in f32: the scale is a power of
//! two and the code values are small integers (the E2M1 values doubled, with
//! the scale halved to match, as gguf-py and GGML do).
//!
//! The quantizer is gguf-py's `MXFP4.quantize_blocks` rule, reproduced so the
//! test models we write equal gguf-py's bytes (checked by a fixture); it exists
//! for test models only, the published file is repacked, not quantized.

use bytemuck::{Pod, Zeroable};

/// Values per block.
pub const QK_MXFP4: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 17;

/// The code table: E2M1 values doubled, indexed by the 4-bit code. Code 8 is
/// "−0" in E2M1 and decodes to +0 here, as in gguf-py (an integer 0 table).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// [`KVALUES`] as f32 (exact), for the decoder's inner loop.
const KVALUES_F32: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES[i] as f32;
        i += 1;
    }
    t
};

/// One MXFP4 block as stored in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockMxfp4 {
    /// E8M0 scale byte.
    pub e: u8,
    /// Codes: element `j` (0..16) in the low nibble of `qs[j]`, element
    /// `j + 16` in the high nibble.
    pub qs: [u8; QK_MXFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == BLOCK_BYTES);

/// The block scale for the doubled code table: 2^(e−128) as an f32 bit
/// pattern (GGML's `ggml_e8m0_to_fp32_half`). Subnormal for e = 0 and 1;
/// e = 255 is 2^127, not NaN (E8M0's NaN code is not given meaning here, as
/// in gguf-py).
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 32 codes of a block in element order.
fn codes(b: &BlockMxfp4) -> impl Iterator<Item = u8> + '_ {
    b.qs.iter()
        .map(|q| q & 0x0F)
        .chain(b.qs.iter().map(|q| q >> 4))
}

fn blocks(src: &[u8]) -> impl Iterator<Item = BlockMxfp4> + '_ {
    super::blocks(src)
}

/// Decodes an MXFP4 row: `d · kvalues[code]`, one exact f32 product per value
/// (it overflows to ±inf only for scale bytes ≥ 253 with large codes, exactly
/// as gguf-py does). Panics if `src` is not exactly `dst.len()/32` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK_MXFP4 == 0 && src.len() == dst.len() / QK_MXFP4 * BLOCK_BYTES);
    for (b, out) in blocks(src).zip(dst.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(b.e);
        // Both halves of the block at once, in storage order (low nibbles
        // are elements 0..16, high nibbles 16..32).
        let (lo, hi) = out.split_at_mut(QK_MXFP4 / 2);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b.qs) {
            *l = d * KVALUES_F32[(q & 0x0F) as usize];
            *h = d * KVALUES_F32[(q >> 4) as usize];
        }
    }
}

/// Dot of an MXFP4 row with `x`: per block `d·Σ k·x` in f32, blocks summed in
/// f32. Differs from dequantize-then-dot only by f32 rounding.
pub fn dot_row(src: &[u8], x: &[f32]) -> f32 {
    assert!(x.len() % QK_MXFP4 == 0 && src.len() == x.len() / QK_MXFP4 * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, xs) in blocks(src).zip(x.chunks_exact(QK_MXFP4)) {
        let s: f32 = codes(&b)
            .zip(xs)
            .map(|(c, &v)| KVALUES_F32[c as usize] * v)
            .sum();
        acc += e8m0_to_f32_half(b.e) * s;
    }
    acc
}

/// The scale byte gguf-py picks for a block whose largest magnitude is
/// `amax`: `floor(log2(amax)) − 2 + 127`, 0 for an all-zero block.
///
/// gguf-py takes numpy's float32 `log2`; its floor equals the floor of the
/// correctly rounded f32 logarithm, which is what `f64::log2` rounded to f32
/// gives (checked on every f32 just below a power of two by the fixture). For
/// `amax < 2^-125` gguf-py casts a negative number to u8 (platform-defined);
/// we use the smallest scale, 0, instead — such blocks never occur in weights.
fn scale_byte(amax: f32) -> u8 {
    if amax.is_nan() || amax <= 0.0 {
        return 0;
    }
    let l = ((amax as f64).log2() as f32).floor();
    (l - 2.0 + 127.0).clamp(0.0, 255.0) as u8
}

/// Quantizes one block of 32 values with gguf-py's rule (QUANTS.md §11): each
/// value takes the code whose `d·k` is nearest, the first in table order on a
/// tie, distances computed in f32 as gguf-py does.
pub fn quantize_block(x: &[f32]) -> BlockMxfp4 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let e = scale_byte(amax);
    let d = e8m0_to_f32_half(e);
    let mut code = [0u8; QK_MXFP4];
    for (c, &v) in code.iter_mut().zip(x) {
        let mut best = 0usize;
        let mut best_err = f32::INFINITY;
        for (i, &k) in KVALUES.iter().enumerate() {
            let err = (d * k as f32 - v).abs();
            if err < best_err {
                best = i;
                best_err = err;
            }
        }
        *c = best as u8;
    }
    let mut qs = [0u8; QK_MXFP4 / 2];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = code[j] | (code[j + QK_MXFP4 / 2] << 4);
    }
    BlockMxfp4 { e, qs }
}

/// Quantizes a row; `importance` is accepted for a uniform signature and
/// ignored (gguf-py's rule has no weights, and test models must match it).
pub fn quantize_row(src: &[f32], dst: &mut [u8], _importance: Option<&[f32]>) {
    assert!(src.len() % QK_MXFP4 == 0 && dst.len() == src.len() / QK_MXFP4 * BLOCK_BYTES);
    for (x, out) in src
        .chunks_exact(QK_MXFP4)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        out.copy_from_slice(bytemuck::bytes_of(&quantize_block(x)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            assert_eq!(
                e8m0_to_f32_half(e) as f64,
                2f64.powi(e as i32 - 128),
                "e = {e}"
            );
        }
    }

    #[test]
    fn exact_codes_round_trip() {
        // amax 12 → e = floor(log2 12) − 2 + 127 = 128, d = 1: codes are the
        // table values themselves.
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = KVALUES[i % 16] as f32;
        }
        let b = quantize_block(&x);
        assert_eq!(b.e, 128);
        let mut y = [f32::NAN; 32];
        dequantize_row(bytemuck::bytes_of(&b), &mut y);
        assert_eq!(x, y);
        // Ties go to the first entry: 2.5 → 2 (code 2), −2.5 → −2 (code 10).
        x[0] = 2.5;
        x[1] = -2.5;
        let b = quantize_block(&x);
        assert_eq!(b.qs[0] & 0x0F, 2);
        assert_eq!(b.qs[1] & 0x0F, 10);
        assert_eq!(quantize_block(&[0.0; 32]).e, 0);
    }
}
