//! DeepSeek V4.1's two-level top-k (docs/V41.md): candidate blocks at a
//! candidate source, then the best rows among them at the layers above.

use super::CpuCx;
use crate::graph::{StateId, ValueId};

/// `score[t][r] = Σ_h w[t][h] · max(0, q[t][h] · k[r])`, exactly as
/// [`super::indexer::IndexerTopK`] sums it (so the two agree bit for bit).
fn index_score(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    t: usize,
    r: usize,
    nh: usize,
    hd: usize,
) -> f32 {
    let kr = &keys[r * hd..(r + 1) * hd];
    let mut s = 0f32;
    for h in 0..nh {
        let qh = &q[t * nh * hd + h * hd..t * nh * hd + (h + 1) * hd];
        s += w[t * nh + h] * super::dot(qh, kr).max(0.0);
    }
    s
}

/// Level one of the two-level top-k (official `select_candidate_blocks`):
/// over the `v = (p+1)/ratio` visible rows in blocks of `block_size`, the
/// block holding the newest row is always kept and the best `topk_blocks − 1`
/// others by their best row's score join it (ties: lower block). Output:
/// block ids ascending, −1 padded, `[T, topk_blocks]`.
#[derive(Clone, Debug)]
pub struct CandidateBlocks {
    pub q: ValueId,
    pub weights: ValueId,
    pub rows: StateId,
    pub ratio: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub topk_blocks: usize,
    pub block_size: usize,
    pub out: ValueId,
}

impl CandidateBlocks {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write_i32(self.out, |cx, out| {
            self.compute(
                cx.get(self.q),
                cx.get(self.weights),
                cx.state(self.rows),
                pos0,
                n,
                out,
            )
        });
    }

    pub fn compute(
        &self,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        pos0: usize,
        n_tokens: usize,
        out: &mut [i32],
    ) {
        let (kb, bs) = (self.topk_blocks, self.block_size);
        for t in 0..n_tokens {
            let o = &mut out[t * kb..(t + 1) * kb];
            o.fill(-1);
            let v = (pos0 + t + 1) / self.ratio;
            if v == 0 || kb == 0 {
                continue;
            }
            let nb = v.div_ceil(bs);
            let last = (v - 1) / bs;
            let mut best: Vec<(f32, usize)> = (0..nb)
                .filter(|&b| b != last)
                .map(|b| {
                    let m = (b * bs..((b + 1) * bs).min(v))
                        .map(|r| index_score(q, w, keys, t, r, self.n_head, self.head_dim))
                        .fold(f32::NEG_INFINITY, f32::max);
                    (m, b)
                })
                .collect();
            best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut chosen: Vec<usize> = std::iter::once(last)
                .chain(best.iter().map(|&(_, b)| b))
                .take(kb)
                .collect();
            chosen.sort_unstable();
            for (slot, b) in o.iter_mut().zip(chosen) {
                *slot = b as i32;
            }
        }
    }
}

/// Level two (official `Indexer` at index sources above the candidate
/// source): the `top_k` best rows among the visible rows of the candidate
/// blocks only (ties: lower row), all of them when no more than `top_k`.
/// Output as [`super::indexer::IndexerTopK`]'s: rows ascending, −1 padded.
#[derive(Clone, Debug)]
pub struct CandidateTopK {
    pub q: ValueId,
    pub weights: ValueId,
    pub rows: StateId,
    /// `CandidateBlocks`'s output.
    pub blocks: ValueId,
    pub ratio: usize,
    pub top_k: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub topk_blocks: usize,
    pub block_size: usize,
    pub out: ValueId,
}

impl CandidateTopK {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write_i32(self.out, |cx, out| {
            self.compute(
                cx.get(self.q),
                cx.get(self.weights),
                cx.state(self.rows),
                cx.get_i32(self.blocks),
                pos0,
                n,
                out,
            )
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        blocks: &[i32],
        pos0: usize,
        n_tokens: usize,
        out: &mut [i32],
    ) {
        let (k, kb, bs) = (self.top_k, self.topk_blocks, self.block_size);
        let mut cand: Vec<(f32, usize)> = Vec::new();
        for t in 0..n_tokens {
            let o = &mut out[t * k..(t + 1) * k];
            o.fill(-1);
            let v = (pos0 + t + 1) / self.ratio;
            cand.clear();
            for &b in &blocks[t * kb..(t + 1) * kb] {
                if b < 0 {
                    continue;
                }
                let b = b as usize;
                for r in b * bs..((b + 1) * bs).min(v) {
                    cand.push((0.0, r));
                }
            }
            if cand.len() > k {
                for c in cand.iter_mut() {
                    c.0 = index_score(q, w, keys, t, c.1, self.n_head, self.head_dim);
                }
                cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                cand.truncate(k);
            }
            let mut chosen: Vec<usize> = cand.iter().map(|&(_, r)| r).collect();
            chosen.sort_unstable();
            for (slot, r) in o.iter_mut().zip(chosen) {
                *slot = r as i32;
            }
        }
    }
}
