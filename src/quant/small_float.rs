//! Small float formats of the model (QUANTS.md §10) and ds4's two KV
//! quantisation simulations (MODEL.md §3.5.1).
//!
//! DeepSeek V4 runs its KV cache through FP8 (E4M3FN) and its indexer
//! through a Hadamard rotation plus FP4 (E2M1), both with power-of-two
//! (UE8M0) block scales. ds4 does not store those formats; it rounds f32
//! values to them and back ("round trips") so the numbers match the official
//! inference graph. The rounding rule everywhere is nearest representable
//! value after clamping to the format's range, ties to the even code index.
//! All arithmetic is f32, as in ds4.

/// Largest finite E4M3FN magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// E2M1 magnitudes by code 0..7.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// KV FP8 block width (MODEL.md §3.5.1).
pub const FP8_BLOCK: usize = 64;
/// Indexer FP4 block width (MODEL.md §3.5.1).
pub const FP4_BLOCK: usize = 32;
/// Floor on the FP8 block amax, so an all-zero block gets a finite scale.
pub const FP8_AMAX_FLOOR: f32 = 1e-4;
/// Floor on the FP4 block amax (6·2^-126: keeps `amax/6` a normal f32).
pub const FP4_AMAX_FLOOR: f32 = 6.0 * f32::MIN_POSITIVE; // 7.052966104933725e-38

/// Magnitude code (exponent·8 + mantissa, 0..=126) of the E4M3FN value
/// nearest to `a` (≥ 0, already clamped to 448), ties to the even code.
fn e4m3_code(a: f32) -> u32 {
    // Codes are consecutive along the value axis, and within one binade the
    // step is constant, so the code is a binade base plus a rounded offset;
    // bases are multiples of 8, so rounding the offset half-to-even gives the
    // even code on ties. Scalings by powers of two here are exact.
    if a < 2f32.powi(-6) {
        // Subnormals (and zero): value = m·2^-9, codes 0..8 (8 = 2^-6).
        return (a * 512.0).round_ties_even() as u32;
    }
    let e = ((a.to_bits() >> 23) as i32 - 127).min(8); // a ≤ 448 < 2^9
    let m = (a / 2f32.powi(e) - 1.0) * 8.0; // 0 ≤ m < 8
    ((e + 7) * 8) as u32 + m.round_ties_even() as u32
}

/// Value of an E4M3FN magnitude code (0..=126).
fn e4m3_value(code: u32) -> f32 {
    let (e, m) = ((code >> 3) as i32, (code & 7) as f32);
    if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// Rounds to the nearest E4M3FN value after clamping to ±448; ties go to the
/// even code. NaN stays NaN; the sign of zero is kept.
pub fn round_e4m3(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs().min(E4M3_MAX);
    e4m3_value(e4m3_code(a)).copysign(v)
}

/// Encodes to an E4M3FN byte (sign bit 7), same rounding as [`round_e4m3`];
/// NaN encodes as 0x7F.
pub fn e4m3_encode(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let code = e4m3_code(v.abs().min(E4M3_MAX)) as u8;
    code | if v.is_sign_negative() { 0x80 } else { 0 }
}

/// Decodes an E4M3FN byte; 0x7F/0xFF are NaN.
pub fn e4m3_decode(b: u8) -> f32 {
    let code = (b & 0x7f) as u32;
    let v = if code == 0x7f {
        f32::NAN
    } else {
        e4m3_value(code)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// Index 0..=7 of the E2M1 magnitude nearest to `a` (≥ 0, clamped to 6),
/// ties to the even index. Same construction as [`e4m3_code`]: three runs of
/// constant step (0.5 below 2, 1 up to 4, 2 up to 6) starting at even indices.
fn e2m1_code(a: f32) -> u32 {
    if a < 2.0 {
        (a * 2.0).round_ties_even() as u32
    } else if a < 4.0 {
        4 + (a - 2.0).round_ties_even() as u32
    } else {
        6 + ((a - 4.0) * 0.5).round_ties_even() as u32
    }
}

/// Rounds to the nearest E2M1 value after clamping to ±6; ties go to the
/// even table index. NaN stays NaN.
pub fn round_e2m1(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    E2M1_VALUES[e2m1_code(v.abs().min(E2M1_MAX)) as usize].copysign(v)
}

/// Encodes to a 4-bit E2M1 code (sign bit 3), same rounding as [`round_e2m1`].
pub fn e2m1_encode(v: f32) -> u8 {
    let code = e2m1_code(v.abs().min(E2M1_MAX)) as u8; // NaN → 0 via `as`
    code | if v.is_sign_negative() { 8 } else { 0 }
}

/// Decodes a 4-bit E2M1 code (only the low 4 bits are used).
pub fn e2m1_decode(c: u8) -> f32 {
    let v = E2M1_VALUES[(c & 7) as usize];
    if c & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Decodes a UE8M0 scale byte: `2^(e−127)`. 0xFF is NaN in the OCP MX spec.
pub fn e8m0_decode(e: u8) -> f32 {
    if e == 0xff {
        return f32::NAN;
    }
    // 2^(e-127) for e ≥ 1 is the f32 with that biased exponent; e = 0 is
    // 2^-127, an f32 subnormal.
    if e == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        f32::from_bits((e as u32) << 23)
    }
}

/// `2^ceil(log2(amax / fmax))`, the UE8M0 block scale. Evaluated literally
/// in f32 as the model's reference code does (log2, ceil, exp2); where f32
/// `log2` rounds a ratio just above a power of two down onto it, the scale is
/// one binade smaller and the clamp in the callers absorbs the overshoot.
fn pow2_scale(amax: f32, fmax: f32) -> f32 {
    (amax / fmax).log2().ceil().exp2()
}

/// ds4's FP8 KV simulation (MODEL.md §3.5.1): on dims `0..len−n_rot`, in
/// blocks of 64 (a shorter final block if the width is not a multiple of
/// 64), [`fp8_roundtrip`]. The last `n_rot` (RoPE) dims are left alone.
/// `n_rot > len` leaves the row untouched.
pub fn fp8_kv_roundtrip(row: &mut [f32], n_rot: usize) {
    let n = row.len().saturating_sub(n_rot);
    fp8_roundtrip(&mut row[..n], FP8_BLOCK);
}

/// The official FP8 activation round trip (`act_quant` with UE8M0 scales),
/// in blocks of `block` (a shorter final block if needed): each value
/// becomes `E4M3(clamp(x/scale, ±448))·scale` with
/// `scale = 2^ceil(log2(max(amax, 1e-4)/448))`.
pub fn fp8_roundtrip(v: &mut [f32], block: usize) {
    for block in v.chunks_mut(block) {
        let scale = pow2_scale(block_amax(block).max(FP8_AMAX_FLOOR), E4M3_MAX);
        for x in block.iter_mut() {
            *x = round_e4m3((*x / scale).clamp(-E4M3_MAX, E4M3_MAX)) * scale;
        }
    }
}

fn block_amax(block: &[f32]) -> f32 {
    block.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// In-place orthonormal Walsh–Hadamard transform in natural (Sylvester)
/// order: butterflies `(a, b) → (a+b, a−b)` with strides 1, 2, …, n/2, then
/// a multiply by `1/sqrt(n)`.
///
/// # Panics
/// If the length is not a power of two.
pub fn hadamard_inplace(v: &mut [f32]) {
    let n = v.len();
    assert!(
        n.is_power_of_two(),
        "Hadamard length {n} is not a power of two"
    );
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (v[j], v[j + h]);
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let s = 1.0 / (n as f32).sqrt();
    for x in v.iter_mut() {
        *x *= s;
    }
}

/// FP4 round trip in blocks of 32 (a shorter final block if needed):
/// [`fp4_roundtrip_blocks`] with V4's indexer block.
pub fn fp4_roundtrip(v: &mut [f32]) {
    fp4_roundtrip_blocks(v, FP4_BLOCK);
}

/// The official FP4 activation round trip with UE8M0 scales
/// (`fp4_act_quant`, V4's and V4.1's indexer), in blocks of `block`:
/// `scale = 2^ceil(log2(max(amax, 7.05e-38)/6))`, value →
/// `E2M1(clamp(x/scale, ±6))·scale`.
pub fn fp4_roundtrip_blocks(v: &mut [f32], block: usize) {
    for block in v.chunks_mut(block) {
        let scale = pow2_scale(block_amax(block).max(FP4_AMAX_FLOOR), E2M1_MAX);
        for x in block.iter_mut() {
            *x = round_e2m1((*x / scale).clamp(-E2M1_MAX, E2M1_MAX)) * scale;
        }
    }
}

/// Floor on the FP4 block amax under an E4M3 scale (6·2^-9: the scale is at
/// least E4M3's smallest subnormal).
pub const FP4_E4M3_AMAX_FLOOR: f32 = 6.0 / 512.0;

/// The official FP4 round trip with E4M3 scales (`fp4_act_quant` with
/// `scale_dtype=float8_e4m3fn`, V4.1's compressed latents, blocks of 16):
/// `scale = E4M3(max(amax, 6·2^-9)/6)` (not a power of two, so the
/// division by it is a true f32 division), value →
/// `E2M1(clamp(x/scale, ±6))·scale`.
pub fn fp4_e4m3_roundtrip_blocks(v: &mut [f32], block: usize) {
    for block in v.chunks_mut(block) {
        let scale = round_e4m3(block_amax(block).max(FP4_E4M3_AMAX_FLOOR) / E2M1_MAX);
        for x in block.iter_mut() {
            *x = round_e2m1((*x / scale).clamp(-E2M1_MAX, E2M1_MAX)) * scale;
        }
    }
}

/// ds4's indexer simulation (MODEL.md §3.5.1) on one head (128 wide in the
/// model): Walsh–Hadamard rotation, then the FP4 round trip.
///
/// # Panics
/// If the head width is not a power of two.
pub fn hadamard_fp4_roundtrip(head: &mut [f32]) {
    hadamard_inplace(head);
    fp4_roundtrip(head);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_codes_decode_and_round_to_themselves() {
        for b in 0..=255u8 {
            let v = e4m3_decode(b);
            if b & 0x7f == 0x7f {
                assert!(v.is_nan());
                continue;
            }
            assert_eq!(round_e4m3(v).to_bits(), v.to_bits(), "{b:#x}");
            assert_eq!(e4m3_encode(v), b);
        }
        assert_eq!(e4m3_decode(0x7e), 448.0);
        assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_decode(0x08), 2f32.powi(-6));
    }

    #[test]
    fn e4m3_nearest_and_ties_to_even_code() {
        // Brute-force reference: scan all codes for the nearest value.
        let brute = |a: f32| -> f32 {
            let mut best = (0u32, f32::INFINITY);
            for c in 0..127u32 {
                let d = (e4m3_value(c) - a).abs();
                if d < best.1 || (d == best.1 && c % 2 == 0) {
                    best = (c, d);
                }
            }
            e4m3_value(best.0)
        };
        for c in 0..126u32 {
            let (lo, hi) = (e4m3_value(c), e4m3_value(c + 1));
            let mid = 0.5 * (lo + hi); // exact in f32
            let want = if c % 2 == 0 { lo } else { hi };
            assert_eq!(round_e4m3(mid), want, "tie between codes {c} and {}", c + 1);
            assert_eq!(round_e4m3(-mid), -want);
            for t in [0.1f32, 0.3, 0.49, 0.51, 0.7, 0.9] {
                let a = lo + t * (hi - lo);
                assert_eq!(round_e4m3(a), brute(a), "a={a}");
            }
        }
        assert_eq!(round_e4m3(1e9), 448.0);
        assert_eq!(round_e4m3(-470.0), -448.0);
        assert_eq!(round_e4m3(2f32.powi(-10)), 0.0); // tie 0 vs 2^-9 → code 0
        assert_eq!(round_e4m3(3.0 * 2f32.powi(-10)), 2.0 * 2f32.powi(-9));
    }

    #[test]
    fn e2m1_nearest_and_ties_to_even_index() {
        let cases = [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.01, 6.0),
            (4.99, 4.0),
            (0.26, 0.5),
            (7.0, 6.0),
            (-2.5, -2.0),
            (-5.0, -4.0),
            (-100.0, -6.0),
        ];
        for (x, want) in cases {
            assert_eq!(round_e2m1(x), want, "x={x}");
        }
        for c in 0..16u8 {
            if c != 8 {
                assert_eq!(e2m1_encode(e2m1_decode(c)), c);
            }
        }
    }

    #[test]
    fn e8m0_values() {
        assert_eq!(e8m0_decode(127), 1.0);
        assert_eq!(e8m0_decode(128), 2.0);
        assert_eq!(e8m0_decode(120), 2f32.powi(-7));
        assert_eq!(e8m0_decode(0), 2f32.powi(-127));
        assert_eq!(e8m0_decode(254), 2f32.powi(127));
        assert!(e8m0_decode(255).is_nan());
    }

    #[test]
    fn fp8_kv_roundtrip_blocks_and_rope_dims() {
        let mut row: Vec<f32> = (0..512)
            .map(|i| ((i * 7919) % 1000) as f32 / 97.0 - 5.0)
            .collect();
        let orig = row.clone();
        fp8_kv_roundtrip(&mut row, 64);
        assert_eq!(&row[448..], &orig[448..]);
        for b in 0..7 {
            let blk = &orig[64 * b..64 * b + 64];
            let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = 2f32.powf((amax / 448.0).log2().ceil());
            for i in 0..64 {
                let want = round_e4m3(blk[i] / scale) * scale;
                assert_eq!(row[64 * b + i], want);
                // Relative error of E4M3 is at most 2^-4.
                assert!(
                    (row[64 * b + i] - blk[i]).abs() <= blk[i].abs() / 16.0 + scale * 2f32.powi(-9)
                );
            }
        }
        // An all-zero block stays zero (amax floor keeps the scale finite).
        let mut z = vec![0.0f32; 128];
        fp8_kv_roundtrip(&mut z, 64);
        assert!(z.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn hadamard_is_orthonormal_and_preserves_dot_products() {
        let n = 128;
        let q: Vec<f32> = (0..n).map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0).collect();
        let k: Vec<f32> = (0..n)
            .map(|i| ((i * 13 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let dot = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (*x as f64) * (*y as f64))
                .sum::<f64>()
        };
        let (mut hq, mut hk) = (q.clone(), k.clone());
        hadamard_inplace(&mut hq);
        hadamard_inplace(&mut hk);
        let (d0, d1) = (dot(&q, &k), dot(&hq, &hk));
        assert!(
            (d0 - d1).abs() <= 1e-4 * dot(&q, &q).sqrt() * dot(&k, &k).sqrt(),
            "{d0} vs {d1}"
        );
        assert!((dot(&q, &q) - dot(&hq, &hq)).abs() <= 1e-4 * dot(&q, &q));
        // Applying it twice is the identity (H is symmetric and orthonormal).
        hadamard_inplace(&mut hq);
        for (a, b) in hq.iter().zip(&q) {
            assert!((a - b).abs() < 1e-5);
        }
        // Row 0 of H is all ones: the first output is sum/sqrt(n).
        let mut e = vec![1.0f32; n];
        hadamard_inplace(&mut e);
        assert!((e[0] - (n as f32).sqrt()).abs() < 1e-4);
        assert!(e[1..].iter().all(|&v| v.abs() < 1e-6));
    }

    #[test]
    fn fp4_roundtrip_values_are_scaled_e2m1() {
        let mut v: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 64) as f32 - 32.0) / 10.0)
            .collect();
        let orig = v.clone();
        fp4_roundtrip(&mut v);
        for b in 0..4 {
            let blk = &orig[32 * b..32 * b + 32];
            let amax = blk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let scale = 2f32.powf((amax / 6.0).log2().ceil());
            for i in 0..32 {
                let r = v[32 * b + i] / scale;
                assert!(E2M1_VALUES.contains(&r.abs()), "{r}");
                assert_eq!(v[32 * b + i], round_e2m1(blk[i] / scale) * scale);
            }
        }
        let mut z = vec![0.0f32; 32];
        fp4_roundtrip(&mut z);
        assert!(z.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn fp8_act_roundtrip_blocks_of_32_ties_to_even() {
        // Block 0: amax 448 gives scale 1; the others sit halfway between
        // two E4M3 codes and go to the even one. Block 1 is all zeros (the
        // 1e-4 floor keeps the scale finite). Block 2 is short.
        let mut v = vec![0f32; 70];
        v[..6].copy_from_slice(&[448.0, 1.0625, -17.0, 4.5 / 512.0, 3.125, -1.5 / 512.0]);
        v[64..].copy_from_slice(&[0.3, -0.05, 0.0, 0.0, 0.0, 0.0]);
        fp8_roundtrip(&mut v, 32);
        assert_eq!(
            &v[..6],
            &[448.0, 1.0, -16.0, 4.0 / 512.0, 3.0, -2.0 / 512.0]
        );
        assert!(v[6..64].iter().all(|&x| x == 0.0));
        // amax 0.3: scale 2^ceil(log2(0.3/448)) = 2^-10; 0.3·1024 = 307.2
        // → 320 (E4M3 step 32 in [256, 512)), −51.2 → −52 (step 4).
        assert_eq!(&v[64..66], &[320.0 / 1024.0, -52.0 / 1024.0]);
    }

    #[test]
    fn fp4_with_e4m3_scales_rounds_the_scale_and_the_values() {
        // amax 4.5: scale E4M3(0.75) = 0.75; values at E2M1 ties (x/0.75 =
        // 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) go to the even code.
        let mut v = vec![4.5f32, 0.1875, -0.5625, 0.9375, 1.3125, -1.875, 2.625, 3.75];
        v.resize(16, 0.0);
        fp4_e4m3_roundtrip_blocks(&mut v, 16);
        assert_eq!(&v[..8], &[4.5, 0.0, -0.75, 0.75, 1.5, -1.5, 3.0, 3.0]);
        // amax 1: scale E4M3(1/6) = 0.171875 (11·2^-6), so 1 → 6·0.171875.
        let mut w = vec![1.0f32, 0.0, 0.0];
        fp4_e4m3_roundtrip_blocks(&mut w, 16);
        assert_eq!(w, vec![1.03125, 0.0, 0.0]);
        // An all-zero block stays zero (scale floor 2^-9).
        let mut z = vec![0f32; 16];
        fp4_e4m3_roundtrip_blocks(&mut z, 16);
        assert!(z.iter().all(|&x| x == 0.0));
    }
}
