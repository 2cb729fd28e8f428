//! Which drafts a verify step keeps, so that the output is distributed as
//! the target's exactly.
//!
//! **Drafts that are single tokens** (prompt lookup, a model drafter's
//! argmax): the generation loop picks each token from the verified row's
//! logits with the session's own picker, exactly as plain decoding would,
//! and keeps the draft while it equals the pick. That is speculative
//! sampling with a point-mass proposal `q = δ_d`: the draft is kept with
//! probability `min(1, p(d)/q(d)) = p(d)`, and on rejection the token comes
//! from `norm(max(0, p − q))`, which is `p` without `d` — the pick given
//! that it is not `d`. It is more than equal in distribution: the picker
//! sees the same logits in the same order, so the tokens are the plain
//! run's, seed for seed, at any temperature and under any grammar.
//!
//! **Drafts drawn from a distribution** `q` (a drafter that samples):
//! [`accept_or_resample`], the rejection rule of Leviathan et al. (2023)
//! and Chen et al. (2023): keep `d` with probability `min(1, p(d)/q(d))`,
//! else draw from `norm(max(0, p − q))`. Tested by a chi-square test over
//! seeded draws on a small vocabulary (below).

use crate::sampler::Rng;

/// Whether the draft was kept, or the token drawn in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    Kept,
    Replaced(usize),
}

/// Speculative sampling of one position: `p` the target's distribution,
/// `q` the drafter's (both sum to 1 over the same tokens), `d` the draft
/// drawn from `q`. The returned token (`d` when kept) is distributed as `p`.
pub fn accept_or_resample(p: &[f32], q: &[f32], d: usize, rng: &mut Rng) -> Accept {
    let (pd, qd) = (p[d] as f64, q[d] as f64);
    // u < p(d)/q(d) without the division (q(d) > 0: d was drawn from q).
    if qd > 0.0 && (rng.uniform() as f64) * qd < pd {
        return Accept::Kept;
    }
    let residual: Vec<f64> = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| (a as f64 - b as f64).max(0.0))
        .collect();
    let total: f64 = residual.iter().sum();
    if total <= 0.0 {
        // p == q: a rejection has probability 0; keep the draft.
        return Accept::Kept;
    }
    let mut r = rng.uniform() as f64 * total;
    let mut last = d;
    for (i, &w) in residual.iter().enumerate() {
        if w <= 0.0 {
            continue;
        }
        last = i;
        r -= w;
        if r < 0.0 {
            return Accept::Replaced(i);
        }
    }
    Accept::Replaced(last)
}

/// The softmax of `logits` at `temperature` (f64 sums), for tests and
/// drafters that sample.
pub fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let t = temperature.max(1e-6) as f64;
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|&x| (x / s) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws `n` tokens: a draft from `q`, then the rule; returns counts.
    fn tally(p: &[f32], q: &[f32], n: usize, seed: u64) -> Vec<usize> {
        let mut rng = Rng::new(seed);
        let mut counts = vec![0usize; p.len()];
        for _ in 0..n {
            let mut r = rng.uniform();
            let mut d = q.len() - 1;
            for (i, &w) in q.iter().enumerate() {
                if r < w {
                    d = i;
                    break;
                }
                r -= w;
            }
            let t = match accept_or_resample(p, q, d, &mut rng) {
                Accept::Kept => d,
                Accept::Replaced(t) => t,
            };
            counts[t] += 1;
        }
        counts
    }

    /// Pearson's statistic of `counts` against `p` (cells with p > 0).
    fn chi_square(counts: &[usize], p: &[f32]) -> (f64, usize) {
        let n: usize = counts.iter().sum();
        let mut x = 0.0;
        let mut cells = 0;
        for (&c, &pi) in counts.iter().zip(p) {
            if pi > 0.0 {
                let e = n as f64 * pi as f64;
                x += (c as f64 - e).powi(2) / e;
                cells += 1;
            } else {
                assert_eq!(c, 0, "a token p gives 0 was emitted");
            }
        }
        (x, cells - 1)
    }

    // 99.9 % quantiles of chi-square with 7 and 5 degrees of freedom.
    const CHI2_999_DF7: f64 = 24.32;
    const CHI2_999_DF5: f64 = 20.52;

    /// An 8-token slice of a model's logits at temperature 0.8, drafted
    /// from a flatter and from a sharper, shifted distribution: the kept or
    /// redrawn tokens follow p.
    #[test]
    fn rejection_sampling_preserves_the_target() {
        let logits = [2.1f32, 1.7, 0.3, -0.4, 1.1, -1.5, 0.9, 0.0];
        let p = softmax(&logits, 0.8);
        let flat = softmax(&logits, 3.0);
        let shifted = softmax(&[0.0, 0.5, 2.5, 1.0, -1.0, 0.2, 0.0, 1.5], 0.7);
        for (name, q) in [("flat", &flat), ("shifted", &shifted), ("p itself", &p)] {
            let counts = tally(&p, q, 200_000, 0x5eed ^ name.len() as u64);
            let (x, df) = chi_square(&counts, &p);
            assert_eq!(df, 7);
            assert!(
                x < CHI2_999_DF7,
                "q = {name}: chi-square {x:.2} over {df} df"
            );
        }
    }

    /// A point-mass proposal (greedy drafts): keep with p(d), else p
    /// without d — the rule the generation loop applies by comparing picks.
    #[test]
    fn point_mass_drafts_preserve_the_target() {
        let p = softmax(&[0.5f32, 1.5, -0.2, 0.8, 0.1, 1.2], 1.0);
        for d in [1usize, 4] {
            let mut q = vec![0f32; p.len()];
            q[d] = 1.0;
            let counts = tally(&p, &q, 100_000, 77 + d as u64);
            let (x, df) = chi_square(&counts, &p);
            assert_eq!(df, 5);
            assert!(x < CHI2_999_DF5, "draft {d}: chi-square {x:.2}");
        }
    }

    /// The statistic does reject a wrong rule: always keeping the draft
    /// gives q, not p.
    #[test]
    fn the_test_detects_a_biased_rule() {
        let p = softmax(&[2.1f32, 1.7, 0.3, -0.4, 1.1, -1.5, 0.9, 0.0], 0.8);
        let q = softmax(&[2.1f32, 1.7, 0.3, -0.4, 1.1, -1.5, 0.9, 0.0], 3.0);
        let mut rng = Rng::new(3);
        let mut counts = vec![0usize; 8];
        for _ in 0..200_000 {
            let mut r = rng.uniform();
            let mut d = 7;
            for (i, &w) in q.iter().enumerate() {
                if r < w {
                    d = i;
                    break;
                }
                r -= w;
            }
            counts[d] += 1;
        }
        assert!(chi_square(&counts, &p).0 > 1000.0);
    }
}
