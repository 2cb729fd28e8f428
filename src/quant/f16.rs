//! Scalar 16-bit floats: IEEE binary16 (F16) and bfloat16 (BF16), QUANTS.md §2.
//!
//! The bit-level conversions here are the ones the whole engine uses: the
//! loader widens F16/BF16 weights, the KV cache narrows rows to f16 and the
//! converters write F16/BF16 tensors. Narrowing is written out by hand rather
//! than taken from `half` because the spec pins the NaN result (quiet 0x7E00
//! with the input's sign) and `half` keeps NaN payload bits; rounding is
//! otherwise identical and the tests check that against `half`. The row
//! helpers for F32/F16/BF16 tensors live here too, so the dispatch in
//! `mod.rs` treats them like any block format with one-element blocks.

/// Widens an f16 bit pattern to f32. Exact for every finite value and
/// infinity; a NaN keeps its sign and payload and comes out quiet (as F16C
/// and ARM hardware do).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal m·2^-24: normalise by shifting the leading one into the
            // implicit position. `lz` counts how far it sits below bit 10.
            let lz = man.leading_zeros() - 21; // 1..=10
            let man = (man << lz) & 0x3ff;
            let e = 127 - 15 + 1 - lz;
            sign | (e << 23) | (man << 13)
        }
        31 if man == 0 => sign | 0x7f80_0000,
        31 => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Narrows f32 to an f16 bit pattern: round to nearest, ties to even; values
/// at or below half the smallest subnormal become ±0; overflow gives ±inf;
/// NaN gives 0x7E00 with the input's sign.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let sign = ((u >> 16) & 0x8000) as u16;
    let a = u & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    // 65520 is halfway between 65504 (odd mantissa) and 2^16, so it and
    // everything above rounds to infinity.
    if a >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    let exp = (a >> 23) as i32 - 127;
    if exp >= -14 {
        // Normal f16: drop 13 mantissa bits with round-to-nearest-even. A
        // carry out of the mantissa correctly bumps the exponent.
        let h = (((exp + 15) as u32) << 10) | ((a >> 13) & 0x3ff);
        let rem = a & 0x1fff;
        let up = rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1);
        return sign | (h + up as u32) as u16;
    }
    // Subnormal f16 (unit 2^-24): value/2^-24 = m·2^(exp+1) with m the 24-bit
    // significand, i.e. a right shift by -(exp+1) >= 14.
    let shift = (-(exp + 1)) as u32;
    if shift > 24 {
        return sign; // below 2^-25: rounds to zero
    }
    let m = (a & 0x7f_ffff) | 0x80_0000;
    let h = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && (h & 1) == 1);
    sign | (h + up as u32) as u16
}

/// Widens a bf16 bit pattern: it is the upper half of an f32.
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Narrows f32 to bf16 with round-to-nearest-even on the dropped 16 bits;
/// NaN is forced quiet first so rounding can never turn it into infinity.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let mut u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        u = (u & 0xffff_0000) | 0x0040_0000;
    }
    ((u as u64 + 0x7fff + ((u >> 16) & 1) as u64) >> 16) as u16
}

// ---- rows of scalar types (lengths are checked by the dispatch in mod.rs) ----

fn f32_at(src: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(src[4 * i..4 * i + 4].try_into().unwrap())
}

fn u16_at(src: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([src[2 * i], src[2 * i + 1]])
}

/// F32 row bytes → f32. Panics if `src.len() != 4·dst.len()`.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 4 * dst.len());
    for (i, d) in dst.iter_mut().enumerate() {
        *d = f32_at(src, i);
    }
}

/// F16 row bytes → f32. Panics if `src.len() != 2·dst.len()`.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len());
    for (i, d) in dst.iter_mut().enumerate() {
        *d = f16_bits_to_f32(u16_at(src, i));
    }
}

/// BF16 row bytes → f32. Panics if `src.len() != 2·dst.len()`.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len());
    for (i, d) in dst.iter_mut().enumerate() {
        *d = bf16_bits_to_f32(u16_at(src, i));
    }
}

/// Dot of an F32 row with `x`, f32 accumulation in element order.
pub fn dot_row_f32(src: &[u8], x: &[f32]) -> f32 {
    assert_eq!(src.len(), 4 * x.len());
    x.iter().enumerate().map(|(i, &v)| f32_at(src, i) * v).sum()
}

/// Dot of an F16 row with `x`, f32 accumulation in element order.
pub fn dot_row_f16(src: &[u8], x: &[f32]) -> f32 {
    assert_eq!(src.len(), 2 * x.len());
    x.iter()
        .enumerate()
        .map(|(i, &v)| f16_bits_to_f32(u16_at(src, i)) * v)
        .sum()
}

/// Dot of a BF16 row with `x`, f32 accumulation in element order.
pub fn dot_row_bf16(src: &[u8], x: &[f32]) -> f32 {
    assert_eq!(src.len(), 2 * x.len());
    x.iter()
        .enumerate()
        .map(|(i, &v)| bf16_bits_to_f32(u16_at(src, i)) * v)
        .sum()
}

/// f32 → F32 row bytes (little-endian copy).
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), 4 * src.len());
    for (d, &v) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

/// f32 → F16 row bytes with [`f32_to_f16_bits`].
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len());
    for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_f16_bits(v).to_le_bytes());
    }
}

/// f32 → BF16 row bytes with [`f32_to_bf16_bits`].
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len());
    for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16_bits(v).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiny deterministic generator (splitmix64) so tests need no extra crate.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    #[test]
    fn f16_widening_matches_half_for_all_non_nan() {
        for h in 0..=u16::MAX {
            let ours = f16_bits_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan());
                assert_eq!(ours.to_bits() & 0x8000_0000, ((h as u32) & 0x8000) << 16);
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "h={h:#06x}");
            }
        }
    }

    #[test]
    fn f16_narrowing_matches_half_on_random_and_boundary_bits() {
        let mut s = 7u64;
        let check = |u: u32| {
            let x = f32::from_bits(u);
            if x.is_nan() {
                return;
            }
            assert_eq!(
                f32_to_f16_bits(x),
                half::f16::from_f32(x).to_bits(),
                "x={x:e} ({u:#x})"
            );
        };
        for _ in 0..200_000 {
            check(splitmix(&mut s) as u32);
        }
        // Every f16 value, and the exact midpoints/neighbours around them.
        for h in 0..0x7c00u32 {
            let v = f16_bits_to_f32(h as u16).to_bits();
            for d in [0u32, 1, 0x0fff, 0x1000, 0x1001, 0x1fff] {
                check(v.wrapping_add(d));
                check(v.wrapping_add(d) | 0x8000_0000);
            }
        }
    }

    #[test]
    fn f16_narrowing_edge_cases() {
        assert_eq!(f32_to_f16_bits(0.0), 0x0000);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65519.99), 0x7bff);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // tie → even → inf
        assert_eq!(f32_to_f16_bits(-1e9), 0xfc00);
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16_bits(f32::NAN), 0x7e00);
        assert_eq!(f32_to_f16_bits(-f32::NAN), 0xfe00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(0x7f80_0001)), 0x7e00);
        // Ties to even in the normal range: 1 + 2^-11 is halfway 1 → 1+2^-10.
        assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Subnormals: 2^-24 is the smallest; 2^-25 ties to 0; just above → 1.
        assert_eq!(f32_to_f16_bits(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16_bits(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16_bits(-2f32.powi(-25)), 0x8000);
        assert_eq!(
            f32_to_f16_bits(f32::from_bits(2f32.powi(-25).to_bits() + 1)),
            0x0001
        );
        assert_eq!(f32_to_f16_bits(1.5 * 2f32.powi(-24)), 0x0002); // tie → even
        assert_eq!(f32_to_f16_bits(2.5 * 2f32.powi(-24)), 0x0002); // tie → even
                                                                   // Largest subnormal rounding up into the smallest normal.
        assert_eq!(f32_to_f16_bits(2f32.powi(-14) - 2f32.powi(-26)), 0x0400);
        assert_eq!(f16_bits_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_bits_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
    }

    #[test]
    fn bf16_narrowing_edge_cases() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // Exactly halfway between 0x3f80 and 0x3f81 → even (0x3f80); next one up.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80); // overflow → inf
        assert_eq!(f32_to_bf16_bits(f32::NEG_INFINITY), 0xff80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0xffff_ffff)), 0xffff);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x0000_8000)), 0x0000); // subnormal tie
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x0001_8000)), 0x0002);
        assert_eq!(bf16_bits_to_f32(0xc040), -3.0);
        let mut s = 3u64;
        for _ in 0..100_000 {
            let u = splitmix(&mut s) as u32;
            let x = f32::from_bits(u);
            if !x.is_nan() {
                assert_eq!(
                    f32_to_bf16_bits(x),
                    half::bf16::from_f32(x).to_bits(),
                    "{u:#x}"
                );
            }
        }
    }
}
