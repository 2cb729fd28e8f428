//! x86-64 AVX2 + FMA + F16C kernels. Each is `unsafe` because it needs those
//! CPU features; `super::Kernels::for_isa` installs them only after runtime
//! detection. Integer products use `maddubs` (u8 × i8 → i16 pairs, which
//! cannot saturate for these formats: at most 2·43·127 for IQ2_XXS, 2·128·127
//! for Q8_0) then `madd` against the sub-block scales (→ i32), and one f32
//! fused multiply-add per block.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::act::BlockQ8x32;
use crate::quant::iq2xxs_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES};
use crate::quant::q4_k::unpack_scales;
use crate::quant::q8_k::BlockQ8K;

/// How far ahead of the block being multiplied the x86 kernels ask for
/// their weight row. A decode step reads each weight once, front to back,
/// and the hardware prefetcher alone left the Q8_0 products (a Flash-width
/// decode's largest part) waiting on their weight loads at about 60 % of
/// the measured read bandwidth on this 2-core VM; asking 2 KiB ahead took
/// the 4-layer bench model's decode from 6.6–7.3 to 9.8–10.6 tokens/s
/// (distances 512 B to 8 KiB measured; 2–4 KiB were best). docs/PERFORMANCE.md.
pub(crate) const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache line [`PREFETCH_AHEAD`] bytes past `p` (a weight
/// block). Changes no value: the products are bit for bit those without it.
#[inline(always)]
pub(crate) fn prefetch_weights(p: *const u8) {
    // SAFETY: a prefetch is a hint that never faults, whatever the address
    // (past the end of the row or the mapping included); `wrapping_add`
    // keeps the pointer arithmetic itself defined.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8) }
}

/// An f16 at `p` (unaligned) through the F16C unit.
///
/// Written in assembly because LLVM turns the intrinsic form
/// (`_mm_cvtph_ps(_mm_cvtsi32_si128(h))`, of which only lane 0 is used) into
/// a `vpinsrw` that merges the half into whatever register it likes, often
/// an accumulator: each block's scale then waited for the previous block's
/// FMA, and the 1-row Q8_0 dot took ~8.5 cycles per block instead of ~5.6
/// (docs/PERFORMANCE.md, "A false dependency in the f16 scale reads"). `vmovd` from a general register writes the whole
/// vector register, so the conversion depends on the load alone.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u32::from(std::ptr::read_unaligned(p as *const u16));
    let x: __m128;
    // SAFETY: F16C is enabled on this function; the asm reads and writes
    // registers only.
    std::arch::asm!(
        "vmovd {x}, {h:e}",
        "vcvtph2ps {x}, {x}",
        h = in(reg) h,
        x = out(xmm_reg) x,
        options(pure, nomem, nostack, preserves_flags),
    );
    _mm_cvtss_f32(x)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// For sub-block pair (k, k+1): i16 lanes 0..7 pick byte k of a 16-byte
/// vector, lanes 8..15 byte k+1 (the shuffle works per 128-bit half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_mask(k: usize) -> __m256i {
    let lo = _mm_set1_epi16(k as i16 | (0x80u16 << 8) as i16);
    let hi = _mm_set1_epi16((k + 1) as i16 | (0x80u16 << 8) as i16);
    _mm256_set_m128i(hi, lo)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q2k(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 84);
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let masks: [__m256i; 8] = std::array::from_fn(|i| pair_mask(2 * i));
    let mut acc = _mm256_setzero_ps();
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
        let scl = _mm256_broadcastsi128_si256(_mm_and_si128(sc, m4));
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let mut q = _mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i);
            for j in 0..4 {
                let codes = _mm256_and_si256(q, m3);
                let act = _mm256_loadu_si256(a.qs.as_ptr().add(128 * h + 32 * j) as *const __m256i);
                let p = _mm256_maddubs_epi16(codes, act);
                let s = _mm256_shuffle_epi8(scl, masks[4 * h + j]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
                q = _mm256_srli_epi16(q, 2);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm);
    }
    hsum_ps(acc) - hsum_ps(accm)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 144);
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut accm = 0f32;
    for (i, a) in y.iter().enumerate() {
        let b = row.as_ptr().add(144 * i);
        prefetch_weights(b);
        let d = f16_at(b) * a.d;
        let dmin = f16_at(b.add(2)) * a.d;
        let scales: [u8; 12] = std::ptr::read_unaligned(b.add(4) as *const [u8; 12]);
        let (sc, m) = unpack_scales(&scales);
        let mut sum_m = 0i32;
        for (j, &mj) in m.iter().enumerate() {
            sum_m += mj as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
        }
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let a0 = _mm256_loadu_si256(a.qs.as_ptr().add(64 * c) as *const __m256i);
            let a1 = _mm256_loadu_si256(a.qs.as_ptr().add(64 * c + 32) as *const __m256i);
            let p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, a0),
                _mm256_set1_epi16(sc[2 * c] as i16),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, a1),
                _mm256_set1_epi16(sc[2 * c + 1] as i16),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm += dmin * sum_m as f32;
    }
    hsum_ps(acc) - accm
}

/// Sign patterns of `KSIGNS_IQ2XS` as 8 bytes of ±1 (bit set → −1).
static SIGNS_PM1: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut s = 0;
    while s < 128 {
        let bits = KSIGNS_IQ2XS[s];
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

/// Every byte's own bit (`1 << (i mod 8)`), for spreading a sign byte over
/// 8 lanes.
const BIT_OF_LANE: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = 1 << (i % 8);
        i += 1;
    }
    t
};

/// Shuffle indices that give lane `i` byte `i / 8` of a vector whose
/// 128-bit halves both start with the same 4 bytes (the shuffle works per
/// half: lanes 0..15 pick bytes 0, 1; lanes 16..31 bytes 2, 3).
const SPREAD_SIGN_BYTES: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = (i / 8) as u8;
        i += 1;
    }
    t
};

/// The words of one IQ2_XXS super-block at `b` (an f16 scale, then 8 groups
/// of 32 weights: 4 grid indices and a u32 of four 7-bit sign indices and a
/// 4-bit scale), for [`iq2xxs_group`]: dword g of the first vector holds
/// group g's four sign bytes (`KSIGNS_IQ2XS` values), of the second its
/// scale `2·s + 1` in both i16 halves.
///
/// The signs are computed rather than looked up: `KSIGNS_IQ2XS[f]` is the
/// 7-bit index `f` with its parity as bit 7, so all 32 sign bytes of the
/// block come out of the eight u32 words in a few vector operations, then
/// each group's 4 bytes are spread over its 32 lanes. The grid rows stay
/// table lookups (256 entries of 8 bytes). [`iq2xxs_group`] gives the
/// signs as ±1 bytes, `SIGNS_PM1`'s bytes exactly: the same bytes as the
/// table route ([`iq2xxs_lookup`]), so the products are the same integers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq2xxs_words(b: *const u8) -> (__m256i, __m256i) {
    // Groups 0..3 and 4..7: each 64-bit lane holds one group, the grid
    // indices in its low u32 and the sign/scale word in its high u32.
    let q0 = _mm256_loadu_si256(b.add(2) as *const __m256i);
    let q1 = _mm256_loadu_si256(b.add(34) as *const __m256i);
    let hi = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    let a = _mm256_blend_epi32(
        _mm256_permutevar8x32_epi32(q0, hi),
        _mm256_permutevar8x32_epi32(q1, hi),
        0xF0,
    );
    // Dword g = group g's four 7-bit sign indices, one per byte.
    let m7 = _mm256_set1_epi32(0x7F);
    let t = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_and_si256(a, m7),
            _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_slli_epi32(m7, 8)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_slli_epi32(m7, 16)),
            _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_slli_epi32(m7, 24)),
        ),
    );
    // Bit 0 of each byte of `p`: the parity of that byte of `t` (the
    // shifts bring higher bytes' bits only into bits a byte then ignores).
    let p = _mm256_xor_si256(t, _mm256_srli_epi32(t, 4));
    let p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    let p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    let ks = _mm256_or_si256(
        t,
        _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7),
    );
    // Scales 2·s + 1 in both i16 halves of dword g.
    let ls = _mm256_or_si256(_mm256_srli_epi32(a, 27), _mm256_set1_epi32(1));
    (ks, _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16)))
}

/// Group `g` of a super-block at `b` whose words [`iq2xxs_words`] gave
/// `(ks, ls)`: the grid magnitudes, the signs as ±1 bytes, the scale in
/// every i16 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn iq2xxs_group(
    b: *const u8,
    ks: __m256i,
    ls: __m256i,
    g: usize,
) -> (__m256i, __m256i, __m256i) {
    let q = b.add(2 + 8 * g);
    let grid = _mm256_set_epi64x(
        IQ2XXS_GRID[*q.add(3) as usize] as i64,
        IQ2XXS_GRID[*q.add(2) as usize] as i64,
        IQ2XXS_GRID[*q.add(1) as usize] as i64,
        IQ2XXS_GRID[*q as usize] as i64,
    );
    let bits = _mm256_loadu_si256(BIT_OF_LANE.as_ptr() as *const __m256i);
    let spread = _mm256_loadu_si256(SPREAD_SIGN_BYTES.as_ptr() as *const __m256i);
    let lane = _mm256_set1_epi32(g as i32);
    let sb = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(ks, lane), spread);
    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(sb, bits), bits);
    let signs = _mm256_or_si256(neg, _mm256_set1_epi8(1));
    (grid, signs, _mm256_permutevar8x32_epi32(ls, lane))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq2xxs(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 66);
    let mut acc = _mm256_setzero_ps();
    for (i, a) in y.iter().enumerate() {
        let b = row.as_ptr().add(66 * i);
        prefetch_weights(b);
        let d = f16_at(b) * a.d * 0.125;
        let (ks, ls) = iq2xxs_words(b);
        let mut sumi = _mm256_setzero_si256();
        for g in 0..8 {
            let (grid, signs, scale) = iq2xxs_group(b, ks, ls, g);
            let act = _mm256_loadu_si256(a.qs.as_ptr().add(32 * g) as *const __m256i);
            let p = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(act, signs));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// [`iq2xxs`] with the signs looked up per group in `SIGNS_PM1` (the
/// kernel before [`iq2xxs_words`]); kept as its twin: the tests check the
/// two bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq2xxs_lookup(row: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(row.len(), y.len() * 66);
    let mut acc = _mm256_setzero_ps();
    for (i, a) in y.iter().enumerate() {
        let b = row.as_ptr().add(66 * i);
        prefetch_weights(b);
        let d = f16_at(b) * a.d * 0.125;
        let mut sumi = _mm256_setzero_si256();
        for g in 0..8 {
            let q = b.add(2 + 8 * g);
            let a1 = u32::from_le_bytes([*q.add(4), *q.add(5), *q.add(6), *q.add(7)]);
            let grid = _mm256_set_epi64x(
                IQ2XXS_GRID[*q.add(3) as usize] as i64,
                IQ2XXS_GRID[*q.add(2) as usize] as i64,
                IQ2XXS_GRID[*q.add(1) as usize] as i64,
                IQ2XXS_GRID[*q as usize] as i64,
            );
            let signs = _mm256_set_epi64x(
                SIGNS_PM1[((a1 >> 21) & 127) as usize] as i64,
                SIGNS_PM1[((a1 >> 14) & 127) as usize] as i64,
                SIGNS_PM1[((a1 >> 7) & 127) as usize] as i64,
                SIGNS_PM1[(a1 & 127) as usize] as i64,
            );
            let act = _mm256_loadu_si256(a.qs.as_ptr().add(32 * g) as *const __m256i);
            let p = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(act, signs));
            let ls = (2 * (a1 >> 28) + 1) as i16;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Σ w·x of 32 signed bytes each, as 8 i32 lanes converted to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8x32(w: __m256i, x: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(row: &[u8], y: &[BlockQ8x32]) -> f32 {
    assert_eq!(row.len(), y.len() * 34);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 1 < y.len() {
        for (k, acc) in [&mut acc0, &mut acc1].into_iter().enumerate() {
            let b = row.as_ptr().add(34 * (i + k));
            prefetch_weights(b);
            let a = &y[i + k];
            let w = _mm256_loadu_si256(b.add(2) as *const __m256i);
            let x = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b) * a.d), dot_i8x32(w, x), *acc);
        }
        i += 2;
    }
    if i < y.len() {
        let b = row.as_ptr().add(34 * i);
        prefetch_weights(b);
        let a = &y[i];
        let w = _mm256_loadu_si256(b.add(2) as *const __m256i);
        let x = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b) * a.d), dot_i8x32(w, x), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// Splits `ys`/`out` into groups of `$big`, 4, 2, 1 rows and runs `$f::<N>`
/// on each (accumulators in registers).
macro_rules! by_groups {
    ($f:ident, $big:literal, $row:expr, $ys:expr, $out:expr) => {{
        let (row, ys, out) = ($row, $ys, $out);
        assert_eq!(ys.len(), out.len());
        let mut j = 0;
        while j < ys.len() {
            let left = ys.len() - j;
            let n = if left >= $big {
                $big
            } else if left >= 4 {
                4
            } else if left >= 2 {
                2
            } else {
                1
            };
            match n {
                $big => $f::<$big>(row, &ys[j..j + $big], &mut out[j..j + $big]),
                4 => $f::<4>(row, &ys[j..j + 4], &mut out[j..j + 4]),
                2 => $f::<2>(row, &ys[j..j + 2], &mut out[j..j + 2]),
                _ => $f::<1>(row, &ys[j..j + 1], &mut out[j..j + 1]),
            }
            j += n;
        }
    }};
}

/// [`q8_0`] of one weight row against several activation rows:
/// `out[j] = q8_0(row, ys[j])` bit for bit. Each weight block is loaded, its
/// magnitudes taken and its scale converted once; every activation row then
/// takes [`q8_0`]'s integer products (`|w| · sign(x, w)`), f32 scale
/// product, two-accumulator order and final reduction in its own registers.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_many(row: &[u8], ys: &[&[BlockQ8x32]], out: &mut [f32]) {
    for y in ys {
        assert_eq!(row.len(), y.len() * 34);
    }
    by_groups!(q8_0_n, 8, row, ys, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8x32]], out: &mut [f32]) {
    let n = row.len() / 34;
    let y: [*const BlockQ8x32; N] = std::array::from_fn(|t| ys[t].as_ptr());
    let mut acc0 = [_mm256_setzero_ps(); N];
    let mut acc1 = [_mm256_setzero_ps(); N];
    let mut i = 0;
    while i + 1 < n {
        q8_0_block(row, &y, i, &mut acc0);
        q8_0_block(row, &y, i + 1, &mut acc1);
        i += 2;
    }
    if i < n {
        q8_0_block(row, &y, i, &mut acc0);
    }
    for t in 0..N {
        out[t] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t]));
    }
}

/// Block `i` of `row` into accumulator `acc[t]` of every activation row `t`
/// ([`dot_i8x32`] with the weight's magnitude and scale hoisted).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_block<const N: usize>(
    row: &[u8],
    y: &[*const BlockQ8x32; N],
    i: usize,
    acc: &mut [__m256; N],
) {
    let ones = _mm256_set1_epi16(1);
    let b = row.as_ptr().add(34 * i);
    prefetch_weights(b);
    let w = _mm256_loadu_si256(b.add(2) as *const __m256i);
    let aw = _mm256_sign_epi8(w, w);
    let dw = f16_at(b);
    for t in 0..N {
        let a = &*y[t].add(i);
        let x = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
        let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
        let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p, acc[t]);
    }
}

/// [`iq2xxs`] of one weight row against several activation rows,
/// `out[j] = iq2xxs(row, ys[j])` bit for bit: per super-block the grid rows,
/// signs and sub-block scales are decoded once, then each activation row
/// takes [`iq2xxs`]'s products and accumulation.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq2xxs_many(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
    for y in ys {
        assert_eq!(row.len(), y.len() * 66);
    }
    by_groups!(iq2xxs_n, 8, row, ys, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2xxs_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
    let nb = row.len() / 66;
    let y: [*const BlockQ8K; N] = std::array::from_fn(|t| ys[t].as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let b = row.as_ptr().add(66 * i);
        prefetch_weights(b);
        let dw = f16_at(b);
        let (ks, ls) = iq2xxs_words(b);
        let mut grids = [_mm256_setzero_si256(); 8];
        let mut signs = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 8];
        for g in 0..8 {
            (grids[g], signs[g], scales[g]) = iq2xxs_group(b, ks, ls, g);
        }
        for t in 0..N {
            let a = &*y[t].add(i);
            let d = dw * a.d * 0.125;
            let mut sumi = _mm256_setzero_si256();
            for g in 0..8 {
                let act = _mm256_loadu_si256(a.qs.as_ptr().add(32 * g) as *const __m256i);
                let p = _mm256_maddubs_epi16(grids[g], _mm256_sign_epi8(act, signs[g]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scales[g]));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum_ps(acc[t]);
    }
}

/// [`q2k`] of one weight row against several activation rows,
/// `out[j] = q2k(row, ys[j])` bit for bit: per super-block the codes,
/// sub-block scales and mins are unpacked once, then each activation row
/// takes [`q2k`]'s products and accumulation.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q2k_many(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
    for y in ys {
        assert_eq!(row.len(), y.len() * 84);
    }
    by_groups!(q2k_n, 8, row, ys, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_n<const N: usize>(row: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
    let nb = row.len() / 84;
    let y: [*const BlockQ8K; N] = std::array::from_fn(|t| ys[t].as_ptr());
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let masks: [__m256i; 8] = std::array::from_fn(|i| pair_mask(2 * i));
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let b = row.as_ptr().add(84 * i);
        prefetch_weights(b);
        let (dw, dminw) = (f16_at(b.add(80)), f16_at(b.add(82)));
        let sc = _mm_loadu_si128(b as *const __m128i);
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
        let scl = _mm256_broadcastsi128_si256(_mm_and_si128(sc, m4));
        let mut codes = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let mut q = _mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i);
            for j in 0..4 {
                codes[4 * h + j] = _mm256_and_si256(q, m3);
                scales[4 * h + j] = _mm256_shuffle_epi8(scl, masks[4 * h + j]);
                q = _mm256_srli_epi16(q, 2);
            }
        }
        for t in 0..N {
            let a = &*y[t].add(i);
            let d = dw * a.d;
            let dmin = dminw * a.d;
            let bsums = _mm256_loadu_si256(a.bsums.as_ptr() as *const __m256i);
            let pm = _mm256_madd_epi16(mins, bsums);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..8 {
                let act = _mm256_loadu_si256(a.qs.as_ptr().add(32 * c) as *const __m256i);
                let p = _mm256_maddubs_epi16(codes[c], act);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scales[c]));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum_ps(acc[t]) - hsum_ps(accm[t]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mxfp4(row: &[u8], y: &[BlockQ8x32]) -> f32 {
    assert_eq!(row.len(), y.len() * 17);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const __m128i));
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (i, a) in y.iter().enumerate() {
        let b = row.as_ptr().add(17 * i);
        prefetch_weights(b);
        let q = _mm_loadu_si128(b.add(1) as *const __m128i);
        let idx = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(q, 4), m4),
            _mm_and_si128(q, m4),
        );
        let w = _mm256_shuffle_epi8(table, idx);
        let x = _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i);
        let d = e8m0_to_f32_half(*b) * a.d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), dot_i8x32(w, x), acc);
    }
    hsum_ps(acc)
}

/// f32 dot of 8-wide chunks with four accumulators; `load(i)` gives weights
/// `8i..8i+8` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_with(n: usize, x: &[f32], load: impl Fn(usize) -> __m256) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let chunks = n / 8;
    let mut c = 0;
    while c + 4 <= chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_loadu_ps(x.as_ptr().add(8 * (c + k)));
            *a = _mm256_fmadd_ps(load(c + k), xv, *a);
        }
        c += 4;
    }
    while c < chunks {
        let xv = _mm256_loadu_ps(x.as_ptr().add(8 * c));
        acc[0] = _mm256_fmadd_ps(load(c), xv, acc[0]);
        c += 1;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum_ps(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32(row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(row.len(), 4 * x.len());
    let n = x.len();
    let p = row.as_ptr() as *const f32;
    let mut s = dot_f32_with(n, x, |c| _mm256_loadu_ps(p.add(8 * c)));
    for (i, &xi) in x.iter().enumerate().skip(n / 8 * 8) {
        s += std::ptr::read_unaligned(p.add(i)) * xi;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16(row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(row.len(), 2 * x.len());
    let n = x.len();
    let p = row.as_ptr();
    let mut s = dot_f32_with(n, x, |c| {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * c) as *const __m128i))
    });
    for (i, &xi) in x.iter().enumerate().skip(n / 8 * 8) {
        s += f16_at(p.add(2 * i)) * xi;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bf16(row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(row.len(), 2 * x.len());
    let n = x.len();
    let p = row.as_ptr();
    let mut s = dot_f32_with(n, x, |c| {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16 * c) as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
    });
    for (i, &xi) in x.iter().enumerate().skip(n / 8 * 8) {
        s += crate::quant::f16::bf16_bits_to_f32(u16::from_le_bytes([
            *p.add(2 * i),
            *p.add(2 * i + 1),
        ])) * xi;
    }
    s
}

/// Dot of an expanded row (int8 codes, f32 scale per 32) with Q8x32
/// activations (see `super::expand`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn expanded(codes: &[i8], scale: &[f32], y: &[BlockQ8x32]) -> f32 {
    assert!(codes.len() == y.len() * 32 && scale.len() == y.len());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let n = y.len();
    let mut i = 0;
    while i + 1 < n {
        let w0 = _mm256_loadu_si256(codes.as_ptr().add(32 * i) as *const __m256i);
        let x0 = _mm256_loadu_si256(y[i].qs.as_ptr() as *const __m256i);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale[i] * y[i].d), dot_i8x32(w0, x0), acc0);
        let w1 = _mm256_loadu_si256(codes.as_ptr().add(32 * i + 32) as *const __m256i);
        let x1 = _mm256_loadu_si256(y[i + 1].qs.as_ptr() as *const __m256i);
        acc1 = _mm256_fmadd_ps(
            _mm256_set1_ps(scale[i + 1] * y[i + 1].d),
            dot_i8x32(w1, x1),
            acc1,
        );
        i += 2;
    }
    if i < n {
        let w0 = _mm256_loadu_si256(codes.as_ptr().add(32 * i) as *const __m256i);
        let x0 = _mm256_loadu_si256(y[i].qs.as_ptr() as *const __m256i);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale[i] * y[i].d), dot_i8x32(w0, x0), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// `y += a·x` (attention's weighted sum of rows).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let yv = _mm256_loadu_ps(y.as_ptr().add(i));
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(av, xv, yv));
        i += 8;
    }
    while i < n {
        y[i] += a * x[i];
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    /// [`super::f16_at`] (assembly) against `half`'s conversion for every
    /// f16 bit pattern, read at an odd address: equal bits for every number,
    /// a NaN for every NaN (F16C quiets signalling NaNs).
    #[test]
    fn f16_at_converts_every_half_as_half_does() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("no AVX2/FMA/F16C here: the assembly is not exercised");
            return;
        }
        let mut buf = [0u8; 3];
        for h in 0..=u16::MAX {
            buf[1..].copy_from_slice(&h.to_le_bytes());
            // SAFETY: AVX2/FMA/F16C checked above; two bytes at buf[1..].
            let got = unsafe { super::f16_at(buf.as_ptr().add(1)) };
            let want = half::f16::from_bits(h).to_f32();
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}: {got} is not a NaN");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}: {got} vs {want}");
            }
        }
    }
}
