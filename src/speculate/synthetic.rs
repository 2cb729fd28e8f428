//! Test drafters over a known continuation (the tokens plain decoding
//! produced): [`Synthetic`] proposes each next token right with a set
//! probability and wrong otherwise — probability 1 is the known greedy
//! continuation (every draft kept), 0 only wrong tokens (every draft
//! rejected), values between give a chosen acceptance length. The tests
//! and `ds4-bench --spec-synthetic` use them.

use super::{DraftContext, Drafter};
use crate::sampler::Rng;

/// Proposes the known continuation, each token right with probability `p`.
pub struct Synthetic {
    /// Every token of the reference run (prompt and generated).
    reference: Vec<u32>,
    p: f64,
    vocab: u32,
    rng: Rng,
}

impl Synthetic {
    /// `reference` is the whole token sequence of a plain run; drafts
    /// after a context that is not a prefix of it are none.
    pub fn new(reference: Vec<u32>, p: f64, vocab: usize, seed: u64) -> Synthetic {
        Synthetic {
            reference,
            p,
            vocab: vocab as u32,
            rng: Rng::new(seed),
        }
    }

    /// The known continuation: every draft kept.
    pub fn right(reference: Vec<u32>, vocab: usize) -> Synthetic {
        Synthetic::new(reference, 1.0, vocab, 1)
    }

    /// Wrong tokens only: every draft rejected.
    pub fn wrong(reference: Vec<u32>, vocab: usize) -> Synthetic {
        Synthetic::new(reference, 0.0, vocab, 1)
    }

    /// The per-token probability that gives `len` tokens per verify step
    /// on average with drafts of `k`: solves `(1 − p^{k+1})/(1 − p) = len`.
    pub fn p_for_length(len: f64, k: usize) -> f64 {
        let e = |p: f64| (0..=k).map(|i| p.powi(i as i32)).sum::<f64>();
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if e(mid) < len {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo + hi) / 2.0
    }
}

impl Drafter for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn draft(&mut self, cx: &DraftContext<'_>, k: usize) -> Vec<u32> {
        let at = cx.tokens.len() + 1;
        let known = self.reference.len() >= at
            && self.reference[..cx.tokens.len()] == *cx.tokens
            && self.reference[cx.tokens.len()] == cx.next;
        if !known {
            return Vec::new();
        }
        let end = self.reference.len().min(at + k);
        self.reference[at..end]
            .iter()
            .map(|&t| {
                if (self.rng.uniform() as f64) < self.p {
                    t
                } else {
                    (t + 1) % self.vocab
                }
            })
            .collect()
    }

    fn cheap(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_for_length_solves_the_mean() {
        let p = Synthetic::p_for_length(2.8, 5);
        let e: f64 = (0..=5).map(|i| p.powi(i)).sum();
        assert!((e - 2.8).abs() < 1e-9, "{p} {e}");
        assert!(Synthetic::p_for_length(1.0, 5) < 1e-9);
    }

    /// Over many steps the kept drafts give the asked mean length.
    #[test]
    fn the_mean_length_is_the_asked_one() {
        let reference: Vec<u32> = (0..20_000).collect();
        let p = Synthetic::p_for_length(3.5, 5);
        let mut d = Synthetic::new(reference.clone(), p, 100_000, 3);
        let (mut total, mut steps, mut at) = (0usize, 0usize, 1usize);
        while at + 6 < reference.len() {
            let cx = DraftContext {
                tokens: &reference[..at - 1],
                next: reference[at - 1],
            };
            let drafts = d.draft(&cx, 5);
            let kept = drafts
                .iter()
                .zip(&reference[at..])
                .take_while(|(a, b)| a == b)
                .count();
            total += 1 + kept;
            steps += 1;
            at += 1 + kept;
        }
        let mean = total as f64 / steps as f64;
        assert!((mean - 3.5).abs() < 0.1, "{mean}");
    }

    #[test]
    fn drafts_follow_the_reference() {
        let r = vec![5, 6, 7, 8, 9];
        let mut right = Synthetic::right(r.clone(), 100);
        let cx = DraftContext {
            tokens: &[5, 6],
            next: 7,
        };
        assert_eq!(right.draft(&cx, 4), vec![8, 9]);
        let mut wrong = Synthetic::wrong(r, 100);
        assert_eq!(wrong.draft(&cx, 1), vec![9]);
        let off = DraftContext {
            tokens: &[5, 6],
            next: 1,
        };
        assert!(wrong.draft(&off, 2).is_empty());
    }
}
