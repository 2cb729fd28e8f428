//! The fast twin of `ops::indexer::IndexerTopK`: the same scores (f32) and
//! a partial selection of the `top_k` best rows instead of a full sort. At
//! long contexts the indexer scores every visible compressed row for every
//! query, so it is the part of a CSA layer that grows fastest with the
//! context (docs/CPU_FAST.md, long contexts).
//!
//! Scoring is register-blocked: the query's heads are transposed once per
//! token to `head_dim × heads` (heads padded to a multiple of 16 with zero
//! weight), and 4 rows at a time accumulate all 16 heads of a chunk in
//! vector lanes (`acc[row][head] += k_row[i]·q[i][head]`), so each query
//! element loaded serves 4 rows and no horizontal sums are needed. The
//! kernel is plain Rust instantiated inside `target_feature` functions per
//! path, where LLVM turns the 16-lane loops into AVX2/AVX-512/NEON FMAs.

use super::{Isa, Kernels};
use crate::graph::ops::indexer::IndexerTopK;
use crate::graph::ops::parallel::for_rows;

/// Heads per vector chunk.
const LANES: usize = 16;
/// Rows per register block.
const ROWS: usize = 4;

/// Scores of rows `r0..r0+R`: Σ_h w[h]·max(0, q_h·k_r).
#[inline(always)]
fn block<const FMA: bool, const R: usize>(
    qt: &[f32],
    w: &[f32],
    rows: &[f32],
    hd: usize,
    r0: usize,
) -> [f32; R] {
    let nhp = w.len();
    let mut s = [0f32; R];
    let k = &rows[r0 * hd..(r0 + R) * hd];
    for hc in (0..nhp).step_by(LANES) {
        let mut acc = [[0f32; LANES]; R];
        for i in 0..hd {
            let q: &[f32; LANES] = qt[i * nhp + hc..i * nhp + hc + LANES]
                .try_into()
                .expect("16 lanes");
            for (rr, a) in acc.iter_mut().enumerate() {
                let kv = k[rr * hd + i];
                for l in 0..LANES {
                    a[l] = if FMA {
                        kv.mul_add(q[l], a[l])
                    } else {
                        a[l] + kv * q[l]
                    };
                }
            }
        }
        let wc = &w[hc..hc + LANES];
        for (sr, a) in s.iter_mut().zip(&acc) {
            let mut t = 0f32;
            for l in 0..LANES {
                t += wc[l] * a[l].max(0.0);
            }
            *sr += t;
        }
    }
    s
}

/// Scores of rows `r0..r0 + out.len()` written as (score, row).
#[inline(always)]
fn score_rows<const FMA: bool>(
    qt: &[f32],
    w: &[f32],
    rows: &[f32],
    hd: usize,
    r0: usize,
    out: &mut [(f32, usize)],
) {
    let mut blocks = out.chunks_exact_mut(ROWS);
    let mut r = r0;
    for o in &mut blocks {
        let s = block::<FMA, ROWS>(qt, w, rows, hd, r);
        for (i, (slot, v)) in o.iter_mut().zip(s).enumerate() {
            *slot = (v, r + i);
        }
        r += ROWS;
    }
    for slot in blocks.into_remainder() {
        *slot = (block::<FMA, 1>(qt, w, rows, hd, r)[0], r);
        r += 1;
    }
}

type ScoreFn = fn(&[f32], &[f32], &[f32], usize, usize, &mut [(f32, usize)]);

fn score_portable(
    qt: &[f32],
    w: &[f32],
    rows: &[f32],
    hd: usize,
    r0: usize,
    out: &mut [(f32, usize)],
) {
    score_rows::<false>(qt, w, rows, hd, r0, out)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(q: &[f32], w: &[f32], r: &[f32], hd: usize, r0: usize, o: &mut [(f32, usize)]) {
        super::score_rows::<true>(q, w, r, hd, r0, o)
    }
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn avx512(
        q: &[f32],
        w: &[f32],
        r: &[f32],
        hd: usize,
        r0: usize,
        o: &mut [(f32, usize)],
    ) {
        super::score_rows::<true>(q, w, r, hd, r0, o)
    }
    // Installed by `score_fn` only when the path's features were detected.
    pub fn avx2_safe(
        q: &[f32],
        w: &[f32],
        r: &[f32],
        hd: usize,
        r0: usize,
        o: &mut [(f32, usize)],
    ) {
        unsafe { avx2(q, w, r, hd, r0, o) }
    }
    pub fn avx512_safe(
        q: &[f32],
        w: &[f32],
        r: &[f32],
        hd: usize,
        r0: usize,
        o: &mut [(f32, usize)],
    ) {
        unsafe { avx512(q, w, r, hd, r0, o) }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    #[target_feature(enable = "neon")]
    unsafe fn neon(q: &[f32], w: &[f32], r: &[f32], hd: usize, r0: usize, o: &mut [(f32, usize)]) {
        super::score_rows::<true>(q, w, r, hd, r0, o)
    }
    // Installed by `score_fn` only when NEON was detected.
    pub fn neon_safe(
        q: &[f32],
        w: &[f32],
        r: &[f32],
        hd: usize,
        r0: usize,
        o: &mut [(f32, usize)],
    ) {
        unsafe { neon(q, w, r, hd, r0, o) }
    }
}

/// The scoring kernel of `isa` (checked again here: `Kernels::isa` is a
/// public field).
fn score_fn(isa: Isa) -> ScoreFn {
    if !isa.supported() {
        return score_portable;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_safe,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::avx512_safe,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::neon_safe,
        _ => score_portable,
    }
}

/// Rows per parallel task when one token's rows are split across threads.
const ROWS_PER_TASK: usize = 256;

#[allow(clippy::too_many_arguments)]
pub fn topk(
    kern: &Kernels,
    o: &IndexerTopK,
    q: &[f32],
    weights: &[f32],
    rows: &[f32],
    pos0: usize,
    n_tokens: usize,
    out: &mut [i32],
) {
    let (k, nh, hd) = (o.top_k, o.n_head, o.head_dim);
    let score = score_fn(kern.isa);
    let threads = rayon::current_num_threads().max(1);
    // Decode (fewer tokens than threads): split each token's rows across
    // the threads instead, so a long context's scoring uses every core.
    let split_rows = n_tokens < threads;
    let work = nh * hd * (pos0 + n_tokens) / o.ratio.max(1);
    let per_token = |t: usize, slot: &mut [i32], scores: &mut Vec<(f32, usize)>, qt: &mut [f32]| {
        let nhp = qt.len() / hd.max(1);
        let n = (pos0 + t + 1) / o.ratio;
        slot.fill(-1);
        if n <= k {
            for (r, s) in slot.iter_mut().enumerate().take(n) {
                *s = r as i32;
            }
            return;
        }
        let qtok = &q[t * nh * hd..(t + 1) * nh * hd];
        for h in 0..nh {
            for e in 0..hd {
                qt[e * nhp + h] = qtok[h * hd + e];
            }
        }
        let mut wp = vec![0f32; nhp];
        wp[..nh].copy_from_slice(&weights[t * nh..(t + 1) * nh]);
        scores.clear();
        scores.resize(n, (0.0, 0));
        let rows = &rows[..n * hd];
        if split_rows && n >= 2 * ROWS_PER_TASK {
            use rayon::prelude::*;
            scores
                .par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(b, ch)| score(qt, &wp, rows, hd, b * ROWS_PER_TASK, ch));
        } else {
            score(qt, &wp, rows, hd, 0, scores);
        }
        // Highest score first, lower index first among equals: the same
        // set a full sort would give.
        let cmp = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        scores.select_nth_unstable_by(k - 1, cmp);
        let mut chosen: Vec<usize> = scores[..k].iter().map(|&(_, r)| r).collect();
        chosen.sort_unstable();
        for (s, r) in slot.iter_mut().zip(chosen) {
            *s = r as i32;
        }
    };
    let nhp = nh.div_ceil(LANES) * LANES;
    if split_rows {
        let mut scores = Vec::new();
        let mut qt = vec![0f32; hd * nhp];
        for (t, slot) in out[..n_tokens * k].chunks_exact_mut(k).enumerate() {
            per_token(t, slot, &mut scores, &mut qt);
        }
        return;
    }
    for_rows(&mut out[..n_tokens * k], k, work.max(1), |first, chunk| {
        let mut scores = Vec::new();
        let mut qt = vec![0f32; hd * nhp];
        for (i, slot) in chunk.chunks_exact_mut(k).enumerate() {
            per_token(first + i, slot, &mut scores, &mut qt);
        }
    });
}
