//! Prefill path for the 2-bit and 4-bit formats: each weight row is decoded
//! once into int8 codes with one f32 scale per 32 values (and, for the
//! K-quants, an f32 offset per 16 values), exactly — no rounding — and then
//! dotted with every token's Q8x32 activations by one int8 kernel. The
//! format's unpacking cost (grid lookups, sign flips, nibble and scale
//! shuffles) is paid once per row instead of once per (row, token).
//!
//! Q8_0 rows only have their f16 scales widened once. Exactness: IQ2_XXS `d·(2ls+1)/8 · (±mag)`, MXFP4 `e · kvalue`, Q4_K
//! `(d·sc)·q − dmin·m`, Q2_K `d·(sc·q) − dmin·m` (sc·q ≤ 45 fits int8).

use super::act::BlockQ8x32;
use crate::quant::f16::f16_bits_to_f32;
use crate::quant::iq2xxs_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES};
use crate::quant::q4_k::unpack_scales;
use crate::quant::GgmlType;

/// One decoded weight row: `n` codes, `n/32` scales, `n/16` offsets (the
/// offsets are only used when `has_off`).
pub struct Expanded {
    pub codes: Vec<i8>,
    pub scale: Vec<f32>,
    pub off: Vec<f32>,
    pub has_off: bool,
}

impl Expanded {
    pub fn new(n: usize) -> Expanded {
        Expanded {
            codes: vec![0; n],
            scale: vec![0.0; n / 32],
            off: vec![0.0; n / 16],
            has_off: false,
        }
    }
}

/// Whether [`expand`] handles `ty`.
pub fn expandable(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2K | GgmlType::Q4K | GgmlType::Iq2Xxs | GgmlType::Mxfp4 | GgmlType::Q8_0
    )
}

/// Whether rows of `ty` carry per-16 offsets (the K-quants' min terms).
pub fn has_offsets(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q2K | GgmlType::Q4K)
}

/// `KSIGNS_IQ2XS` as byte masks: 0xFF where the value is negated.
static SIGN_MASK: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut s = 0;
    while s < 128 {
        let mut v = 0u64;
        let mut i = 0;
        while i < 8 {
            if KSIGNS_IQ2XS[s] & (1 << i) != 0 {
                v |= 0xFF << (8 * i);
            }
            i += 1;
        }
        t[s] = v;
        s += 1;
    }
    t
};

const LOW_BYTES: u64 = 0x0101_0101_0101_0101;

/// Writes 8 codes held as the bytes of `v` (little-endian) at `c[..8]`.
#[inline]
fn put8(c: &mut [i8], v: u64) {
    let c: &mut [i8; 8] = (&mut c[..8]).try_into().expect("8 codes");
    *c = bytemuck::cast(v.to_le_bytes());
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// [`expand`] through `isa`'s SIMD decoders where it has them (IQ2_XXS,
/// Q2_K, Q4_K on avx2/avx512): the same bytes, fewer instructions.
pub fn expand_isa(isa: super::Isa, ty: GgmlType, row: &[u8], e: &mut Expanded) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, super::Isa::Avx2 | super::Isa::Avx512)
        && matches!(ty, GgmlType::Iq2Xxs | GgmlType::Q2K | GgmlType::Q4K)
        && super::Isa::Avx2.supported()
    {
        let blocks = row.len() / ty.block_bytes();
        assert!(
            e.codes.len() == 256 * blocks
                && e.scale.len() == 8 * blocks
                && e.off.len() == 16 * blocks
        );
        // SAFETY: AVX2 checked above; every block read and write is within
        // `row` and `e` by the assert.
        unsafe {
            match ty {
                GgmlType::Iq2Xxs => x86::iq2xxs(row, e),
                GgmlType::Q2K => x86::q2k(row, e),
                _ => x86::q4k(row, e),
            }
        }
        return;
    }
    let _ = isa;
    expand(ty, row, e)
}

/// Decodes one row of `ty` into `e` (sized for the row's element count).
pub fn expand(ty: GgmlType, row: &[u8], e: &mut Expanded) {
    match ty {
        GgmlType::Q8_0 => {
            e.has_off = false;
            for (i, b) in row.chunks_exact(34).enumerate() {
                e.scale[i] = f16_at(b, 0);
                e.codes[32 * i..32 * i + 32].copy_from_slice(bytemuck::cast_slice(&b[2..34]));
            }
        }
        GgmlType::Mxfp4 => {
            e.has_off = false;
            for (i, b) in row.chunks_exact(17).enumerate() {
                e.scale[i] = e8m0_to_f32_half(b[0]);
                let c = &mut e.codes[32 * i..32 * i + 32];
                for (l, &q) in b[1..17].iter().enumerate() {
                    c[l] = KVALUES[(q & 15) as usize];
                    c[l + 16] = KVALUES[(q >> 4) as usize];
                }
            }
        }
        GgmlType::Iq2Xxs => {
            e.has_off = false;
            for (i, b) in row.chunks_exact(66).enumerate() {
                let d = f16_at(b, 0) * 0.125;
                for g in 0..8 {
                    let q = &b[2 + 8 * g..2 + 8 * g + 8];
                    let a1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
                    e.scale[8 * i + g] = d * (2 * (a1 >> 28) + 1) as f32;
                    // Per 8 values: the grid's magnitudes (all positive),
                    // negated bytewise where the sign mask says so: −m is
                    // (m ^ 0xFF) + 1, and no byte carries (m ≥ 8).
                    for k in 0..4 {
                        let grid = IQ2XXS_GRID[q[k] as usize];
                        let m = SIGN_MASK[((a1 >> (7 * k)) & 127) as usize];
                        let v = (grid ^ m).wrapping_add(m & LOW_BYTES);
                        put8(&mut e.codes[256 * i + 32 * g + 8 * k..], v);
                    }
                }
            }
        }
        GgmlType::Q4K => {
            e.has_off = true;
            for (i, b) in row.chunks_exact(144).enumerate() {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
                let (sc, m) = unpack_scales(scales);
                for c in 0..4 {
                    let q = &b[16 + 32 * c..16 + 32 * c + 32];
                    let (j0, j1) = (8 * i + 2 * c, 8 * i + 2 * c + 1);
                    e.scale[j0] = d * sc[2 * c] as f32;
                    e.scale[j1] = d * sc[2 * c + 1] as f32;
                    let (m0, m1) = (-dmin * m[2 * c] as f32, -dmin * m[2 * c + 1] as f32);
                    e.off[2 * j0] = m0;
                    e.off[2 * j0 + 1] = m0;
                    e.off[2 * j1] = m1;
                    e.off[2 * j1 + 1] = m1;
                    let base = 256 * i + 64 * c;
                    for l in (0..32).step_by(8) {
                        let v = u64_at(q, l);
                        put8(&mut e.codes[base + l..], v & (15 * LOW_BYTES));
                        put8(&mut e.codes[base + 32 + l..], (v >> 4) & (15 * LOW_BYTES));
                    }
                }
            }
        }
        GgmlType::Q2K => {
            e.has_off = true;
            for (i, b) in row.chunks_exact(84).enumerate() {
                let d = f16_at(b, 80);
                let dmin = f16_at(b, 82);
                for s in 0..8 {
                    e.scale[8 * i + s] = d;
                }
                for h in 0..2 {
                    let qs = &b[16 + 32 * h..16 + 32 * h + 32];
                    for j in 0..4 {
                        for part in 0..2 {
                            let sub = 8 * h + 2 * j + part;
                            let s = b[sub];
                            e.off[16 * i + sub] = -dmin * (s >> 4) as f32;
                            // sc·q ≤ 45 per byte: the product never carries.
                            let sc = (s & 15) as u64;
                            for l in (0..16).step_by(8) {
                                let v = (u64_at(qs, 16 * part + l) >> (2 * j)) & (3 * LOW_BYTES);
                                put8(&mut e.codes[256 * i + 16 * sub + l..], v * sc);
                            }
                        }
                    }
                }
            }
        }
        _ => unreachable!("expandable() admitted {ty}"),
    }
}

/// The per-16 activation sums `d·Σ q` of Q8x32 rows (for the offsets).
pub fn sums16(blocks: &[BlockQ8x32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for b in blocks {
        for h in 0..2 {
            let s: i32 = b.qs[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum();
            out.push(b.d * s as f32);
        }
    }
    out
}

/// Portable dot of an expanded row with Q8x32 activations (offsets not
/// included: see [`offsets`]).
pub fn dot_portable(codes: &[i8], scale: &[f32], y: &[BlockQ8x32]) -> f32 {
    let mut acc = 0f32;
    for ((c, &s), a) in codes.chunks_exact(32).zip(scale).zip(y) {
        let i: i32 = c
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| w as i32 * x as i32)
            .sum();
        acc += s * a.d * i as f32;
    }
    acc
}

/// The offset term `Σ off · sums16` of a row with `has_off`.
#[inline]
pub fn offsets(e: &Expanded, sums: &[f32]) -> f32 {
    if e.has_off {
        crate::graph::ops::dot(&e.off, sums)
    } else {
        0.0
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 row decoders: the scalar [`super::expand`]'s bytes, a vector at
    //! a time.
    use super::{f16_at, Expanded, LOW_BYTES, SIGN_MASK};
    use crate::quant::iq2xxs_tables::IQ2XXS_GRID;
    use crate::quant::q4_k::unpack_scales;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    pub unsafe fn iq2xxs(row: &[u8], e: &mut Expanded) {
        e.has_off = false;
        let _ = LOW_BYTES;
        for (i, b) in row.chunks_exact(66).enumerate() {
            let d = f16_at(b, 0) * 0.125;
            for g in 0..8 {
                let q = b.as_ptr().add(2 + 8 * g);
                let a1 = std::ptr::read_unaligned(q.add(4) as *const u32);
                e.scale[8 * i + g] = d * (2 * (a1 >> 28) + 1) as f32;
                let grid = _mm256_set_epi64x(
                    IQ2XXS_GRID[*q.add(3) as usize] as i64,
                    IQ2XXS_GRID[*q.add(2) as usize] as i64,
                    IQ2XXS_GRID[*q.add(1) as usize] as i64,
                    IQ2XXS_GRID[*q as usize] as i64,
                );
                let m = _mm256_set_epi64x(
                    SIGN_MASK[((a1 >> 21) & 127) as usize] as i64,
                    SIGN_MASK[((a1 >> 14) & 127) as usize] as i64,
                    SIGN_MASK[((a1 >> 7) & 127) as usize] as i64,
                    SIGN_MASK[(a1 & 127) as usize] as i64,
                );
                // −g = (g ^ 0xFF) − (−1) where the mask is set.
                let v = _mm256_sub_epi8(_mm256_xor_si256(grid, m), m);
                let dst = e.codes.as_mut_ptr().add(256 * i + 32 * g);
                _mm256_storeu_si256(dst as *mut __m256i, v);
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn q2k(row: &[u8], e: &mut Expanded) {
        e.has_off = true;
        let m3 = _mm256_set1_epi8(3);
        for (i, b) in row.chunks_exact(84).enumerate() {
            let d = f16_at(b, 80);
            let dmin = f16_at(b, 82);
            e.scale[8 * i..8 * i + 8].fill(d);
            for (sub, &bs) in b[..16].iter().enumerate() {
                e.off[16 * i + sub] = -dmin * (bs >> 4) as f32;
            }
            for h in 0..2 {
                let mut q = _mm256_loadu_si256(b.as_ptr().add(16 + 32 * h) as *const __m256i);
                for j in 0..4 {
                    let sub = 8 * h + 2 * j;
                    let v = _mm256_and_si256(q, m3);
                    q = _mm256_srli_epi16(q, 2);
                    // Per 16-bit word (two codes ≤ 3) times the sub-block
                    // scale (≤ 15): each byte's product stays below 256.
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16((b[sub + 1] & 15) as i16),
                        _mm_set1_epi16((b[sub] & 15) as i16),
                    );
                    let dst = e.codes.as_mut_ptr().add(256 * i + 16 * sub);
                    _mm256_storeu_si256(dst as *mut __m256i, _mm256_mullo_epi16(v, sc));
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn q4k(row: &[u8], e: &mut Expanded) {
        e.has_off = true;
        let m4 = _mm256_set1_epi8(15);
        for (i, b) in row.chunks_exact(144).enumerate() {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
            let (sc, m) = unpack_scales(scales);
            for j in 0..8 {
                e.scale[8 * i + j] = d * sc[j] as f32;
                let mj = -dmin * m[j] as f32;
                e.off[16 * i + 2 * j] = mj;
                e.off[16 * i + 2 * j + 1] = mj;
            }
            for c in 0..4 {
                let q = _mm256_loadu_si256(b.as_ptr().add(16 + 32 * c) as *const __m256i);
                let dst = e.codes.as_mut_ptr().add(256 * i + 64 * c);
                _mm256_storeu_si256(dst as *mut __m256i, _mm256_and_si256(q, m4));
                _mm256_storeu_si256(
                    dst.add(32) as *mut __m256i,
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                );
            }
        }
    }
}
