//! The fast twin of `ops::indexer::IndexerTopK`: the same scores (f32, the
//! head dots through the path's f32 kernel) and a partial selection of the
//! `top_k` best rows instead of a full sort. At long contexts the indexer
//! scores every visible compressed row for every query, so it is the part
//! of a CSA layer that grows fastest with the context.

use super::Kernels;
use crate::ops::indexer::IndexerTopK;
use crate::ops::parallel::for_rows;

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
    let work = nh * hd * (pos0 + n_tokens) / o.ratio.max(1);
    for_rows(&mut out[..n_tokens * k], k, work.max(1), |first, chunk| {
        let mut scores: Vec<(f32, usize)> = Vec::new();
        for (i, slot) in chunk.chunks_exact_mut(k).enumerate() {
            let t = first + i;
            let n = (pos0 + t + 1) / o.ratio;
            slot.fill(-1);
            if n <= k {
                for (r, s) in slot.iter_mut().enumerate().take(n) {
                    *s = r as i32;
                }
                continue;
            }
            let qt = &q[t * nh * hd..(t + 1) * nh * hd];
            let wt = &weights[t * nh..(t + 1) * nh];
            scores.clear();
            for r in 0..n {
                let kr: &[u8] = bytemuck::cast_slice(&rows[r * hd..(r + 1) * hd]);
                let mut s = 0f32;
                for (h, &w) in wt.iter().enumerate() {
                    s += w * kern.dot_f32(kr, &qt[h * hd..(h + 1) * hd]).max(0.0);
                }
                scores.push((s, r));
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
        }
    });
}
