//! Speculative decoding (issue 35; docs/SPECULATIVE.md): drafters propose
//! the next few tokens, the session verifies them in one step
//! ([`crate::session::Session::verify`], exact by construction), and an
//! adaptive policy picks how many to draft so that speculation never costs
//! more than it gains.
//!
//! * [`Drafter`]: proposes tokens after a context. [`lookup::PromptLookup`]
//!   needs no model; [`draft_model::ModelDrafter`] runs V4 Flash's MTP block or DSpark on the
//!   session's backend; [`synthetic`] holds the test drafters (the known
//!   continuation, wrong tokens, a set acceptance rate).
//! * [`policy::Policy`]: measured step costs by row count and a running
//!   acceptance estimate → the draft length (0 = plain decoding).
//! * [`accept`]: why keeping a draft while it equals the picked token
//!   preserves the target distribution, and the rule for drafts drawn from
//!   a distribution.
//! * [`Speculator`]: a drafter with its policy and counters, driven by the
//!   generation loop (`generate::generate_with`).

pub mod accept;
pub mod draft_model;
pub mod lookup;
pub mod policy;
pub mod synthetic;

use std::time::Duration;

use crate::session::{Session, SessionError};

pub use policy::{Choice, Policy};

/// What a drafter drafts after.
#[derive(Clone, Copy, Debug)]
pub struct DraftContext<'a> {
    /// The tokens the session holds.
    pub tokens: &'a [u32],
    /// The next token: picked, not yet evaluated (the verify step's first row).
    pub next: u32,
}

/// Proposes the tokens most likely to follow a context.
pub trait Drafter: Send {
    /// A short name (`lookup`, `mtp`, `dspark`), for reports and metrics.
    fn name(&self) -> &'static str;

    /// Up to `k` tokens to follow `cx.tokens` and `cx.next` (fewer or none
    /// when it has no guess).
    fn draft(&mut self, cx: &DraftContext<'_>, k: usize) -> Vec<u32>;

    /// [`Drafter::draft`] after the tokens `sess` holds: what the
    /// generation loop calls. A drafter that runs a model on the session's
    /// backend (MTP) overrides it.
    fn draft_in(
        &mut self,
        sess: &mut Session,
        next: u32,
        k: usize,
    ) -> Result<Vec<u32>, SessionError> {
        let cx = DraftContext {
            tokens: sess.tokens(),
            next,
        };
        Ok(self.draft(&cx, k))
    }

    /// Whether a call costs next to nothing (no model): then it is also
    /// asked on plain steps, to keep measuring its drafts.
    fn cheap(&self) -> bool {
        false
    }

    /// Whether a call costs the same however many tokens it is asked for
    /// (DSpark runs its whole block at once); otherwise its cost grows with
    /// them (MTP runs its block once per drafted token).
    fn costs_per_call(&self) -> bool {
        false
    }
}

/// Which drafter `--spec` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    Off,
    /// Prompt lookup: n-grams of the prompt and the output so far.
    Lookup,
    /// V4 Flash's MTP head (`--mtp --mtp-model FILE`).
    Mtp,
    /// DeepSeek's DSpark drafter (`--dspark --mtp-model FILE`).
    Dspark,
}

impl SpecKind {
    pub fn parse(s: &str) -> Option<SpecKind> {
        match s {
            "off" | "none" => Some(SpecKind::Off),
            "lookup" => Some(SpecKind::Lookup),
            "mtp" => Some(SpecKind::Mtp),
            "dspark" => Some(SpecKind::Dspark),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SpecKind::Off => "off",
            SpecKind::Lookup => "lookup",
            SpecKind::Mtp => "mtp",
            SpecKind::Dspark => "dspark",
        }
    }
}

/// The default longest draft: DSpark's block size, and what prompt lookup
/// gains little beyond on CPU-bound steps.
pub const DEFAULT_MAX_DRAFT: usize = 5;

/// Counters of a speculator (cumulative; a request reports the difference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens drafted and verified.
    pub drafted: u64,
    /// Drafted tokens kept.
    pub accepted: u64,
    /// Verify steps (drafts present).
    pub verify_steps: u64,
    /// Tokens those verify steps produced (kept rows).
    pub verify_tokens: u64,
    /// Plain steps (no drafts).
    pub plain_steps: u64,
}

impl SpecStats {
    /// `self − earlier`: what happened since `earlier` was read.
    pub fn since(&self, earlier: &SpecStats) -> SpecStats {
        SpecStats {
            drafted: self.drafted - earlier.drafted,
            accepted: self.accepted - earlier.accepted,
            verify_steps: self.verify_steps - earlier.verify_steps,
            verify_tokens: self.verify_tokens - earlier.verify_tokens,
            plain_steps: self.plain_steps - earlier.plain_steps,
        }
    }

    /// Kept share of the drafted tokens.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens per verify step (1 + kept drafts on average).
    pub fn tokens_per_verify(&self) -> f64 {
        if self.verify_steps == 0 {
            0.0
        } else {
            self.verify_tokens as f64 / self.verify_steps as f64
        }
    }
}

/// A drafter, its policy and its counters: what the generation loop asks
/// for drafts and tells what became of them.
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    policy: Policy,
    stats: SpecStats,
    /// A cheap drafter's first token on a plain step, compared with the
    /// token picked next.
    shadow: Option<u32>,
    choice: Choice,
}

impl Speculator {
    pub fn new(drafter: Box<dyn Drafter>, mut policy: Policy) -> Speculator {
        policy.set_cost_per_call(drafter.costs_per_call());
        Speculator {
            drafter,
            policy,
            stats: SpecStats::default(),
            shadow: None,
            choice: Choice::default(),
        }
    }

    /// The drafter's name.
    pub fn name(&self) -> &'static str {
        self.drafter.name()
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The last decision of the policy.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Drafts to verify after the tokens `sess` holds and `next`, at most
    /// `limit` (none: a plain step).
    pub fn propose(
        &mut self,
        sess: &mut Session,
        next: u32,
        limit: usize,
    ) -> Result<Vec<u32>, SessionError> {
        self.shadow = None;
        self.choice = self.policy.choose(limit);
        // A costly drafter is timed on a one-token probe before a verify
        // step counts on it (its cost can exceed what drafts save).
        let untimed = !self.drafter.cheap() && !self.policy.draft_measured();
        if untimed {
            self.choice = Choice::default();
        }
        if self.choice.k == 0 {
            // Speculation is off for this step; a drafter may still be
            // asked for one token to keep measuring it.
            if limit > 0 && (self.policy.probe(self.drafter.cheap()) || untimed) {
                let t0 = std::time::Instant::now();
                let d = self.drafter.draft_in(sess, next, 1)?;
                self.timed(t0.elapsed(), &d, 1);
                self.shadow = d.first().copied();
            }
            return Ok(Vec::new());
        }
        let t0 = std::time::Instant::now();
        let mut d = self.drafter.draft_in(sess, next, self.choice.k)?;
        self.timed(t0.elapsed(), &d, self.choice.k);
        d.truncate(self.choice.k);
        Ok(d)
    }

    /// A call asking `asked` tokens took `elapsed` and drafted `d`. A
    /// model drafter that had nothing to draft from (no target state yet)
    /// returned at once: that time says nothing of its cost.
    fn timed(&mut self, elapsed: Duration, d: &[u32], asked: usize) {
        if !d.is_empty() || self.drafter.cheap() {
            self.policy.draft_time(elapsed, asked);
        }
    }

    /// The token picked after a plain step (measures a shadow draft).
    pub fn picked(&mut self, t: u32) {
        if let Some(d) = self.shadow.take() {
            self.policy.outcome(1, (d == t) as usize);
        }
    }

    /// A plain step took `elapsed`.
    pub fn plain_step(&mut self, elapsed: Duration) {
        self.stats.plain_steps += 1;
        self.policy.step_time(1, elapsed);
    }

    /// A verify step of `drafted` drafts kept `kept_drafts` of them and
    /// took `elapsed`; `judged` drafts were compared with a pick (fewer
    /// than drafted when generation ended inside the step).
    pub fn verified(
        &mut self,
        drafted: usize,
        kept_drafts: usize,
        judged: usize,
        elapsed: Duration,
    ) {
        self.stats.verify_steps += 1;
        self.stats.drafted += drafted as u64;
        self.stats.accepted += kept_drafts as u64;
        self.stats.verify_tokens += 1 + kept_drafts as u64;
        self.policy.step_time(drafted + 1, elapsed);
        self.policy.outcome(judged, kept_drafts);
    }
}
