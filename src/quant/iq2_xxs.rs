//! IQ2_XXS (type 16, QUANTS.md §6): 256 values in 66 bytes (2.06 bits each).
//!
//! Each 32-value group stores four 8-bit indices into a fixed 256-entry grid
//! of 8-value magnitude patterns (magnitudes 8, 25, 43), four 7-bit sign
//! fields (the 8th sign is implied: the number of negated values per 8 is
//! even) and a 4-bit group scale `ls`; one f16 `d` scales the super-block:
//! `value = d·(0.5 + ls)·0.25 · mag · (±1)`. The q2 Flash files store the
//! routed gate/up experts this way.
//!
//! Decoding follows gguf-py's arithmetic order exactly so rows are
//! bit-identical to it. The quantizer is our own importance-weighted search;
//! the key fact it uses is that for a fixed pattern `p` the weighted error of
//! an 8-value piece at scale `s` is the quadratic `C − 2s·A_p + s²·B_p`, so
//! `A_p`, `B_p` are computed once per piece and every candidate scale costs
//! one pass over the 256 patterns. The sign-parity constraint folds into
//! `A_p`: when the piece has an odd number of negative inputs, the cheapest
//! element to flip (smallest `w·|x|·mag`) adds `4s·w·|x|·mag` to the error.

// Element indices map straight into the packed layout; index loops read
// closer to QUANTS.md than iterator chains here.
#![allow(clippy::needless_range_loop)]

use super::f16::{f16_bits_to_f32, f32_to_f16_bits};
use super::iq2xxs_tables::{IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::kquant;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// Values per super-block.
pub use super::kquant::QK_K;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 66;

/// One IQ2_XXS super-block as stored in the file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    /// Super-block scale, f16 bits.
    pub d: u16,
    /// Eight 8-byte groups (see [`Group`]). Kept as bytes because the two
    /// u32 words of a group sit at 2-byte-aligned offsets in the file.
    pub qs: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == BLOCK_BYTES);

/// The decoded fields of one 32-value group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Grid index of each 8-value piece.
    pub grid: [u8; 4],
    /// 7-bit sign index of each piece (into `KSIGNS_IQ2XS`).
    pub signs: [u8; 4],
    /// 4-bit group scale.
    pub ls: u8,
}

impl Group {
    /// Reads group `g` (0..8) of a block.
    pub fn read(b: &BlockIq2Xxs, g: usize) -> Group {
        let q = &b.qs[8 * g..8 * g + 8];
        let a0 = u32::from_le_bytes(q[0..4].try_into().unwrap());
        let a1 = u32::from_le_bytes(q[4..8].try_into().unwrap());
        Group {
            grid: a0.to_le_bytes(),
            signs: std::array::from_fn(|k| ((a1 >> (7 * k)) & 127) as u8),
            ls: (a1 >> 28) as u8,
        }
    }

    /// Writes the group into `b` at position `g`.
    pub fn write(&self, b: &mut BlockIq2Xxs, g: usize) {
        let mut a1 = (self.ls as u32 & 15) << 28;
        for k in 0..4 {
            a1 |= (self.signs[k] as u32 & 127) << (7 * k);
        }
        b.qs[8 * g..8 * g + 4].copy_from_slice(&self.grid);
        b.qs[8 * g + 4..8 * g + 8].copy_from_slice(&a1.to_le_bytes());
    }
}

/// Magnitude of element `i` of grid pattern `p`.
#[inline]
fn mag(p: u8, i: usize) -> u8 {
    (IQ2XXS_GRID[p as usize] >> (8 * i)) as u8
}

/// The grid magnitudes as f32 (exact: 8, 25 or 43), so decoding needs no
/// shift and conversion per value.
static GRID_F32: [[f32; 8]; 256] = {
    let mut t = [[0f32; 8]; 256];
    let mut p = 0;
    while p < 256 {
        let mut i = 0;
        while i < 8 {
            t[p][i] = ((IQ2XXS_GRID[p] >> (8 * i)) as u8) as f32;
            i += 1;
        }
        p += 1;
    }
    t
};

/// [`GRID_F32`] transposed: element `i` of every pattern, so the
/// quantizer's per-pattern sums run across patterns and vectorize.
static GRID_F32_BY_ELEMENT: [[f32; 256]; 8] = {
    let mut t = [[0f32; 256]; 8];
    let mut p = 0;
    while p < 256 {
        let mut i = 0;
        while i < 8 {
            t[i][p] = GRID_F32[p][i];
            i += 1;
        }
        p += 1;
    }
    t
};

/// Group scale `db` exactly as the decoder computes it.
#[inline]
fn group_scale(d: f32, ls: u8) -> f32 {
    d * (0.5 + ls as f32) * 0.25
}

fn blocks(src: &[u8]) -> impl Iterator<Item = BlockIq2Xxs> + '_ {
    super::blocks(src)
}

/// Decodes one block into 256 values.
fn decode_block(b: &BlockIq2Xxs, out: &mut [f32]) {
    let d = f16_bits_to_f32(b.d);
    for g in 0..8 {
        let grp = Group::read(b, g);
        let db = group_scale(d, grp.ls);
        for k in 0..4 {
            let signs = KSIGNS_IQ2XS[grp.signs[k] as usize];
            let o = &mut out[32 * g + 8 * k..][..8];
            let mags = &GRID_F32[grp.grid[k] as usize];
            for (i, v) in o.iter_mut().enumerate() {
                let m = db * mags[i];
                // Branch-free negation (a sign-bit flip, exactly `-m`):
                // random sign bits would defeat the branch predictor.
                let flip = ((signs >> i) & 1) as u32;
                *v = f32::from_bits(m.to_bits() ^ (flip << 31));
            }
        }
    }
}

/// Decodes an IQ2_XXS row. Panics if `src` is not exactly `dst.len()/256`
/// blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert!(dst.len() % QK_K == 0 && src.len() == dst.len() / QK_K * BLOCK_BYTES);
    for (b, out) in blocks(src).zip(dst.chunks_exact_mut(QK_K)) {
        decode_block(&b, out);
    }
}

/// Dot of an IQ2_XXS row with `x`: per group `db·Σ ±mag·x` in f32, summed
/// in f32; equal to dequantize-then-dot up to f32 rounding.
pub fn dot_row(src: &[u8], x: &[f32]) -> f32 {
    assert!(x.len() % QK_K == 0 && src.len() == x.len() / QK_K * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, xs) in blocks(src).zip(x.chunks_exact(QK_K)) {
        let d = f16_bits_to_f32(b.d);
        for g in 0..8 {
            let grp = Group::read(&b, g);
            let mut s = 0.0f32;
            for k in 0..4 {
                let signs = KSIGNS_IQ2XS[grp.signs[k] as usize];
                for i in 0..8 {
                    let v = mag(grp.grid[k], i) as f32 * xs[32 * g + 8 * k + i];
                    s += if signs & KMASK_IQ2XS[i] != 0 { -v } else { v };
                }
            }
            acc += group_scale(d, grp.ls) * s;
        }
    }
    acc
}

/// Integer dot product with Q8_K activations as ds4 evaluates it
/// (QUANTS.md §8): `d·d_x·0.125·Σ_g (2·ls+1)·Σ ±mag·q8`. Panics if the row
/// has a different number of blocks than `y`.
pub fn dot_q8k(src: &[u8], y: &[BlockQ8K]) -> f32 {
    assert_eq!(src.len(), y.len() * BLOCK_BYTES);
    let mut acc = 0.0f32;
    for (b, a) in blocks(src).zip(y) {
        let mut sum = 0i32;
        for g in 0..8 {
            let grp = Group::read(&b, g);
            let mut s = 0i32;
            for k in 0..4 {
                let signs = KSIGNS_IQ2XS[grp.signs[k] as usize];
                for i in 0..8 {
                    let v = mag(grp.grid[k], i) as i32 * a.qs[32 * g + 8 * k + i] as i32;
                    s += if signs & KMASK_IQ2XS[i] != 0 { -v } else { v };
                }
            }
            sum += (2 * grp.ls as i32 + 1) * s;
        }
        acc += f16_bits_to_f32(b.d) * a.d * 0.125 * sum as f32;
    }
    acc
}

// ---------------------------------------------------------------- quantizer

/// Per-piece sufficient statistics: error at scale `s` with pattern `p` is
/// `c − 2s·a[p] + s²·b[p]` (parity correction already inside `a`).
struct Piece {
    a: [f32; 256],
    b: [f32; 256],
    c: f32,
}

impl Piece {
    fn new(x: &[f32], w: &[f32]) -> Piece {
        let odd = x.iter().filter(|v| **v < 0.0).count() % 2 == 1;
        let mut p = Piece {
            a: [0.0; 256],
            b: [0.0; 256],
            c: 0.0,
        };
        for i in 0..8 {
            p.c += w[i] * x[i] * x[i];
        }
        // Per pattern: a = Σ_i w·|x|·m, b = Σ_i w·m·m, flip = min_i w·|x|·m,
        // summed over i in order as one pattern at a time would, but with
        // the patterns in the inner loop (vectorized; this was a quarter of
        // a q2 conversion's time).
        let mut flip = [f32::INFINITY; 256];
        for i in 0..8 {
            let (wx, wi) = (w[i] * x[i].abs(), w[i]);
            let m = &GRID_F32_BY_ELEMENT[i];
            for pat in 0..256 {
                let t = wx * m[pat];
                p.a[pat] += t;
                p.b[pat] += wi * m[pat] * m[pat];
                flip[pat] = flip[pat].min(t);
            }
        }
        if odd {
            for (a, f) in p.a.iter_mut().zip(&flip) {
                *a -= 2.0 * f;
            }
        }
        p
    }

    /// Best pattern and its error at scale `s`.
    fn best(&self, s: f32) -> (u8, f32) {
        let mut best = (0u8, f32::INFINITY);
        for pat in 0..256 {
            let e = s * (s * self.b[pat] - 2.0 * self.a[pat]);
            if e < best.1 {
                best = (pat as u8, e);
            }
        }
        (best.0, self.c + best.1)
    }
}

impl Piece {
    /// The error of [`Piece::best`] alone: the same minimum over the same
    /// 256 products, found in eight independent lanes so that it
    /// vectorizes (the first-index rule of `best` needs a scalar loop; the
    /// minimum value does not depend on the order). The scale sweeps ask
    /// only for this, about 97 % of the calls, and it was 83 % of a q2
    /// conversion's time.
    fn best_error(&self, s: f32) -> f32 {
        let mut m = [f32::INFINITY; 8];
        for (a, b) in self.a.chunks_exact(8).zip(self.b.chunks_exact(8)) {
            for l in 0..8 {
                let e = s * (s * b[l] - 2.0 * a[l]);
                m[l] = if e < m[l] { e } else { m[l] };
            }
        }
        self.c
            + m.iter()
                .fold(f32::INFINITY, |x, &y| if y < x { y } else { x })
    }
}

/// Error of a 32-value group (four pieces) at scale `s`.
fn group_error(pieces: &[Piece], s: f32) -> f32 {
    pieces.iter().map(|p| p.best_error(s)).sum()
}

/// Best continuous group scale: a geometric sweep over plausible scales,
/// then a least-squares polish with the patterns chosen at the best one.
fn best_group_scale(pieces: &[Piece], amax: f32) -> f32 {
    if amax == 0.0 {
        return 0.0;
    }
    // Largest input mapped anywhere from magnitude 7 to 70: covers the peak
    // on 8 (flat groups), 25 or 43, and clipping outliers.
    let (lo, hi, n) = (amax / 70.0, amax / 7.0, 40);
    let ratio = (hi / lo).powf(1.0 / (n - 1) as f32);
    let (mut best_s, mut best_e) = (lo, f32::INFINITY);
    let mut s = lo;
    for _ in 0..n {
        let e = group_error(pieces, s);
        if e < best_e {
            (best_s, best_e) = (s, e);
        }
        s *= ratio;
    }
    for _ in 0..3 {
        let (mut num, mut den) = (0.0f32, 0.0f32);
        for p in pieces {
            let (pat, _) = p.best(best_s);
            num += p.a[pat as usize];
            den += p.b[pat as usize];
        }
        if den <= 0.0 || num <= 0.0 {
            break;
        }
        let s = num / den;
        let e = group_error(pieces, s);
        if e < best_e {
            (best_s, best_e) = (s, e);
        } else {
            break;
        }
    }
    best_s
}

/// Picks `ls` for one group given the f16 super-scale `d`; returns
/// `(ls, error)`.
fn best_ls(pieces: &[Piece], d: f32, target: f32) -> (u8, f32) {
    // ls nearest to the continuous optimum, and its neighbours.
    let centre = if d > 0.0 {
        (target / d * 4.0 - 0.5).round()
    } else {
        0.0
    };
    let centre = centre.clamp(0.0, 15.0) as i32;
    let mut best = (0u8, f32::INFINITY);
    for ls in (centre - 1).max(0)..=(centre + 1).min(15) {
        let e = group_error(pieces, group_scale(d, ls as u8));
        if e < best.1 {
            best = (ls as u8, e);
        }
    }
    best
}

/// Quantizes one super-block of 256 values with weights `w`.
pub fn quantize_block(x: &[f32], w: &[f32]) -> BlockIq2Xxs {
    assert!(x.len() == QK_K && w.len() == QK_K);
    let pieces: Vec<Piece> = (0..32)
        .map(|k| Piece::new(&x[8 * k..8 * k + 8], &w[8 * k..8 * k + 8]))
        .collect();
    let mut target = [0.0f32; 8];
    for g in 0..8 {
        let amax = x[32 * g..32 * g + 32]
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()));
        target[g] = best_group_scale(&pieces[4 * g..4 * g + 4], amax);
    }
    let smax = target.iter().fold(0.0f32, |m, &v| m.max(v));
    let mut out = BlockIq2Xxs::zeroed();
    if smax.is_nan() || smax <= 0.0 {
        return out; // all zero (d = 0 decodes to exact zeros)
    }
    // The largest group scale is d·3.875 at ls = 15. Try a few d around that
    // choice: a slightly larger d trades the top group's precision for a
    // better ls grid for the others.
    let d0 = smax / 3.875;
    let (mut best_d, mut best_ls_set, mut best_e) = (0u16, [0u8; 8], f32::INFINITY);
    for f in [0.94f32, 0.97, 1.0, 1.03, 1.06, 1.1, 1.15] {
        let dbits = f32_to_f16_bits((d0 * f).min(65504.0));
        let d = f16_bits_to_f32(dbits);
        let mut ls_set = [0u8; 8];
        let mut e = 0.0f32;
        for g in 0..8 {
            let (ls, eg) = best_ls(&pieces[4 * g..4 * g + 4], d, target[g]);
            ls_set[g] = ls;
            e += eg;
        }
        if e < best_e {
            (best_d, best_ls_set, best_e) = (dbits, ls_set, e);
        }
    }
    out.d = best_d;
    let d = f16_bits_to_f32(best_d);
    for g in 0..8 {
        let s = group_scale(d, best_ls_set[g]);
        let mut grp = Group {
            grid: [0; 4],
            signs: [0; 4],
            ls: best_ls_set[g],
        };
        for k in 0..4 {
            let piece = 4 * g + k;
            let (pat, _) = pieces[piece].best(s);
            let xs = &x[8 * piece..8 * piece + 8];
            let ws = &w[8 * piece..8 * piece + 8];
            let mut signs = 0u8;
            for (i, &v) in xs.iter().enumerate() {
                if v < 0.0 {
                    signs |= 1 << i;
                }
            }
            if signs.count_ones() % 2 == 1 {
                // Flip the element whose sign error costs least (the same
                // choice the parity term in `Piece::new` priced in).
                let i = (0..8)
                    .min_by(|&i, &j| {
                        let ci = ws[i] * xs[i].abs() * mag(pat, i) as f32;
                        let cj = ws[j] * xs[j].abs() * mag(pat, j) as f32;
                        ci.total_cmp(&cj)
                    })
                    .unwrap();
                signs ^= 1 << i;
            }
            grp.grid[k] = pat;
            grp.signs[k] = signs & 127; // bit 7 is implied by the even parity
        }
        grp.write(&mut out, g);
    }
    out
}

/// Quantizes a row; `importance` (one weight per element, e.g. an imatrix
/// row) sets the per-element weight of the squared error.
pub fn quantize_row(src: &[f32], dst: &mut [u8], importance: Option<&[f32]>) {
    kquant::quantize_row(src, dst, importance, quantize_block);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_fields_round_trip() {
        let mut b = BlockIq2Xxs::zeroed();
        let grp = Group {
            grid: [1, 77, 200, 255],
            signs: [0, 127, 5, 64],
            ls: 11,
        };
        grp.write(&mut b, 3);
        assert_eq!(Group::read(&b, 3), grp);
        assert_eq!(
            Group::read(&b, 2),
            Group {
                grid: [0; 4],
                signs: [0; 4],
                ls: 0
            }
        );
    }

    #[test]
    fn best_error_is_the_error_of_best() {
        // Random pieces, weights with zeros and ties, odd and even sign
        // counts, scales over four decades: the lane-wise minimum is
        // bit for bit the error `best` returns.
        let mut r = 0x9e37_79b9u32;
        let mut next = || {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            r as f32 / u32::MAX as f32 - 0.5
        };
        for case in 0..200 {
            let x: Vec<f32> = (0..8).map(|_| next() * 4.0).collect();
            let w: Vec<f32> = (0..8)
                .map(|i| {
                    if (case + i) % 5 == 0 {
                        0.0
                    } else {
                        next().abs() + 0.25
                    }
                })
                .collect();
            let p = Piece::new(&x, &w);
            for k in 0..40 {
                let s = 0.001 * 1.3f32.powi(k);
                assert_eq!(
                    p.best_error(s).to_bits(),
                    p.best(s).1.to_bits(),
                    "{case} {s}"
                );
            }
        }
    }

    #[test]
    fn quantizer_keeps_signs_with_even_parity() {
        // Three negatives in the first piece: one must be flipped, and it
        // should be the smallest one.
        let mut x = [0.5f32; 256];
        x[0] = -3.0;
        x[1] = -2.0;
        x[2] = -0.01;
        let w = [1.0f32; 256];
        let b = quantize_block(&x, &w);
        let mut y = [0.0f32; 256];
        decode_block(&b, &mut y);
        assert!(y[0] < 0.0 && y[1] < 0.0 && y[2] > 0.0);
        assert!(y[3..].iter().all(|&v| v > 0.0));
    }
}
