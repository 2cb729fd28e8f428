//! Q8_0 (type 8, QUANTS.md §3): 32 int8 values sharing one f16 scale.
//!
//! Used for the attention projections, shared experts and the LM head. The
//! quantizer is the exact reference algorithm (amax/127, round half away from
//! zero with the un-rounded f32 scale) so rows we write match other writers
//! byte for byte; importance weights cannot improve a symmetric 8-bit code
//! enough to justify diverging from that, so they are ignored.

use super::f16::{f16_bits_to_f32, f32_to_f16_bits};
use bytemuck::{Pod, Zeroable};

/// Values per block.
pub const QK8_0: usize = 32;

/// One Q8_0 block as stored in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Quants; value = f16(d)·qs.
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

fn blocks(src: &[u8]) -> impl Iterator<Item = BlockQ8_0> + '_ {
    super::blocks(src)
}

/// Decodes a Q8_0 row. Panics if `src` is not exactly `dst.len()/32` blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK8_0 == 0 && src.len() == dst.len() / QK8_0 * 34);
    for (b, out) in blocks(src).zip(dst.chunks_exact_mut(QK8_0)) {
        let d = f16_bits_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            // q·d in this order, as gguf-py does (the product is exact-order
            // independent anyway: one rounding).
            *o = q as f32 * d;
        }
    }
}

/// Dot of a Q8_0 row with `x`: per block `d·Σ qs·x` in f32, blocks summed
/// in f32. Differs from dequantize-then-dot only by f32 rounding.
pub fn dot_row(src: &[u8], x: &[f32]) -> f32 {
    assert!(x.len() % QK8_0 == 0 && src.len() == x.len() / QK8_0 * 34);
    let mut acc = 0.0f32;
    for (b, xs) in blocks(src).zip(x.chunks_exact(QK8_0)) {
        let s: f32 = b.qs.iter().zip(xs).map(|(&q, &v)| q as f32 * v).sum();
        acc += f16_bits_to_f32(b.d) * s;
    }
    acc
}

/// `y` rounded half away from zero (C's `roundf`, what the reference
/// uses), for |y| < 2^23, NaN as 0: the truncation and the exact fraction
/// `y − trunc(y)` decide. Unlike `f32::round`, which is a `roundf` call on
/// baseline x86-64 (no SSE4.1) and was a third of a q8 conversion's time,
/// this vectorizes.
#[inline]
fn round_half_away(y: f32) -> i32 {
    let t = y as i32;
    let f = y - t as f32;
    t + (f >= 0.5) as i32 - (f <= -0.5) as i32
}

/// Quantizes one block of 32 values with the reference rule (QUANTS.md §3).
pub fn quantize_block(x: &[f32]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_0];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_half_away(v * id).clamp(-128, 127) as i8;
    }
    BlockQ8_0 {
        d: f32_to_f16_bits(d),
        qs,
    }
}

/// Quantizes a row; `importance` is accepted for a uniform signature and
/// ignored (see the module doc).
pub fn quantize_row(src: &[f32], dst: &mut [u8], _importance: Option<&[f32]>) {
    assert!(src.len() % QK8_0 == 0 && dst.len() == src.len() / QK8_0 * 34);
    for (x, out) in src.chunks_exact(QK8_0).zip(dst.chunks_exact_mut(34)) {
        out.copy_from_slice(bytemuck::bytes_of(&quantize_block(x)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_rounding_half_away_from_zero() {
        // amax = 127 → d = 1, so x·id is x itself and halves are visible.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        x[4] = -126.5;
        let b = quantize_block(&x);
        assert_eq!(&b.qs[..5], &[127, 3, -3, 1, -127]);
        assert_eq!(b.d, 0x3c00);
        let z = quantize_block(&[0.0; 32]);
        assert_eq!(z.d, 0);
        assert!(z.qs.iter().all(|&q| q == 0));
    }

    #[test]
    fn round_half_away_is_f32_round_on_the_q8_range() {
        // Every f32 of a few ulps around each half and integer in ±128, and
        // a sweep of the range: the result equals `f32::round` (C roundf).
        let mut ys = vec![0.0f32, -0.0, f32::NAN];
        for k in -257..=257 {
            let c = k as f32 * 0.5;
            let mut up = c;
            let mut down = c;
            for _ in 0..4 {
                ys.extend([up, down]);
                up = f32::from_bits(if up >= 0.0 {
                    up.to_bits() + 1
                } else {
                    up.to_bits() - 1
                });
                down = if down == 0.0 {
                    -f32::from_bits(1)
                } else {
                    f32::from_bits(if down > 0.0 {
                        down.to_bits() - 1
                    } else {
                        down.to_bits() + 1
                    })
                };
            }
        }
        ys.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.001_27));
        for y in ys {
            let want = if y.is_nan() { 0 } else { y.round() as i32 };
            assert_eq!(round_half_away(y), want, "{y:e}");
        }
    }
}
