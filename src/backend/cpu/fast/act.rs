//! Activation rows quantised for the integer dot products.
//!
//! Two int8 formats, chosen by the weight format they meet:
//! * Q8_K (256 values, one f32 scale, 16-value sums) for the K-quants and
//!   IQ2_XXS, whose 256-value super-blocks it matches (the sums carry the
//!   Q2_K/Q4_K min terms);
//! * [`BlockQ8x32`] (32 values, one f32 scale) for Q8_0 and MXFP4, whose
//!   blocks are 32 values and whose rows need not be 256-aligned.
//!
//! F32/F16/BF16 weights meet the activations unquantised (f32).

use std::borrow::Cow;

use bytemuck::{Pod, Zeroable};

use crate::quant::q8_k::{quantize_block, BlockQ8K, QK_K};

/// 32 int8 codes with an f32 scale: value = d·qs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8x32 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// Quantises 32 values: the largest magnitude maps to ±127, rounding half
/// away from zero.
pub fn quantize_q8x32(x: &[f32]) -> BlockQ8x32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut b = BlockQ8x32::zeroed();
    if amax == 0.0 {
        return b;
    }
    let d = amax / 127.0;
    let id = 1.0 / d;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    b.d = d;
    b
}

/// [`quantize_q8x32`] with AVX2 where the CPU has it: the same block bit for
/// bit (the scalar loop calls `roundf` per value, which was ~2 % of a
/// 2,048-token prefill).
pub fn q8x32(x: &[f32]) -> BlockQ8x32 {
    q8x32_fn()(x)
}

/// [`quantize_block`] (Q8_K) with AVX2 where the CPU has it: the same block
/// bit for bit (the scalar loop calls `rintf` per value).
pub fn q8k(x: &[f32]) -> BlockQ8K {
    q8k_fn()(x)
}

fn q8x32_fn() -> fn(&[f32]) -> BlockQ8x32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return |x| unsafe { x86::q8x32(x) };
    }
    quantize_q8x32
}

fn q8k_fn() -> fn(&[f32]) -> BlockQ8K {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return |x| unsafe { x86::q8k(x) };
    }
    quantize_block
}

/// The AVX2 quantisers. Each reproduces its scalar twin exactly: the same
/// largest magnitude (max ignores NaN lanes as `f32::max` does), the same
/// f32 scale computed in scalar code, the same products, and the scalar
/// rounding rule (half away from zero: `trunc` plus one where the exact
/// fraction `p - trunc(p)` reaches ½; half to even: `vroundps`; a NaN value
/// gives 0, as `NaN as i8` does). A scale
/// that is not finite (all-tiny or non-finite rows) takes the scalar
/// twin, whose NaN-to-int rules the vector code does not copy.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{quantize_block, quantize_q8x32, BlockQ8K, BlockQ8x32, QK_K};
    use bytemuck::Zeroable;

    /// Largest |v| of `n` values (a multiple of 8).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn amax(x: *const f32, n: usize) -> f32 {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for i in 0..n / 8 {
            // The loaded lanes first: `maxps` returns its second operand
            // when either is NaN, so a NaN value is skipped.
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x.add(8 * i)), abs), m);
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        _mm_cvtss_f32(h)
    }

    /// 32 integral f32 values in ±127 (four vectors of 8) as 32 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack32(r: [__m256; 4], out: *mut i8) {
        let a = _mm256_packs_epi32(_mm256_cvtps_epi32(r[0]), _mm256_cvtps_epi32(r[1]));
        let b = _mm256_packs_epi32(_mm256_cvtps_epi32(r[2]), _mm256_cvtps_epi32(r[3]));
        // The packs work per 128-bit lane: dwords come out as
        // r0[0..4] r1[0..4] r2[0..4] r3[0..4] r0[4..8] …; put them back.
        let q = _mm256_packs_epi16(a, b);
        let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out as *mut __m256i, q);
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn q8x32(x: &[f32]) -> BlockQ8x32 {
        assert_eq!(x.len(), 32);
        let amax = amax(x.as_ptr(), 32);
        if amax == 0.0 {
            return BlockQ8x32::zeroed();
        }
        let d = amax / 127.0;
        let id = 1.0 / d;
        if !id.is_finite() || !amax.is_finite() {
            return quantize_q8x32(x);
        }
        let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
        let (idv, half, one) = (_mm256_set1_ps(id), _mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let mut r = [_mm256_setzero_ps(); 4];
        for (i, r) in r.iter_mut().enumerate() {
            let p = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * i)), idv);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
            let step = _mm256_or_ps(_mm256_and_ps(p, sign), one);
            let v = _mm256_add_ps(t, _mm256_and_ps(up, step));
            // A NaN value becomes 0, as `NaN as i8` does.
            let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
            *r = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        }
        let mut b = BlockQ8x32::zeroed();
        pack32(r, b.qs.as_mut_ptr());
        b.d = d;
        b
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn q8k(x: &[f32]) -> BlockQ8K {
        assert_eq!(x.len(), QK_K);
        let amax = amax(x.as_ptr(), QK_K);
        if amax == 0.0 || !amax.is_finite() {
            return quantize_block(x);
        }
        // The first value of the largest magnitude, with its sign (the
        // scalar loop's strict `>` keeps the first of a tie).
        let mx = *x
            .iter()
            .find(|v| v.abs() == amax)
            .expect("amax is one of the values");
        let iscale = -127.0 / mx;
        if !iscale.is_finite() {
            return quantize_block(x);
        }
        let s = _mm256_set1_ps(iscale);
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        let mut b = BlockQ8K::zeroed();
        for c in 0..QK_K / 32 {
            let mut r = [_mm256_setzero_ps(); 4];
            for (i, r) in r.iter_mut().enumerate() {
                let p = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * i)), s);
                let v = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
                let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
                *r = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            }
            pack32(r, b.qs.as_mut_ptr().add(32 * c));
        }
        for (k, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
        b
    }
}

/// Which activation format a weight type reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    Q8K,
    Q8x32,
    F32,
}

/// `rows` activation rows of `n` values each, quantised as `kind`. f32 rows
/// may be borrowed from the op's input ([`Acts::f32_borrowed`]): copying a
/// 2,048-token prompt's rows of 16,384 was 128 MiB of fresh memory per
/// product.
pub enum Acts<'a> {
    Q8K {
        blocks: Vec<BlockQ8K>,
        per_row: usize,
    },
    Q8x32 {
        blocks: Vec<BlockQ8x32>,
        per_row: usize,
    },
    F32 {
        values: Cow<'a, [f32]>,
        per_row: usize,
    },
}

impl Acts<'_> {
    /// Rows of `n` f32 values laid out one after another in `x` (all of
    /// it), read where they are.
    pub fn f32_borrowed(x: &[f32], n: usize) -> Acts<'_> {
        assert!(
            n > 0 && x.len() % n == 0,
            "{} values in rows of {n}",
            x.len()
        );
        Acts::F32 {
            values: Cow::Borrowed(x),
            per_row: n,
        }
    }

    /// Quantises the `rows` given by `row(i)` (each `n` long).
    pub fn quantize<'r>(
        kind: ActKind,
        n: usize,
        rows: impl Iterator<Item = &'r [f32]>,
    ) -> Acts<'static> {
        match kind {
            ActKind::Q8K => {
                let per_row = n / QK_K;
                let mut blocks = Vec::new();
                let q = q8k_fn();
                for r in rows {
                    blocks.extend(r[..n].chunks_exact(QK_K).map(q));
                }
                Acts::Q8K { blocks, per_row }
            }
            ActKind::Q8x32 => {
                let per_row = n / 32;
                let mut blocks = Vec::new();
                let q = q8x32_fn();
                for r in rows {
                    blocks.extend(r[..n].chunks_exact(32).map(q));
                }
                Acts::Q8x32 { blocks, per_row }
            }
            ActKind::F32 => {
                let mut values = Vec::new();
                for r in rows {
                    values.extend_from_slice(&r[..n]);
                }
                Acts::F32 {
                    values: Cow::Owned(values),
                    per_row: n,
                }
            }
        }
    }

    /// [`Acts::quantize`] of `rows`, the rows spread over the rayon pool
    /// when there are many (a 2,048-token prompt's rows were quantised on
    /// one thread while the other waited). The same blocks either way: each
    /// row is quantised on its own.
    pub fn quantize_par(kind: ActKind, n: usize, rows: &[&[f32]]) -> Acts<'static> {
        use rayon::prelude::*;
        if rows.len() < 64 || rayon::current_num_threads() < 2 {
            return Acts::quantize(kind, n, rows.iter().copied());
        }
        fn fill<B: Copy + Send + Zeroable>(
            rows: &[&[f32]],
            n: usize,
            per_row: usize,
            block: usize,
            q: impl Fn(&[f32]) -> B + Sync,
        ) -> Vec<B> {
            let mut out = vec![B::zeroed(); rows.len() * per_row];
            out.par_chunks_mut(per_row)
                .zip(rows.par_iter())
                .for_each(|(dst, r)| {
                    for (b, x) in dst.iter_mut().zip(r[..n].chunks_exact(block)) {
                        *b = q(x);
                    }
                });
            out
        }
        match kind {
            ActKind::Q8K => Acts::Q8K {
                blocks: fill(rows, n, n / QK_K, QK_K, q8k_fn()),
                per_row: n / QK_K,
            },
            ActKind::Q8x32 => Acts::Q8x32 {
                blocks: fill(rows, n, n / 32, 32, q8x32_fn()),
                per_row: n / 32,
            },
            ActKind::F32 => Acts::quantize(kind, n, rows.iter().copied()),
        }
    }

    /// A new set made of rows `idx` of this one (tokens gathered per expert).
    pub fn gather(&self, idx: impl Iterator<Item = usize>) -> Acts<'static> {
        fn pick<T: Copy>(v: &[T], per: usize, idx: impl Iterator<Item = usize>) -> Vec<T> {
            let mut out = Vec::new();
            for i in idx {
                out.extend_from_slice(&v[i * per..(i + 1) * per]);
            }
            out
        }
        match self {
            Acts::Q8K { blocks, per_row } => Acts::Q8K {
                blocks: pick(blocks, *per_row, idx),
                per_row: *per_row,
            },
            Acts::Q8x32 { blocks, per_row } => Acts::Q8x32 {
                blocks: pick(blocks, *per_row, idx),
                per_row: *per_row,
            },
            Acts::F32 { values, per_row } => Acts::F32 {
                values: Cow::Owned(pick(values, *per_row, idx)),
                per_row: *per_row,
            },
        }
    }
}
