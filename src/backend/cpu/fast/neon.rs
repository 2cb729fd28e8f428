//! AArch64 NEON kernels, in two variants generated from one body:
//! [`dotprod`] multiplies int8 vectors with `sdot` (four i8·i8 products
//! summed into each i32 lane; ARMv8.2 dotprod: Apple M1+, Graviton 2+,
//! Neoverse, Cortex-A76+), [`plain`] with `smull`/`smull2` + pairwise adds
//! (any ARMv8 CPU). `sdot` is written as inline assembly because its
//! `std::arch` intrinsic (`vdotq_s32`) is still unstable; the function
//! carrying it enables the `dotprod` target feature, so the instruction
//! exists only in code reached after runtime detection.
//!
//! NEON multiplies signed by signed, so the weights enter as signed codes
//! (Q2_K/Q4_K codes are small non-negative values, IQ2_XXS grid values get
//! their signs by a multiply with ±1, MXFP4 values come signed from a table
//! lookup) and each sub-block's exact i32 sum is scaled in integer, as in
//! the portable kernels. F16 rows use the portable kernel: the f16 vector
//! conversions need the unstable `f16` type.

#![allow(clippy::missing_safety_doc)]

use std::arch::aarch64::*;

/// `acc` + Σ of a·b over each 4 bytes, with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot16(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    std::arch::asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// `acc` + a·b summed into 4 i32 lanes (a different lane grouping than
/// `sdot`; the kernels only use the sum of all lanes).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn mull16(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// Sign patterns of `KSIGNS_IQ2XS` as 8 bytes of ±1 (bit set → −1).
static SIGNS_PM1: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut s = 0;
    while s < 128 {
        let bits = crate::quant::iq2xxs_tables::KSIGNS_IQ2XS[s];
        let mut v = 0u64;
        let mut i = 0;
        while i < 8 {
            let byte: u64 = if bits & (1 << i) != 0 { 0xFF } else { 0x01 };
            v |= byte << (8 * i);
            i += 1;
        }
        t[s] = v;
        s += 1;
    }
    t
};

macro_rules! neon_kernels {
    ($features:literal, $dot16:path) => {
        use std::arch::aarch64::*;

        use crate::backend::cpu::fast::act::BlockQ8x32;
        use crate::quant::f16::{bf16_bits_to_f32, f16_bits_to_f32};
        use crate::quant::iq2xxs_tables::IQ2XXS_GRID;
        use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES};
        use crate::quant::q4_k::unpack_scales;
        use crate::quant::q8_k::BlockQ8K;
        use $dot16 as dot16;

        #[inline]
        fn f16_at(b: *const u8) -> f32 {
            // SAFETY: callers pass a pointer inside a checked row.
            let h = unsafe { std::ptr::read_unaligned(b as *const u16) };
            f16_bits_to_f32(u16::from_le(h))
        }

        /// Σ a·b of 32 signed bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot32(a: *const i8, b: *const i8) -> i32 {
            let z = vdupq_n_s32(0);
            let s = dot16(z, vld1q_s8(a), vld1q_s8(b));
            vaddvq_s32(dot16(s, vld1q_s8(a.add(16)), vld1q_s8(b.add(16))))
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q2k(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 84);
            let m3 = vdupq_n_u8(3);
            let z = vdupq_n_s32(0);
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(84 * i);
                let d = f16_at(b.add(80)) * a.d;
                let dmin = f16_at(b.add(82)) * a.d;
                let sc = std::slice::from_raw_parts(b, 16);
                let mut sum_m = 0i32;
                for k in 0..16 {
                    sum_m += (sc[k] >> 4) as i32 * a.bsums[k] as i32;
                }
                let mut sumi = 0i32;
                for h in 0..2 {
                    let q0 = vld1q_u8(b.add(16 + 32 * h));
                    let q1 = vld1q_u8(b.add(32 + 32 * h));
                    for j in 0..4 {
                        let (c0, c1) = match j {
                            0 => (q0, q1),
                            1 => (vshrq_n_u8::<2>(q0), vshrq_n_u8::<2>(q1)),
                            2 => (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1)),
                            _ => (vshrq_n_u8::<6>(q0), vshrq_n_u8::<6>(q1)),
                        };
                        let c0 = vreinterpretq_s8_u8(vandq_u8(c0, m3));
                        let c1 = vreinterpretq_s8_u8(vandq_u8(c1, m3));
                        let x = a.qs.as_ptr().add(128 * h + 32 * j);
                        let s0 = vaddvq_s32(dot16(z, c0, vld1q_s8(x)));
                        let s1 = vaddvq_s32(dot16(z, c1, vld1q_s8(x.add(16))));
                        let k = 8 * h + 2 * j;
                        sumi += (sc[k] & 15) as i32 * s0 + (sc[k + 1] & 15) as i32 * s1;
                    }
                }
                acc += d * sumi as f32 - dmin * sum_m as f32;
            }
            acc
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4k(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 144);
            let m4 = vdupq_n_u8(15);
            let z = vdupq_n_s32(0);
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(144 * i);
                let d = f16_at(b) * a.d;
                let dmin = f16_at(b.add(2)) * a.d;
                let packed: [u8; 12] = std::ptr::read_unaligned(b.add(4) as *const [u8; 12]);
                let (sc, m) = unpack_scales(&packed);
                let mut sum_m = 0i32;
                for j in 0..8 {
                    sum_m += m[j] as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
                }
                let mut sumi = 0i32;
                for c in 0..4 {
                    let q0 = vld1q_u8(b.add(16 + 32 * c));
                    let q1 = vld1q_u8(b.add(32 + 32 * c));
                    let x = a.qs.as_ptr().add(64 * c);
                    let lo0 = vreinterpretq_s8_u8(vandq_u8(q0, m4));
                    let lo1 = vreinterpretq_s8_u8(vandq_u8(q1, m4));
                    let hi0 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q0));
                    let hi1 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q1));
                    let lo = dot16(dot16(z, lo0, vld1q_s8(x)), lo1, vld1q_s8(x.add(16)));
                    let hi = dot16(dot16(z, hi0, vld1q_s8(x.add(32))), hi1, vld1q_s8(x.add(48)));
                    sumi +=
                        sc[2 * c] as i32 * vaddvq_s32(lo) + sc[2 * c + 1] as i32 * vaddvq_s32(hi);
                }
                acc += d * sumi as f32 - dmin * sum_m as f32;
            }
            acc
        }

        #[target_feature(enable = $features)]
        pub unsafe fn iq2xxs(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 66);
            let z = vdupq_n_s32(0);
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(66 * i);
                let d = f16_at(b) * a.d * 0.125;
                let mut sumi = 0i32;
                for g in 0..8 {
                    let q = b.add(2 + 8 * g);
                    let aux = u32::from_le_bytes([*q.add(4), *q.add(5), *q.add(6), *q.add(7)]);
                    let grid = |k: usize| vcreate_s8(IQ2XXS_GRID[*q.add(k) as usize]);
                    let sign =
                        |k: usize| vcreate_s8(super::SIGNS_PM1[((aux >> (7 * k)) & 127) as usize]);
                    let w0 = vmulq_s8(vcombine_s8(grid(0), grid(1)), vcombine_s8(sign(0), sign(1)));
                    let w1 = vmulq_s8(vcombine_s8(grid(2), grid(3)), vcombine_s8(sign(2), sign(3)));
                    let x = a.qs.as_ptr().add(32 * g);
                    let s = dot16(dot16(z, w0, vld1q_s8(x)), w1, vld1q_s8(x.add(16)));
                    sumi += (2 * (aux >> 28) + 1) as i32 * vaddvq_s32(s);
                }
                acc += d * sumi as f32;
            }
            acc
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q8_0(row: &[u8], y: &[BlockQ8x32]) -> f32 {
            assert_eq!(row.len(), y.len() * 34);
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(34 * i);
                let s = dot32(b.add(2) as *const i8, a.qs.as_ptr());
                acc += f16_at(b) * a.d * s as f32;
            }
            acc
        }

        #[target_feature(enable = $features)]
        pub unsafe fn mxfp4(row: &[u8], y: &[BlockQ8x32]) -> f32 {
            assert_eq!(row.len(), y.len() * 17);
            let table = vld1q_s8(KVALUES.as_ptr());
            let m4 = vdupq_n_u8(15);
            let z = vdupq_n_s32(0);
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(17 * i);
                let q = vld1q_u8(b.add(1));
                let w0 = vqtbl1q_s8(table, vandq_u8(q, m4));
                let w1 = vqtbl1q_s8(table, vshrq_n_u8::<4>(q));
                let x = a.qs.as_ptr();
                let s = dot16(dot16(z, w0, vld1q_s8(x)), w1, vld1q_s8(x.add(16)));
                acc += e8m0_to_f32_half(*b) * a.d * vaddvq_s32(s) as f32;
            }
            acc
        }

        /// f32 dot in 4-wide chunks with four accumulators; `load(i)` gives
        /// weights `4i..4i+4` as f32 and `at(i)` weight i (the tail).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_f32_with(
            n: usize,
            x: &[f32],
            load: impl Fn(usize) -> float32x4_t,
            at: impl Fn(usize) -> f32,
        ) -> f32 {
            let mut acc = [vdupq_n_f32(0.0); 4];
            let chunks = n / 4;
            let mut c = 0;
            while c + 4 <= chunks {
                for (k, a) in acc.iter_mut().enumerate() {
                    *a = vfmaq_f32(*a, load(c + k), vld1q_f32(x.as_ptr().add(4 * (c + k))));
                }
                c += 4;
            }
            while c < chunks {
                acc[0] = vfmaq_f32(acc[0], load(c), vld1q_f32(x.as_ptr().add(4 * c)));
                c += 1;
            }
            let s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
            let mut s = vaddvq_f32(s);
            for i in chunks * 4..n {
                s += at(i) * x[i];
            }
            s
        }

        #[target_feature(enable = $features)]
        pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
            assert_eq!(row.len(), 4 * x.len());
            let p = row.as_ptr() as *const f32;
            dot_f32_with(
                x.len(),
                x,
                |c| vreinterpretq_f32_u8(vld1q_u8((p as *const u8).add(16 * c))),
                |i| std::ptr::read_unaligned(p.add(i)),
            )
        }

        pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
            crate::backend::cpu::fast::portable::f16(row, x)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
            assert_eq!(row.len(), 2 * x.len());
            let p = row.as_ptr();
            dot_f32_with(
                x.len(),
                x,
                |c| {
                    let h = vreinterpret_u16_u8(vld1_u8(p.add(8 * c)));
                    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
                },
                |i| bf16_bits_to_f32(u16::from_le_bytes([*p.add(2 * i), *p.add(2 * i + 1)])),
            )
        }

        /// Dot of an expanded row (int8 codes, f32 scale per 32) with Q8x32
        /// activations (see `super::super::expand`).
        #[target_feature(enable = $features)]
        pub unsafe fn expanded(codes: &[i8], scale: &[f32], y: &[BlockQ8x32]) -> f32 {
            assert!(codes.len() == y.len() * 32 && scale.len() == y.len());
            let mut acc = 0f32;
            for (i, a) in y.iter().enumerate() {
                let s = dot32(codes.as_ptr().add(32 * i), a.qs.as_ptr());
                acc += scale[i] * a.d * s as f32;
            }
            acc
        }

        /// `y += a·x` (attention's weighted sum of rows).
        #[target_feature(enable = $features)]
        pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            let n = x.len().min(y.len());
            let av = vdupq_n_f32(a);
            let mut i = 0;
            while i + 4 <= n {
                let yv = vld1q_f32(y.as_ptr().add(i));
                vst1q_f32(
                    y.as_mut_ptr().add(i),
                    vfmaq_f32(yv, av, vld1q_f32(x.as_ptr().add(i))),
                );
                i += 4;
            }
            while i < n {
                y[i] += a * x[i];
                i += 1;
            }
        }
    };
}

/// NEON with the dotprod extension (`sdot`).
pub mod dotprod {
    neon_kernels!("neon,dotprod", super::sdot16);
}

/// Plain ARMv8 NEON (`smull` + pairwise adds).
pub mod plain {
    neon_kernels!("neon", super::mull16);
}
