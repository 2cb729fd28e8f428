//! Affine super-block fitting shared by the Q2_K and Q4_K quantizers.
//!
//! Both formats store, per 256-value super-block, sub-blocks of values
//! `x ≈ (d·sc_j)·q − (dmin·m_j)` with small unsigned integers `q`, `sc_j`,
//! `m_j` and two f16 super-scales. Only the widths differ (Q4_K: 8 × 32
//! values, q ≤ 15, 6-bit sc/m; Q2_K: 16 × 16 values, q ≤ 3, 4-bit sc/m), so
//! the search lives here once:
//!
//! 1. each sub-block gets a continuous fit `(s_j, m_j)` minimising the
//!    weighted squared error: a sweep of candidate step sizes around the
//!    min/max step (the min/max fit itself is one candidate, so we never do
//!    worse than it before scale quantization), each followed by a weighted
//!    least-squares solve for `(s, m)` given the integer codes, then a few
//!    alternating re-assign/re-solve rounds;
//! 2. `d`/`dmin` are set from the largest `s_j`/`m_j`, rounded to f16, and each
//!    `(sc_j, m_j)` integer pair is chosen among the floor/ceil neighbours by
//!    the actual error after re-assigning the codes;
//! 3. `d`/`dmin` are re-solved by least squares over the whole super-block
//!    given the integer codes, rounded to f16 and kept if the error drops.
//!
//! Errors are always measured with the decoder's own arithmetic, so the
//! choice made is the one that decodes best.
//!
//! The super-block size all K-quant formats share ([`QK_K`], Q8_K and
//! IQ2_XXS included) and the row loop every importance-weighted super-block
//! quantizer runs (Q2_K, Q4_K, IQ2_XXS: [`quantize_row`]) are here too.

use super::f16::{f16_bits_to_f32, f32_to_f16_bits};
use bytemuck::Pod;

/// Values per super-block of the K-quant formats.
pub const QK_K: usize = 256;

/// Shape of one K-quant format.
pub(crate) struct Shape {
    /// Values per sub-block (32 for Q4_K, 16 for Q2_K).
    pub sub: usize,
    /// Largest code `q`.
    pub nmax: u8,
    /// Largest integer sub-scale / sub-min.
    pub smax: u8,
}

/// Result of fitting one 256-value super-block.
pub(crate) struct Fit {
    pub d: u16,
    pub dmin: u16,
    pub sc: Vec<u8>,
    pub m: Vec<u8>,
    pub q: [u8; QK_K],
}

/// Largest finite f16, used to keep super-scales finite on huge inputs.
const F16_MAX: f32 = 65504.0;

fn to_f16(v: f32) -> (u16, f32) {
    let b = f32_to_f16_bits(v.clamp(0.0, F16_MAX));
    (b, f16_bits_to_f32(b))
}

/// Smallest f16 at or above `v` (finite, ≥ 0). The initial super-scales
/// must not round down: a `d` below `max s_j / smax` would clip the largest
/// sub-scale, and for tiny inputs round-to-nearest can even give `d = 0`.
fn to_f16_up(v: f32) -> u16 {
    let (b, f) = to_f16(v);
    if f < v && b < 0x7bff {
        b + 1
    } else {
        b
    }
}

/// Code for `x` given step `s` and offset `-m`, clamped to `0..=nmax`.
fn code(x: f32, s: f32, m: f32, nmax: u8) -> u8 {
    if s <= 0.0 {
        return 0;
    }
    ((x + m) / s).round().clamp(0.0, nmax as f32) as u8
}

/// Weighted least squares for `x ≈ s·q − m` with `m ≥ 0`, `s ≥ 0`.
fn solve_sm(x: &[f32], w: &[f32], q: &[u8]) -> (f32, f32) {
    let (mut sw, mut sq, mut sqq, mut sx, mut sqx) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for ((&xi, &wi), &qi) in x.iter().zip(w).zip(q) {
        let (xi, wi, qi) = (xi as f64, wi as f64, qi as f64);
        sw += wi;
        sq += wi * qi;
        sqq += wi * qi * qi;
        sx += wi * xi;
        sqx += wi * qi * xi;
    }
    let det = sw * sqq - sq * sq;
    if det > 0.0 {
        let s = (sw * sqx - sq * sx) / det;
        let b = (sqq * sx - sq * sqx) / det;
        if b <= 0.0 && s >= 0.0 {
            return (s as f32, -b as f32);
        }
    }
    // Offset pinned at zero (the format's min cannot be positive here).
    if sqq > 0.0 && sqx > 0.0 {
        ((sqx / sqq) as f32, 0.0)
    } else {
        (0.0, 0.0)
    }
}

fn sub_error(x: &[f32], w: &[f32], q: &[u8], s: f32, m: f32) -> f32 {
    x.iter()
        .zip(w)
        .zip(q)
        .map(|((&xi, &wi), &qi)| {
            let e = s * qi as f32 - m - xi;
            wi * e * e
        })
        .sum()
}

/// Continuous fit of one sub-block (step 1 of the module doc). Returns
/// `(s, m)`; `s·q − m` reconstructs.
fn fit_sub(x: &[f32], w: &[f32], nmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0.0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let mut q = vec![0u8; x.len()];
    // The plain min/max fit is the first candidate.
    let (mut best_s, mut best_m) = ((hi - lo) / nmax as f32, -lo);
    for (qi, &xi) in q.iter_mut().zip(x) {
        *qi = code(xi, best_s, best_m, nmax);
    }
    let mut best_e = sub_error(x, w, &q, best_s, best_m);
    // Sweep the number of steps spanned by [lo, hi]; ±1 step around nmax
    // covers clipping the extremes and leaving headroom.
    for k in -10..=10 {
        let iscale = (nmax as f32 + 0.1 * k as f32) / (hi - lo);
        if iscale <= 0.0 {
            continue;
        }
        for (qi, &xi) in q.iter_mut().zip(x) {
            *qi = ((xi - lo) * iscale).round().clamp(0.0, nmax as f32) as u8;
        }
        let (s, m) = solve_sm(x, w, &q);
        let e = sub_error(x, w, &q, s, m);
        if e < best_e {
            (best_s, best_m, best_e) = (s, m, e);
        }
    }
    // Alternate: re-assign codes for the best (s, m), re-solve.
    for _ in 0..4 {
        for (qi, &xi) in q.iter_mut().zip(x) {
            *qi = code(xi, best_s, best_m, nmax);
        }
        let (s, m) = solve_sm(x, w, &q);
        let e = sub_error(x, w, &q, s, m);
        if e < best_e {
            (best_s, best_m, best_e) = (s, m, e);
        } else {
            break;
        }
    }
    (best_s, best_m)
}

/// Codes and error of sub-block `x` decoded with integer scale `sc`, min `m`
/// against super-scales `d`, `dmin` — the decoder's arithmetic exactly.
#[allow(clippy::too_many_arguments)]
fn sub_eval(x: &[f32], w: &[f32], q: &mut [u8], d: f32, dmin: f32, sc: u8, m: u8, nmax: u8) -> f32 {
    let dl = d * sc as f32;
    let ml = dmin * m as f32;
    let mut e = 0.0f32;
    for ((qi, &xi), &wi) in q.iter_mut().zip(x).zip(w) {
        *qi = code(xi, dl, ml, nmax);
        let r = dl * *qi as f32 - ml - xi;
        e += wi * r * r;
    }
    e
}

/// Per-sub-block integer (sc, m) given f16-rounded super-scales; returns the
/// total error and fills `fit`.
fn assign_scales(
    x: &[f32],
    w: &[f32],
    shape: &Shape,
    s: &[f32],
    mins: &[f32],
    fit: &mut Fit,
) -> f32 {
    let d = f16_bits_to_f32(fit.d);
    let dmin = f16_bits_to_f32(fit.dmin);
    let smax = shape.smax as f32;
    let mut total = 0.0f32;
    let mut qtmp = vec![0u8; shape.sub];
    for j in 0..s.len() {
        let r = j * shape.sub..(j + 1) * shape.sub;
        let (xs, ws) = (&x[r.clone()], &w[r.clone()]);
        let cs = if d > 0.0 { s[j] / d } else { 0.0 };
        let cm = if dmin > 0.0 { mins[j] / dmin } else { 0.0 };
        let mut best = f32::INFINITY;
        for a in [cs.floor(), cs.ceil()] {
            for b in [cm.floor(), cm.ceil()] {
                let (a, b) = (a.clamp(0.0, smax) as u8, b.clamp(0.0, smax) as u8);
                let e = sub_eval(xs, ws, &mut qtmp, d, dmin, a, b, shape.nmax);
                if e < best {
                    best = e;
                    fit.sc[j] = a;
                    fit.m[j] = b;
                    fit.q[r.clone()].copy_from_slice(&qtmp);
                }
            }
        }
        total += best;
    }
    total
}

/// Re-evaluates codes for fixed integer scales and f16 super-scales.
fn reassign(x: &[f32], w: &[f32], shape: &Shape, fit: &mut Fit) -> f32 {
    let d = f16_bits_to_f32(fit.d);
    let dmin = f16_bits_to_f32(fit.dmin);
    let mut total = 0.0;
    for j in 0..fit.sc.len() {
        let r = j * shape.sub..(j + 1) * shape.sub;
        total += sub_eval(
            &x[r.clone()],
            &w[r.clone()],
            &mut fit.q[r],
            d,
            dmin,
            fit.sc[j],
            fit.m[j],
            shape.nmax,
        );
    }
    total
}

/// Fits one 256-value super-block. `w` holds non-negative weights.
pub(crate) fn fit_superblock(x: &[f32], w: &[f32], shape: &Shape) -> Fit {
    let nsub = 256 / shape.sub;
    let mut s = vec![0.0f32; nsub];
    let mut mins = vec![0.0f32; nsub];
    for j in 0..nsub {
        let r = j * shape.sub..(j + 1) * shape.sub;
        (s[j], mins[j]) = fit_sub(&x[r.clone()], &w[r], shape.nmax);
    }
    let smax = shape.smax as f32;
    let max_s = s.iter().fold(0.0f32, |a, &v| a.max(v));
    let max_m = mins.iter().fold(0.0f32, |a, &v| a.max(v));
    let mut fit = Fit {
        d: to_f16_up(max_s / smax),
        dmin: to_f16_up(max_m / smax),
        sc: vec![0; nsub],
        m: vec![0; nsub],
        q: [0; QK_K],
    };
    let mut best_e = assign_scales(x, w, shape, &s, &mins, &mut fit);

    // Step 3: least-squares refit of (d, dmin) for the chosen integers:
    // x ≈ d·(sc·q) − dmin·m.
    for _ in 0..3 {
        let (mut saa, mut sac, mut scc, mut sax, mut scx) = (0f64, 0f64, 0f64, 0f64, 0f64);
        for (i, (&xi, &wi)) in x.iter().zip(w).enumerate() {
            let j = i / shape.sub;
            let a = (fit.sc[j] as u32 * fit.q[i] as u32) as f64;
            let c = fit.m[j] as f64;
            let (xi, wi) = (xi as f64, wi as f64);
            saa += wi * a * a;
            sac += wi * a * c;
            scc += wi * c * c;
            sax += wi * a * xi;
            scx += wi * c * xi;
        }
        let det = saa * scc - sac * sac;
        let (d, dmin) = if det > 0.0 {
            ((sax * scc - scx * sac) / det, (sax * sac - scx * saa) / det)
        } else if saa > 0.0 {
            (sax / saa, 0.0)
        } else {
            break;
        };
        if !(d >= 0.0 && dmin >= 0.0) {
            break;
        }
        let mut cand = Fit {
            d: to_f16(d as f32).0,
            dmin: to_f16(dmin as f32).0,
            sc: fit.sc.clone(),
            m: fit.m.clone(),
            q: fit.q,
        };
        let e = reassign(x, w, shape, &mut cand);
        if e < best_e {
            best_e = e;
            fit = cand;
        } else {
            break;
        }
    }
    fit
}

/// Quantizes a row of 256-value super-blocks with `quantize_block(x, w)`,
/// each block of `B` written as its file bytes; `importance` (one weight per
/// element, e.g. an imatrix row) sets the per-element weight of the squared
/// error (see [`block_weights`]).
pub(crate) fn quantize_row<B: Pod>(
    src: &[f32],
    dst: &mut [u8],
    importance: Option<&[f32]>,
    quantize_block: impl Fn(&[f32], &[f32]) -> B,
) {
    let block_bytes = std::mem::size_of::<B>();
    assert!(src.len() % QK_K == 0 && dst.len() == src.len() / QK_K * block_bytes);
    let mut w = [0f32; QK_K];
    for (i, (x, out)) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(block_bytes))
        .enumerate()
    {
        block_weights(importance.map(|imp| &imp[i * QK_K..(i + 1) * QK_K]), &mut w);
        out.copy_from_slice(bytemuck::bytes_of(&quantize_block(x, &w)));
    }
}

/// Weights for one super-block: the importance row when given (clamped to
/// non-negative finite values), uniform otherwise. Without an importance
/// matrix every element is assumed to meet activations of equal energy, so
/// the plain squared error is the right target. A block whose importance is
/// all zero falls back to uniform so it is still encoded sensibly.
fn block_weights(importance: Option<&[f32]>, out: &mut [f32]) {
    match importance {
        Some(imp) => {
            let mut sum = 0.0f32;
            for (o, &v) in out.iter_mut().zip(imp) {
                *o = if v.is_finite() && v > 0.0 { v } else { 0.0 };
                sum += *o;
            }
            if !(sum > 0.0 && sum.is_finite()) {
                out.fill(1.0);
            }
        }
        None => out.fill(1.0),
    }
}
