//! The adaptive draft length: speculation only where it pays.
//!
//! Two things are measured, both on the steps decoding runs anyway:
//! * **the cost of a step by its row count**: `cost[r]` is a running mean of
//!   the wall time of steps of `r` rows (`r = 1`: a plain decode step), and
//!   of the drafter's own time per call. A row count not measured yet is
//!   extrapolated from those that are (the measured cost per added row, or
//!   10 % of a plain step before any); it is measured the first times the
//!   policy picks it (every such step still makes progress: a verify step
//!   keeps at least its first row). The first step at each row count is not
//!   counted (it loads a graph, warms caches). A step of more rows is never taken to
//!   cost less than one of fewer: with that floor the expected speed-up of
//!   a draft length is at most its expected tokens, so drafts that are
//!   never kept cannot look worth it through timing noise.
//! * **how far drafts are kept**: per draft position `i`, the share of the
//!   drafts at `i` that were kept when position `i` was verified (its
//!   predecessors kept), as a decaying count with a prior, so the estimate
//!   follows a change of text. A drafter that is cheap (prompt lookup) is
//!   also asked on plain steps, and its first token is compared with the
//!   token picked: drafts keep being measured while speculation is off.
//!
//! The expected tokens of a step with draft length `k` are
//! `E(k) = 1 + Σ_{i≤k} Π_{j≤i} p_j` and its time `cost[k+1] + draft(k)`;
//! (`draft(k)`: the drafter's measured time per drafted token, times `k`);
//! the policy picks the `k` (0 = plain) with the best `E/time`, and a `k > 0`
//! only when it beats plain decoding by [`MARGIN`]. So useless drafts turn
//! speculation off after a few steps, and their cost from then on is the
//! drafter's alone (none for lookup; a model drafter is asked once every
//! [`PROBE_EVERY`] steps).

use std::time::Duration;

/// A draft length is chosen over plain decoding only if its expected
/// speed is this much higher.
pub const MARGIN: f64 = 1.03;
/// A costly drafter is asked at most this often while speculation is off.
pub const PROBE_EVERY: usize = 16;
/// ... and its probes take at most this share of the plain steps' time
/// (a model drafter catches up on every position since its last call, so
/// a probe can cost several decode steps where the drafter is large beside
/// the target, as the MTP block and the DSpark stages of a 4-layer bench
/// model are). 1 %: with the first probe, useless drafts cost at most a
/// few percent of a run of a few hundred tokens, and less after.
pub const PROBE_SHARE: f64 = 0.01;
/// Each update multiplies the older acceptance counts by this.
const DECAY: f64 = 0.98;
/// Prior of the first position: mean and weight in pseudo-observations.
const PRIOR_P1: f64 = 0.4;
const PRIOR_WEIGHT: f64 = 1.0;

/// What the policy decided, for the reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Choice {
    pub k: usize,
    /// Expected tokens per step and the speed relative to plain decoding.
    pub expected: f64,
    pub gain: f64,
}

/// The adaptive draft-length policy.
#[derive(Clone, Debug)]
pub struct Policy {
    max_k: usize,
    /// Running mean of a step's seconds by row count (index = rows) and
    /// how many steps it holds.
    cost: Vec<(f64, u32)>,
    /// The drafter's seconds per drafted token (a call's time over the
    /// tokens asked: a model drafter's catch-up rows counted in), or per
    /// call when `cost_per_call`.
    draft_cost: (f64, u32),
    /// The drafter's call costs the same for any number of tokens (DSpark).
    cost_per_call: bool,
    /// Per draft position (index i − 1): decayed kept and tried counts.
    kept: Vec<f64>,
    tried: Vec<f64>,
    /// Row counts whose first (untimed) step has been seen.
    warm: Vec<bool>,
    /// Plain steps since the last probe of a costly drafter.
    since_probe: usize,
    /// A fixed draft length (`--draft N --spec-fixed`) instead of the policy.
    fixed: Option<usize>,
}

impl Policy {
    /// Draft lengths `0..=max_k`.
    pub fn new(max_k: usize) -> Policy {
        Policy {
            max_k,
            cost: vec![(0.0, 0); max_k + 2],
            draft_cost: (0.0, 0),
            cost_per_call: false,
            kept: vec![0.0; max_k],
            tried: vec![0.0; max_k],
            warm: vec![false; max_k + 2],
            since_probe: 0,
            fixed: None,
        }
    }

    /// Always draft `k` tokens (benchmarks, tests): no adaptation.
    pub fn fixed(max_k: usize, k: usize) -> Policy {
        Policy {
            fixed: Some(k.min(max_k)),
            ..Policy::new(max_k)
        }
    }

    /// The drafter's calls cost the same for any number of tokens: its
    /// measured cost is per call, not per drafted token.
    pub fn set_cost_per_call(&mut self, per_call: bool) {
        self.cost_per_call = per_call;
    }

    pub fn max_k(&self) -> usize {
        self.max_k
    }

    /// The probability that draft position `i` (1-based) is kept when its
    /// predecessors were: the decayed share with a prior whose mean is the
    /// previous position's estimate.
    pub fn p(&self, i: usize) -> f64 {
        let mut prior = PRIOR_P1;
        let mut p = prior;
        for j in 0..i.min(self.max_k) {
            p = (self.kept[j] + PRIOR_WEIGHT * prior) / (self.tried[j] + PRIOR_WEIGHT);
            prior = p;
        }
        p
    }

    /// Expected tokens of a step drafting `k`.
    pub fn expected(&self, k: usize) -> f64 {
        let (mut e, mut run) = (1.0, 1.0);
        for i in 1..=k {
            run *= self.p(i);
            e += run;
        }
        e
    }

    /// A step's seconds at `rows`: measured or, before that, extrapolated
    /// from the nearest measured count (a row costs as much as the measured
    /// rows' average increment, or 10 % of a plain step), and never less
    /// than a step of fewer rows.
    fn step_cost(&self, rows: usize) -> Option<f64> {
        let c = |r: usize| self.cost.get(r).filter(|c| c.1 > 0).map(|c| c.0);
        let base = c(1)?;
        let mut floor = base;
        let mut last = (1, base);
        for r in 2..=rows {
            if let Some(v) = c(r) {
                floor = floor.max(v);
                last = (r, floor);
            }
        }
        if last.0 == rows {
            return Some(floor);
        }
        let slope = if last.0 > 1 {
            ((last.1 - base) / (last.0 - 1) as f64).max(0.0)
        } else {
            0.1 * base
        };
        Some(last.1 + slope * (rows - last.0) as f64)
    }

    /// The draft length for the next step, at most `limit`.
    pub fn choose(&self, limit: usize) -> Choice {
        let limit = limit.min(self.max_k);
        if let Some(k) = self.fixed {
            let k = k.min(limit);
            return Choice {
                k,
                expected: self.expected(k),
                gain: 0.0,
            };
        }
        let Some(plain) = self.step_cost(1) else {
            return Choice::default();
        };
        let measured = if self.draft_cost.1 > 0 {
            self.draft_cost.0
        } else {
            0.0
        };
        let drafting = |k: usize| {
            if self.cost_per_call {
                measured
            } else {
                measured * k as f64
            }
        };
        let mut best = Choice {
            k: 0,
            expected: 1.0,
            gain: 1.0,
        };
        for k in 1..=limit {
            let Some(t) = self.step_cost(k + 1) else {
                break;
            };
            let e = self.expected(k);
            let gain = e / (t + drafting(k)) * plain;
            if gain > best.gain.max(MARGIN) || (best.k > 0 && gain > best.gain) {
                best = Choice {
                    k,
                    expected: e,
                    gain,
                };
            }
        }
        best
    }

    /// Whether to ask a drafter on a step where the choice is plain: a
    /// cheap one always (its first token is still measured), a costly one
    /// once every [`PROBE_EVERY`] plain steps, or less often when its
    /// measured calls would take more than [`PROBE_SHARE`] of the time.
    pub fn probe(&mut self, cheap: bool) -> bool {
        self.since_probe += 1;
        let every = match (self.step_cost(1), self.draft_cost) {
            (Some(plain), (d, n)) if n > 0 && plain > 0.0 => {
                PROBE_EVERY.max((d / (PROBE_SHARE * plain)).ceil().min(1e6) as usize)
            }
            _ => PROBE_EVERY,
        };
        if cheap || self.since_probe >= every {
            self.since_probe = 0;
            return true;
        }
        false
    }

    /// A step of `rows` rows took `elapsed` (plain steps: rows = 1).
    pub fn step_time(&mut self, rows: usize, elapsed: Duration) {
        let Some(w) = self.warm.get_mut(rows) else {
            return;
        };
        if !std::mem::replace(w, true) {
            return; // the first step at a row count: graph load, cold caches
        }
        let c = &mut self.cost[rows];
        // A mean of the first 8, then a running mean that follows changes
        // (a longer context makes every step slower).
        let n = (c.1 + 1).min(8) as f64;
        c.0 += (elapsed.as_secs_f64() - c.0) / n;
        c.1 += 1;
    }

    /// The drafter took `elapsed` for one call asking `tokens` tokens.
    pub fn draft_time(&mut self, elapsed: Duration, tokens: usize) {
        let per = if self.cost_per_call { 1 } else { tokens.max(1) };
        let c = &mut self.draft_cost;
        let n = (c.1 + 1).min(8) as f64;
        c.0 += (elapsed.as_secs_f64() / per as f64 - c.0) / n;
        c.1 += 1;
    }

    /// Whether the drafter's cost has been measured.
    pub fn draft_measured(&self) -> bool {
        self.draft_cost.1 > 0
    }

    /// Of `proposed` drafts verified in order, the first `kept` were kept
    /// (the next one, if any, was not).
    pub fn outcome(&mut self, proposed: usize, kept: usize) {
        for i in 0..self.max_k {
            self.kept[i] *= DECAY;
            self.tried[i] *= DECAY;
        }
        for i in 0..proposed.min(self.max_k) {
            self.tried[i] += 1.0;
            if i < kept {
                self.kept[i] += 1.0;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    /// A policy whose row counts cost `plain · (1 + slope·(r − 1))`.
    fn calibrated(max_k: usize, plain: f64, slope: f64) -> Policy {
        let mut p = Policy::new(max_k);
        for r in 1..=max_k + 1 {
            p.step_time(r, ms(1000.0)); // the first of each: not counted
            p.step_time(r, ms(plain * (1.0 + slope * (r - 1) as f64)));
        }
        p
    }

    #[test]
    fn plain_first_then_the_best_extrapolated_length() {
        let mut p = Policy::new(5);
        let mut seen = Vec::new();
        for _ in 0..6 {
            let c = p.choose(5);
            seen.push(c.k);
            p.step_time(c.k + 1, ms(10.0));
        }
        // Plain steps until one is timed; then, with the prior (p = 0.4)
        // and 10 % per row, k = 2 is best; once its rows are measured as
        // free, longer drafts win.
        assert_eq!(seen, vec![0, 0, 2, 2, 5, 5], "{seen:?}");
    }

    #[test]
    fn a_slow_first_step_is_not_counted() {
        let mut p = Policy::new(2);
        for (r, t) in [
            (1, 50.0),
            (1, 10.0),
            (2, 80.0),
            (2, 11.0),
            (3, 90.0),
            (3, 12.0),
        ] {
            p.step_time(r, ms(t));
        }
        for _ in 0..6 {
            p.outcome(2, 0);
        }
        assert_eq!(p.choose(2).k, 0);
    }

    #[test]
    fn more_rows_never_look_cheaper() {
        let mut p = Policy::new(2);
        for (r, t) in [
            (1, 0.0),
            (1, 40.0),
            (2, 0.0),
            (2, 11.0),
            (3, 0.0),
            (3, 12.0),
        ] {
            p.step_time(r, ms(t));
        }
        // Rows measured cheaper than a plain step count as a plain step:
        // the gain of a length is then at most its expected tokens.
        for _ in 0..40 {
            p.outcome(2, 0);
        }
        assert!(p.expected(2) < MARGIN, "{}", p.expected(2));
        assert_eq!(p.choose(2).k, 0);
    }

    /// A costly drafter is probed every 16 plain steps, or less often
    /// when its calls would take more than 1 % of the time: a call of 3
    /// decode steps is asked once every 300.
    #[test]
    fn probes_of_a_costly_drafter_stay_within_their_share() {
        let count = |p: &mut Policy| (0..1200).filter(|_| p.probe(false)).count();
        let mut p = calibrated(5, 10.0, 0.05);
        assert_eq!(count(&mut p), 1200 / PROBE_EVERY);
        p.draft_time(ms(30.0), 1);
        assert_eq!(count(&mut p), 1200 / 300);
        assert_eq!((0..10).filter(|_| p.probe(true)).count(), 10);
    }

    /// A drafter whose call costs the same for any length (DSpark's
    /// block): a probe asking one token measures the whole call, and a
    /// longer draft is not charged that many times over.
    #[test]
    fn a_per_call_drafter_is_charged_once_per_step() {
        let good = |per_call| {
            let mut p = calibrated(5, 10.0, 0.05);
            p.set_cost_per_call(per_call);
            p.draft_time(ms(8.0), 1);
            for _ in 0..50 {
                p.outcome(5, 5);
            }
            p.choose(5)
        };
        let (per_token, per_call) = (good(false), good(true));
        assert_eq!(per_call.k, 5, "{per_call:?}");
        assert!(
            per_call.gain > 2.0 * per_token.gain,
            "{per_call:?} {per_token:?}"
        );
    }

    #[test]
    fn useless_drafts_turn_speculation_off() {
        let mut p = calibrated(5, 10.0, 0.05);
        for _ in 0..6 {
            p.outcome(5, 0);
        }
        assert_eq!(p.choose(5).k, 0);
    }

    #[test]
    fn good_drafts_draft_long_and_costly_rows_short() {
        let mut p = calibrated(5, 10.0, 0.02);
        for _ in 0..50 {
            p.outcome(5, 5);
        }
        assert_eq!(p.choose(5).k, 5);
        assert!(p.choose(2).k == 2, "the limit caps the length");
        // Rows that cost as much as a whole step each never pay.
        let mut q = calibrated(5, 10.0, 1.0);
        for _ in 0..50 {
            q.outcome(5, 5);
        }
        assert_eq!(q.choose(5).k, 0);
    }

    #[test]
    fn expected_tokens_follow_the_acceptance() {
        let mut p = Policy::new(4);
        for _ in 0..400 {
            p.outcome(4, 2); // positions 1, 2 kept; 3 rejected
        }
        // The prior weighs one observation against ~50 decayed ones.
        assert!((p.p(1) - 1.0).abs() < 0.015, "{}", p.p(1));
        assert!(p.p(3) < 0.02, "{}", p.p(3));
        assert!((p.expected(4) - 3.0).abs() < 0.05, "{}", p.expected(4));
    }

    #[test]
    fn costly_drafters_are_probed_rarely() {
        let mut p = Policy::new(3);
        let asked = (0..64).filter(|_| p.probe(false)).count();
        assert_eq!(asked, 64 / PROBE_EVERY);
        assert!((0..5).all(|_| p.probe(true)));
    }
}
