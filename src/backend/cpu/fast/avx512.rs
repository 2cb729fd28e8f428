//! x86-64 AVX-512 kernels (F + BW + VL, with AVX2/FMA/F16C), in two
//! variants generated from one body: [`vnni`] multiplies the int8 products
//! with `vpdpbusd` (u8 × i8, four products summed into each i32 lane in one
//! instruction), [`bw`] with `vpmaddubsw` + `vpmaddwd` (the AVX2 route at
//! twice the width) for AVX-512 CPUs without VNNI. Both give the same exact
//! i32 lane sums, so the variants differ only in speed.
//!
//! Every integer kernel works on 64 bytes at a time: two 32-value blocks
//! (Q8_0, MXFP4, expanded rows, IQ2_XXS groups) or two 32-value chunks of a
//! 256-value super-block (Q2_K, Q4_K, whose codes for both chunks come from
//! one 32-byte load shifted by a per-half amount). Signed weights meet the
//! activations as |w| (u8) against x with w's sign applied through a byte
//! mask (AVX-512 has no `sign_epi8`); the activations are within ±127, so
//! negating never overflows. Sub-block scales are applied per i32 lane
//! (exact: `vpmulld`, or `vpmaddwd` against the scale in i16).
//!
//! F32/F16/BF16 rows are 16-wide f32 FMAs with masked tails. BF16 keeps f32
//! activations: `vdpbf16ps` would round the activations to bf16 (8-bit
//! mantissa), far outside the 1e-5 bound recorded for these formats.

#![allow(clippy::missing_safety_doc)]

macro_rules! avx512_kernels {
    ($features:literal, $vnni:expr) => {
        use std::arch::x86_64::*;

        use crate::backend::cpu::fast::act::BlockQ8x32;
        use crate::quant::iq2xxs_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
        use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES};
        use crate::quant::q4_k::unpack_scales;
        use crate::quant::q8_k::BlockQ8K;

        /// Whether this variant uses `vpdpbusd`.
        pub const VNNI: bool = $vnni;

        /// The AVX2 kernels' f16 read (its note says why it is assembly).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn f16_at(p: *const u8) -> f32 {
            crate::backend::cpu::fast::avx2::f16_at(p)
        }

        #[inline(always)]
        fn prefetch_weights(p: *const u8) {
            crate::backend::cpu::fast::avx2::prefetch_weights(p)
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn hsum256(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        /// i32 lane `j` += Σ u[4j..4j+4]·s[4j..4j+4] (u unsigned, s signed).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot4(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
            if VNNI {
                _mm512_dpbusd_epi32(acc, u, s)
            } else {
                let p = _mm512_maddubs_epi16(u, s);
                _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
            }
        }

        /// i32 lane `j` += scale[j]·Σ u[4j..4j+4]·s[4j..4j+4]; `scale`
        /// holds non-negative i32 below 2¹⁵.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot4_scaled(acc: __m512i, u: __m512i, s: __m512i, scale: __m512i) -> __m512i {
            if VNNI {
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
                _mm512_add_epi32(acc, _mm512_mullo_epi32(p, scale))
            } else {
                // The scale in both i16 halves of each lane: vpmaddwd then
                // multiplies both pair sums of the lane by it and adds them.
                let s16 = _mm512_or_si512(scale, _mm512_slli_epi32(scale, 16));
                let p = _mm512_maddubs_epi16(u, s);
                _mm512_add_epi32(acc, _mm512_madd_epi16(p, s16))
            }
        }

        /// Σ w·x over 4-byte groups of signed bytes, as f32 lanes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_i8(w: __m512i, x: __m512i) -> __m512 {
            let neg = _mm512_movepi8_mask(w);
            let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            _mm512_cvtepi32_ps(dot4(_mm512_setzero_si512(), _mm512_abs_epi8(w), xs))
        }

        /// 32 bytes at `p0` then 32 at `p1` (zeros when `p1` is `None`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn pair256(p0: *const u8, p1: Option<*const u8>) -> __m512i {
            let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i));
            match p1 {
                Some(p) => _mm512_inserti64x4(lo, _mm256_loadu_si256(p as *const __m256i), 1),
                None => _mm512_inserti64x4(lo, _mm256_setzero_si256(), 1),
            }
        }

        /// Lanes 0..8 = a, 8..16 = b.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn pair_ps(a: f32, b: f32) -> __m512 {
            _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b))
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn load_i32x16(v: &[i32; 16]) -> __m512i {
            _mm512_loadu_si512(v.as_ptr() as *const _)
        }

        /// Lane j → sub-block `first + j/4` (Q2_K: 4 sub-blocks of 16 per
        /// 64 values).
        const fn q2k_lanes(first: i32) -> [i32; 16] {
            let mut t = [0i32; 16];
            let mut j = 0;
            while j < 16 {
                t[j] = first + (j as i32) / 4;
                j += 1;
            }
            t
        }
        const Q2K_LANES: [[i32; 16]; 4] = [q2k_lanes(0), q2k_lanes(4), q2k_lanes(8), q2k_lanes(12)];

        /// Lane j → sub-block `first + j/8` (Q4_K: 2 sub-blocks of 32 per
        /// 64 values).
        const fn q4k_lanes(first: i32) -> [i32; 16] {
            let mut t = [0i32; 16];
            let mut j = 0;
            while j < 16 {
                t[j] = first + (j as i32) / 8;
                j += 1;
            }
            t
        }
        const Q4K_LANES: [[i32; 16]; 4] = [q4k_lanes(0), q4k_lanes(2), q4k_lanes(4), q4k_lanes(6)];

        #[target_feature(enable = $features)]
        pub unsafe fn q2k(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 84);
            let m3 = _mm512_set1_epi8(3);
            let m4 = _mm_set1_epi8(0xF);
            let lanes: [__m512i; 4] = std::array::from_fn(|i| load_i32x16(&Q2K_LANES[i]));
            // Codes of chunk 2jp in the low half, 2jp+1 in the high half.
            let shifts = [
                _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
                _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4),
            ];
            let mut acc = _mm512_setzero_ps();
            let mut accm = _mm256_setzero_ps();
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(84 * i);
                prefetch_weights(b);
                let d = f16_at(b.add(80)) * a.d;
                let dmin = f16_at(b.add(82)) * a.d;
                let sc = _mm_loadu_si128(b as *const __m128i);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
                let bsums = _mm256_loadu_si256(a.bsums.as_ptr() as *const __m256i);
                let pm = _mm256_madd_epi16(mins, bsums);
                let scales = _mm512_cvtepu8_epi32(_mm_and_si128(sc, m4));
                let mut sumi = _mm512_setzero_si512();
                for h in 0..2 {
                    let q = _mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i);
                    let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
                    for jp in 0..2 {
                        let codes = _mm512_and_si512(_mm512_srlv_epi64(qq, shifts[jp]), m3);
                        let act =
                            _mm512_loadu_si512(a.qs.as_ptr().add(128 * h + 64 * jp) as *const _);
                        let scale = _mm512_permutexvar_epi32(lanes[2 * h + jp], scales);
                        sumi = dot4_scaled(sumi, codes, act, scale);
                    }
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
                accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm);
            }
            _mm512_reduce_add_ps(acc) - hsum256(accm)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4k(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 144);
            let m4 = _mm512_set1_epi8(0xF);
            let lanes: [__m512i; 4] = std::array::from_fn(|i| load_i32x16(&Q4K_LANES[i]));
            let shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
            let mut acc = _mm512_setzero_ps();
            let mut accm = 0f32;
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(144 * i);
                prefetch_weights(b);
                let d = f16_at(b) * a.d;
                let dmin = f16_at(b.add(2)) * a.d;
                let packed: [u8; 12] = std::ptr::read_unaligned(b.add(4) as *const [u8; 12]);
                let (sc, m) = unpack_scales(&packed);
                let mut sum_m = 0i32;
                for j in 0..8 {
                    sum_m += m[j] as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
                }
                let scales = _mm512_cvtepu8_epi32(_mm_loadl_epi64(sc.as_ptr() as *const __m128i));
                let mut sumi = _mm512_setzero_si512();
                for c in 0..4 {
                    let q = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                    let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
                    let codes = _mm512_and_si512(_mm512_srlv_epi64(qq, shift), m4);
                    let act = _mm512_loadu_si512(a.qs.as_ptr().add(64 * c) as *const _);
                    let scale = _mm512_permutexvar_epi32(lanes[c], scales);
                    sumi = dot4_scaled(sumi, codes, act, scale);
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
                accm += dmin * sum_m as f32;
            }
            _mm512_reduce_add_ps(acc) - accm
        }

        #[target_feature(enable = $features)]
        pub unsafe fn iq2xxs(row: &[u8], y: &[BlockQ8K]) -> f32 {
            assert_eq!(row.len(), y.len() * 66);
            let mut acc = _mm512_setzero_ps();
            for (i, a) in y.iter().enumerate() {
                let b = row.as_ptr().add(66 * i);
                prefetch_weights(b);
                let d = f16_at(b) * a.d * 0.125;
                let mut sumi = _mm512_setzero_si512();
                for g in (0..8).step_by(2) {
                    let q0 = b.add(2 + 8 * g);
                    let q1 = q0.add(8);
                    let a0 = std::ptr::read_unaligned(q0.add(4) as *const u32).to_le();
                    let a1 = std::ptr::read_unaligned(q1.add(4) as *const u32).to_le();
                    let grid = _mm512_set_epi64(
                        IQ2XXS_GRID[*q1.add(3) as usize] as i64,
                        IQ2XXS_GRID[*q1.add(2) as usize] as i64,
                        IQ2XXS_GRID[*q1.add(1) as usize] as i64,
                        IQ2XXS_GRID[*q1 as usize] as i64,
                        IQ2XXS_GRID[*q0.add(3) as usize] as i64,
                        IQ2XXS_GRID[*q0.add(2) as usize] as i64,
                        IQ2XXS_GRID[*q0.add(1) as usize] as i64,
                        IQ2XXS_GRID[*q0 as usize] as i64,
                    );
                    let mut neg = 0u64;
                    for k in 0..4 {
                        neg |= (KSIGNS_IQ2XS[((a0 >> (7 * k)) & 127) as usize] as u64) << (8 * k);
                        neg |=
                            (KSIGNS_IQ2XS[((a1 >> (7 * k)) & 127) as usize] as u64) << (8 * k + 32);
                    }
                    let x = _mm512_loadu_si512(a.qs.as_ptr().add(32 * g) as *const _);
                    let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                    let scale = _mm512_mask_blend_epi32(
                        0xFF00,
                        _mm512_set1_epi32((2 * (a0 >> 28) + 1) as i32),
                        _mm512_set1_epi32((2 * (a1 >> 28) + 1) as i32),
                    );
                    sumi = dot4_scaled(sumi, grid, xs, scale);
                }
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            _mm512_reduce_add_ps(acc)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q8_0(row: &[u8], y: &[BlockQ8x32]) -> f32 {
            assert_eq!(row.len(), y.len() * 34);
            let n = y.len();
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i < n {
                let two = i + 1 < n;
                let b0 = row.as_ptr().add(34 * i);
                prefetch_weights(b0);
                let b1 = b0.add(34);
                let w = pair256(b0.add(2), two.then(|| b1.add(2)));
                let x = pair256(
                    y[i].qs.as_ptr() as *const u8,
                    two.then(|| y[i + 1].qs.as_ptr() as *const u8),
                );
                let d1 = if two { f16_at(b1) * y[i + 1].d } else { 0.0 };
                acc = _mm512_fmadd_ps(pair_ps(f16_at(b0) * y[i].d, d1), dot_i8(w, x), acc);
                i += 2;
            }
            _mm512_reduce_add_ps(acc)
        }

        /// [`q8_0`] of one weight row against several activation rows:
        /// `out[j] = q8_0(row, ys[j])` bit for bit. Each pair of weight
        /// blocks is loaded, split into magnitude and sign, and its scales
        /// converted once; every activation row then takes the integer
        /// products, the f32 scale products, the accumulation order and
        /// the final reduction of [`q8_0`] in its own accumulator. Rows go
        /// in groups of 8, 4, 2, 1 so the accumulators stay in registers.
        #[target_feature(enable = $features)]
        pub unsafe fn q8_0_many(row: &[u8], ys: &[&[BlockQ8x32]], out: &mut [f32]) {
            assert_eq!(ys.len(), out.len());
            for y in ys {
                assert_eq!(row.len(), y.len() * 34);
            }
            let mut j = 0;
            while j < ys.len() {
                let left = ys.len() - j;
                let n = if left >= 8 {
                    q8_0_n::<8>(row, &ys[j..j + 8], &mut out[j..j + 8]);
                    8
                } else if left >= 4 {
                    q8_0_n::<4>(row, &ys[j..j + 4], &mut out[j..j + 4]);
                    4
                } else if left >= 2 {
                    q8_0_n::<2>(row, &ys[j..j + 2], &mut out[j..j + 2]);
                    2
                } else {
                    q8_0_n::<1>(row, &ys[j..j + 1], &mut out[j..j + 1]);
                    1
                };
                j += n;
            }
        }

        /// [`q8_0_many`] for exactly `N` activation rows (lengths checked
        /// by the caller).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q8_0_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8x32]], out: &mut [f32]) {
            let n = row.len() / 34;
            let y: [*const BlockQ8x32; N] = std::array::from_fn(|t| ys[t].as_ptr());
            let mut acc = [_mm512_setzero_ps(); N];
            let zero = _mm512_setzero_si512();
            let mut i = 0;
            // Pairs of blocks (the `two` case of `q8_0`).
            while i + 1 < n {
                let b0 = row.as_ptr().add(34 * i);
                prefetch_weights(b0);
                let b1 = b0.add(34);
                let w = pair256(b0.add(2), Some(b1.add(2)));
                let neg = _mm512_movepi8_mask(w);
                let aw = _mm512_abs_epi8(w);
                let (dw0, dw1) = (f16_at(b0), f16_at(b1));
                for t in 0..N {
                    let (a0, a1) = (&*y[t].add(i), &*y[t].add(i + 1));
                    let x = pair256(
                        a0.qs.as_ptr() as *const u8,
                        Some(a1.qs.as_ptr() as *const u8),
                    );
                    let xs = _mm512_mask_sub_epi8(x, neg, zero, x);
                    let p = _mm512_cvtepi32_ps(dot4(zero, aw, xs));
                    acc[t] = _mm512_fmadd_ps(pair_ps(dw0 * a0.d, dw1 * a1.d), p, acc[t]);
                }
                i += 2;
            }
            // An odd last block: the high half is zero, its scale 0.0.
            if i < n {
                let b0 = row.as_ptr().add(34 * i);
                prefetch_weights(b0);
                let w = pair256(b0.add(2), None);
                let neg = _mm512_movepi8_mask(w);
                let aw = _mm512_abs_epi8(w);
                let dw0 = f16_at(b0);
                for t in 0..N {
                    let a0 = &*y[t].add(i);
                    let x = pair256(a0.qs.as_ptr() as *const u8, None);
                    let xs = _mm512_mask_sub_epi8(x, neg, zero, x);
                    let p = _mm512_cvtepi32_ps(dot4(zero, aw, xs));
                    acc[t] = _mm512_fmadd_ps(pair_ps(dw0 * a0.d, 0.0), p, acc[t]);
                }
            }
            for t in 0..N {
                out[t] = _mm512_reduce_add_ps(acc[t]);
            }
        }

        /// Splits `ys`/`out` into groups of 8, 4, 2, 1 rows and runs
        /// `$f::<N>` on each (accumulators in registers).
        macro_rules! by_groups {
            ($f:ident, $row:expr, $ys:expr, $out:expr) => {{
                let (row, ys, out) = ($row, $ys, $out);
                assert_eq!(ys.len(), out.len());
                let mut j = 0;
                while j < ys.len() {
                    let left = ys.len() - j;
                    let n = if left >= 8 {
                        8
                    } else if left >= 4 {
                        4
                    } else if left >= 2 {
                        2
                    } else {
                        1
                    };
                    match n {
                        8 => $f::<8>(row, &ys[j..j + 8], &mut out[j..j + 8]),
                        4 => $f::<4>(row, &ys[j..j + 4], &mut out[j..j + 4]),
                        2 => $f::<2>(row, &ys[j..j + 2], &mut out[j..j + 2]),
                        _ => $f::<1>(row, &ys[j..j + 1], &mut out[j..j + 1]),
                    }
                    j += n;
                }
            }};
        }

        /// [`iq2xxs`] of one weight row against several activation rows,
        /// `out[j] = iq2xxs(row, ys[j])` bit for bit: per super-block the
        /// grid rows, signs and scales are decoded once, then each
        /// activation row takes [`iq2xxs`]'s products and accumulation.
        #[target_feature(enable = $features)]
        pub unsafe fn iq2xxs_many(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
            for y in ys {
                assert_eq!(row.len(), y.len() * 66);
            }
            by_groups!(iq2xxs_n, row, ys, out)
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn iq2xxs_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
            let nb = row.len() / 66;
            let y: [*const BlockQ8K; N] = std::array::from_fn(|t| ys[t].as_ptr());
            let mut acc = [_mm512_setzero_ps(); N];
            for i in 0..nb {
                let b = row.as_ptr().add(66 * i);
                prefetch_weights(b);
                let dw = f16_at(b);
                let mut grids = [_mm512_setzero_si512(); 4];
                let mut negs = [0u64; 4];
                let mut scales = [_mm512_setzero_si512(); 4];
                for gp in 0..4 {
                    let q0 = b.add(2 + 16 * gp);
                    let q1 = q0.add(8);
                    let a0 = std::ptr::read_unaligned(q0.add(4) as *const u32).to_le();
                    let a1 = std::ptr::read_unaligned(q1.add(4) as *const u32).to_le();
                    grids[gp] = _mm512_set_epi64(
                        IQ2XXS_GRID[*q1.add(3) as usize] as i64,
                        IQ2XXS_GRID[*q1.add(2) as usize] as i64,
                        IQ2XXS_GRID[*q1.add(1) as usize] as i64,
                        IQ2XXS_GRID[*q1 as usize] as i64,
                        IQ2XXS_GRID[*q0.add(3) as usize] as i64,
                        IQ2XXS_GRID[*q0.add(2) as usize] as i64,
                        IQ2XXS_GRID[*q0.add(1) as usize] as i64,
                        IQ2XXS_GRID[*q0 as usize] as i64,
                    );
                    let mut neg = 0u64;
                    for k in 0..4 {
                        neg |= (KSIGNS_IQ2XS[((a0 >> (7 * k)) & 127) as usize] as u64) << (8 * k);
                        neg |=
                            (KSIGNS_IQ2XS[((a1 >> (7 * k)) & 127) as usize] as u64) << (8 * k + 32);
                    }
                    negs[gp] = neg;
                    scales[gp] = _mm512_mask_blend_epi32(
                        0xFF00,
                        _mm512_set1_epi32((2 * (a0 >> 28) + 1) as i32),
                        _mm512_set1_epi32((2 * (a1 >> 28) + 1) as i32),
                    );
                }
                for t in 0..N {
                    let a = &*y[t].add(i);
                    let d = dw * a.d * 0.125;
                    let mut sumi = _mm512_setzero_si512();
                    for gp in 0..4 {
                        let x = _mm512_loadu_si512(a.qs.as_ptr().add(64 * gp) as *const _);
                        let xs = _mm512_mask_sub_epi8(x, negs[gp], _mm512_setzero_si512(), x);
                        sumi = dot4_scaled(sumi, grids[gp], xs, scales[gp]);
                    }
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc[t]);
                }
            }
            for t in 0..N {
                out[t] = _mm512_reduce_add_ps(acc[t]);
            }
        }

        /// [`q2k`] of one weight row against several activation rows,
        /// `out[j] = q2k(row, ys[j])` bit for bit: per super-block the codes,
        /// sub-block scales and mins are unpacked once, then each activation
        /// row takes [`q2k`]'s products and accumulation.
        #[target_feature(enable = $features)]
        pub unsafe fn q2k_many(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
            for y in ys {
                assert_eq!(row.len(), y.len() * 84);
            }
            by_groups!(q2k_n, row, ys, out)
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q2k_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
            let nb = row.len() / 84;
            let y: [*const BlockQ8K; N] = std::array::from_fn(|t| ys[t].as_ptr());
            let m3 = _mm512_set1_epi8(3);
            let m4 = _mm_set1_epi8(0xF);
            let lanes: [__m512i; 4] = std::array::from_fn(|i| load_i32x16(&Q2K_LANES[i]));
            let shifts = [
                _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
                _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4),
            ];
            let mut acc = [_mm512_setzero_ps(); N];
            let mut accm = [_mm256_setzero_ps(); N];
            for i in 0..nb {
                let b = row.as_ptr().add(84 * i);
                prefetch_weights(b);
                let (dw, dminw) = (f16_at(b.add(80)), f16_at(b.add(82)));
                let sc = _mm_loadu_si128(b as *const __m128i);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
                let scales = _mm512_cvtepu8_epi32(_mm_and_si128(sc, m4));
                let mut codes = [_mm512_setzero_si512(); 4];
                let mut scl = [_mm512_setzero_si512(); 4];
                for h in 0..2 {
                    let q = _mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i);
                    let qq = _mm512_inserti64x4(_mm512_castsi256_si512(q), q, 1);
                    for jp in 0..2 {
                        codes[2 * h + jp] = _mm512_and_si512(_mm512_srlv_epi64(qq, shifts[jp]), m3);
                        scl[2 * h + jp] = _mm512_permutexvar_epi32(lanes[2 * h + jp], scales);
                    }
                }
                for t in 0..N {
                    let a = &*y[t].add(i);
                    let d = dw * a.d;
                    let dmin = dminw * a.d;
                    let bsums = _mm256_loadu_si256(a.bsums.as_ptr() as *const __m256i);
                    let pm = _mm256_madd_epi16(mins, bsums);
                    let mut sumi = _mm512_setzero_si512();
                    for c in 0..4 {
                        let act = _mm512_loadu_si512(a.qs.as_ptr().add(64 * c) as *const _);
                        sumi = dot4_scaled(sumi, codes[c], act, scl[c]);
                    }
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc[t]);
                    accm[t] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm[t]);
                }
            }
            for t in 0..N {
                out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(accm[t]);
            }
        }

        /// Signed MXFP4 values as magnitudes; the sign is nibble bit 3.
        const MXFP4_ABS: [i8; 16] = {
            let mut t = [0i8; 16];
            let mut i = 0;
            while i < 16 {
                t[i] = KVALUES[i].abs();
                i += 1;
            }
            t
        };

        #[target_feature(enable = $features)]
        pub unsafe fn mxfp4(row: &[u8], y: &[BlockQ8x32]) -> f32 {
            assert_eq!(row.len(), y.len() * 17);
            let table =
                _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_ABS.as_ptr() as *const __m128i));
            let m4 = _mm512_set1_epi8(0xF);
            let bit3 = _mm512_set1_epi8(8);
            let n = y.len();
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i < n {
                let two = i + 1 < n;
                let b0 = row.as_ptr().add(17 * i);
                prefetch_weights(b0);
                let b1 = b0.add(17);
                let q0 = _mm_loadu_si128(b0.add(1) as *const __m128i);
                let q1 = if two {
                    _mm_loadu_si128(b1.add(1) as *const __m128i)
                } else {
                    _mm_setzero_si128()
                };
                // 128-bit lanes [q0, q0, q1, q1] → [lo(q0), hi(q0), lo(q1), hi(q1)].
                let v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set_m128i(q0, q0)),
                    _mm256_set_m128i(q1, q1),
                    1,
                );
                let idx = _mm512_and_si512(
                    _mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16(v, 4)),
                    m4,
                );
                let mag = _mm512_shuffle_epi8(table, idx);
                let neg = _mm512_test_epi8_mask(idx, bit3);
                let x = pair256(
                    y[i].qs.as_ptr() as *const u8,
                    two.then(|| y[i + 1].qs.as_ptr() as *const u8),
                );
                let xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                let p = _mm512_cvtepi32_ps(dot4(_mm512_setzero_si512(), mag, xs));
                let d1 = if two {
                    e8m0_to_f32_half(*b1) * y[i + 1].d
                } else {
                    0.0
                };
                acc = _mm512_fmadd_ps(pair_ps(e8m0_to_f32_half(*b0) * y[i].d, d1), p, acc);
                i += 2;
            }
            _mm512_reduce_add_ps(acc)
        }

        /// f32 dot of `n` values in 16-wide chunks with four accumulators;
        /// `load(i, m)` gives weights `16i..16i+16` as f32 (lanes outside
        /// mask `m` zero).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_f32_with(
            n: usize,
            x: &[f32],
            load: impl Fn(usize, __mmask16) -> __m512,
        ) -> f32 {
            let mut acc = [_mm512_setzero_ps(); 4];
            let chunks = n / 16;
            let mut c = 0;
            while c + 4 <= chunks {
                for (k, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_ps(x.as_ptr().add(16 * (c + k)));
                    *a = _mm512_fmadd_ps(load(c + k, 0xFFFF), xv, *a);
                }
                c += 4;
            }
            while c < chunks {
                let xv = _mm512_loadu_ps(x.as_ptr().add(16 * c));
                acc[0] = _mm512_fmadd_ps(load(c, 0xFFFF), xv, acc[0]);
                c += 1;
            }
            let rem = n % 16;
            if rem > 0 {
                let m: __mmask16 = (1u16 << rem) - 1;
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(16 * c));
                acc[1] = _mm512_fmadd_ps(load(c, m), xv, acc[1]);
            }
            let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            _mm512_reduce_add_ps(s)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
            assert_eq!(row.len(), 4 * x.len());
            let p = row.as_ptr() as *const f32;
            dot_f32_with(x.len(), x, |c, m| _mm512_maskz_loadu_ps(m, p.add(16 * c)))
        }

        #[target_feature(enable = $features)]
        pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
            assert_eq!(row.len(), 2 * x.len());
            let p = row.as_ptr() as *const i16;
            dot_f32_with(x.len(), x, |c, m| {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.add(16 * c)))
            })
        }

        #[target_feature(enable = $features)]
        pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
            assert_eq!(row.len(), 2 * x.len());
            let p = row.as_ptr() as *const i16;
            dot_f32_with(x.len(), x, |c, m| {
                let h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p.add(16 * c)));
                _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
            })
        }

        /// Dot of an expanded row (int8 codes, f32 scale per 32) with Q8x32
        /// activations (see `super::super::expand`).
        #[target_feature(enable = $features)]
        pub unsafe fn expanded(codes: &[i8], scale: &[f32], y: &[BlockQ8x32]) -> f32 {
            assert!(codes.len() == y.len() * 32 && scale.len() == y.len());
            let n = y.len();
            let c = codes.as_ptr() as *const u8;
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i < n {
                let two = i + 1 < n;
                let w = pair256(c.add(32 * i), two.then(|| c.add(32 * i + 32)));
                let x = pair256(
                    y[i].qs.as_ptr() as *const u8,
                    two.then(|| y[i + 1].qs.as_ptr() as *const u8),
                );
                let d1 = if two { scale[i + 1] * y[i + 1].d } else { 0.0 };
                acc = _mm512_fmadd_ps(pair_ps(scale[i] * y[i].d, d1), dot_i8(w, x), acc);
                i += 2;
            }
            _mm512_reduce_add_ps(acc)
        }

        /// `y += a·x` (attention's weighted sum of rows).
        #[target_feature(enable = $features)]
        pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            let n = x.len().min(y.len());
            let av = _mm512_set1_ps(a);
            let mut i = 0;
            while i + 16 <= n {
                let yv = _mm512_loadu_ps(y.as_ptr().add(i));
                let xv = _mm512_loadu_ps(x.as_ptr().add(i));
                _mm512_storeu_ps(y.as_mut_ptr().add(i), _mm512_fmadd_ps(av, xv, yv));
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u16 << (n - i)) - 1;
                let yv = _mm512_maskz_loadu_ps(m, y.as_ptr().add(i));
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
                _mm512_mask_storeu_ps(y.as_mut_ptr().add(i), m, _mm512_fmadd_ps(av, xv, yv));
            }
        }
    };
}

/// AVX-512 with VNNI (`vpdpbusd`): Ice Lake, Sapphire Rapids, Zen 4 and later.
pub mod vnni {
    avx512_kernels!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c", true);
}

/// AVX-512 F/BW/VL without VNNI (Skylake-SP, Cascade Lake without DL Boost).
pub mod bw {
    avx512_kernels!("avx512f,avx512bw,avx512vl,avx2,fma,f16c", false);
}
