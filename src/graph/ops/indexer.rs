//! The lightning indexer (MODEL.md §3.5.4): picks which compressed rows a CSA
//! query attends to when more than `top_k` are visible.

use super::CpuCx;
use crate::graph::{StateId, ValueId};

/// `score[c] = Σ_h w[h] · max(0, q_h · k_c)` over the visible indexer rows;
/// the `top_k` best rows are chosen (ties to the lower row index). When no
/// more than `top_k` rows are visible, all of them are chosen. Output: row
/// indices in increasing order, −1 padded.
#[derive(Clone, Debug)]
pub struct IndexerTopK {
    pub q: ValueId,
    pub weights: ValueId,
    pub rows: StateId,
    pub ratio: usize,
    pub top_k: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub out: ValueId,
}

impl IndexerTopK {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write_i32(self.out, |cx, out| {
            let (q, w, rows) = (cx.get(self.q), cx.get(self.weights), cx.state(self.rows));
            self.compute(q, w, rows, pos0, n, out)
        });
    }

    pub fn compute(
        &self,
        q: &[f32],
        weights: &[f32],
        rows: &[f32],
        pos0: usize,
        n_tokens: usize,
        out: &mut [i32],
    ) {
        let (k, nh, hd) = (self.top_k, self.n_head, self.head_dim);
        super::parallel::for_rows(&mut out[..n_tokens * k], k, 4096, |first, chunk| {
            let mut scores: Vec<(f32, usize)> = Vec::new();
            for (i, o) in chunk.chunks_exact_mut(k).enumerate() {
                let t = first + i;
                let n = (pos0 + t + 1) / self.ratio;
                o.fill(-1);
                if n <= k {
                    for (r, slot) in o.iter_mut().enumerate().take(n) {
                        *slot = r as i32;
                    }
                    continue;
                }
                scores.clear();
                for r in 0..n {
                    let kr = &rows[r * hd..(r + 1) * hd];
                    let mut s = 0f32;
                    for h in 0..nh {
                        let qh = &q[t * nh * hd + h * hd..t * nh * hd + (h + 1) * hd];
                        s += weights[t * nh + h] * super::dot(qh, kr).max(0.0);
                    }
                    scores.push((s, r));
                }
                // Highest score first, lower index first among equals.
                scores.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                let mut chosen: Vec<usize> = scores[..k].iter().map(|&(_, r)| r).collect();
                chosen.sort_unstable();
                for (slot, r) in o.iter_mut().zip(chosen) {
                    *slot = r as i32;
                }
            }
        });
    }
}
