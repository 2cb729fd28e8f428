//! The draft model a session runs beside the target (issue 35): V4 Flash's
//! MTP block (`mtp.rs`) or DeepSeek's DSpark (`dspark.rs`). Both draft from
//! values of the target's forward that the session keeps, on the session's
//! own backend, and give back what a rejected verify row left.

use std::collections::VecDeque;

use super::{Session, SessionError};
use crate::backend::{Backend, GraphHandle};
use crate::graph::{Graph, StateId, StateLayout, ValueName};
use crate::model::config::CoreConfig;

/// Which draft model a session opens with (`--mtp`, `--dspark`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftModel {
    #[default]
    None,
    /// The MTP block of the attached MTP file.
    Mtp,
    /// The attached DSpark drafter.
    Dspark,
}

/// Adds `n` window rings for the draft model's layers (`n_layer …`) after
/// every layer's state, so snapshots, which walk the layers, never see
/// them; `f16`: stored as f16 values (V4's model numerics).
pub(super) fn add_draft_rings(
    layout: &mut StateLayout,
    cfg: &CoreConfig,
    n: usize,
    f16: bool,
) -> Vec<StateId> {
    (0..n)
        .map(|k| {
            let ring = layout.add(
                "kv_ring",
                Some(cfg.n_layer + k),
                cfg.sliding_window,
                cfg.head_dim,
                0.0,
            );
            if f16 {
                layout.mark_f16_values(ring);
            }
            ring
        })
        .collect()
}

/// The refusal of a drafter whose file is not attached.
pub(super) fn no_drafter_file(flag: &str) -> SessionError {
    SessionError::Speculation(format!("{flag} needs the drafter's file: --mtp-model FILE"))
}

/// A finished target step: graph `g` over positions `pos0 .. pos0 + n`.
pub(crate) struct TargetStep<'a> {
    pub backend: &'a dyn Backend,
    pub g: GraphHandle,
    pub graph: &'a Graph,
    pub pos0: usize,
    pub n: usize,
}

impl TargetStep<'_> {
    /// The step's last `kept` rows of value `name`, read to the host.
    pub fn read_last(&self, name: &ValueName, kept: usize) -> Result<Vec<f32>, SessionError> {
        let v = self
            .graph
            .find(name)
            .ok_or_else(|| SessionError::UnknownValue(name.to_string()))?;
        Ok(self
            .backend
            .read_value_rows(self.g, v, self.n - kept..self.n)?)
    }
}

/// What a draft is asked for: up to `k` tokens after the session's `tokens`
/// and `next` (picked, not yet evaluated).
pub(crate) struct DraftAsk<'a> {
    pub tokens: &'a [u32],
    pub next: u32,
    pub k: usize,
}

/// A draft model's runner: its graphs and its state. What it keeps of the
/// target's steps is the [`Drafter`]'s.
pub(crate) trait DraftRunner: Send {
    /// The target values every target graph keeps readable for it.
    fn targets(&self) -> Vec<ValueName>;

    /// The rows it keeps of a target step's last `kept` positions.
    fn rows(&self, step: &TargetStep<'_>, kept: usize) -> Result<Vec<Vec<f32>>, SessionError>;

    /// Up to `ask.k` tokens after `ask.tokens` and `ask.next`, drafted from
    /// `hist`; called only with `k > 0` and `hist` [`TargetRows::ready`]
    /// for `tokens`.
    fn draft(
        &mut self,
        backend: &mut dyn Backend,
        hist: &mut TargetRows,
        ask: DraftAsk<'_>,
    ) -> Result<Vec<u32>, SessionError>;

    /// The logits the last draft's first token was picked from.
    fn first_logits(&self, backend: &dyn Backend) -> Result<Vec<f32>, SessionError>;
}

/// A session's draft model: its runner, and the rows it drafts from.
pub(crate) struct Drafter {
    runner: Box<dyn DraftRunner>,
    hist: TargetRows,
}

impl Drafter {
    /// `runner`, drafting from the target's last `window` positions.
    pub fn new(runner: Box<dyn DraftRunner>, window: usize) -> Drafter {
        Drafter {
            runner,
            hist: TargetRows::new(window),
        }
    }

    /// The target values every target graph keeps readable for it.
    pub fn targets(&self) -> Vec<ValueName> {
        self.runner.targets()
    }

    /// After a target step: only the rows the draft model can still use
    /// cross to the host (a window of a 2,048-row prefill chunk, not the
    /// chunk).
    pub fn record(&mut self, step: &TargetStep<'_>) -> Result<(), SessionError> {
        let kept = self.hist.kept(step.n);
        let rows = self.runner.rows(step, kept)?;
        self.hist.push(step.pos0, step.n, rows);
        Ok(())
    }

    /// The session now holds `len` tokens (a verify step took rows back).
    pub fn truncate(&mut self, len: usize) {
        self.hist.truncate(len);
    }

    /// An empty sequence.
    pub fn clear(&mut self) {
        self.hist.clear();
    }
}

impl Session {
    /// Whether this session runs a draft model
    /// ([`crate::session::SessionOptions::drafter`]).
    pub fn has_draft_model(&self) -> bool {
        self.drafter.is_some()
    }

    /// Up to `k` tokens the draft model proposes after the session's tokens
    /// and `next` (picked, not yet evaluated); none when it has nothing to
    /// draft from yet (after a snapshot was loaded, until a step runs).
    pub fn model_draft(&mut self, next: u32, k: usize) -> Result<Vec<u32>, SessionError> {
        let Some(m) = self.drafter.as_mut() else {
            return Err(SessionError::Speculation(
                "this session was opened without a draft model (--mtp, --dspark)".into(),
            ));
        };
        if k == 0 || !m.hist.ready(self.tokens.len()) {
            return Ok(Vec::new());
        }
        let ask = DraftAsk {
            tokens: &self.tokens,
            next,
            k,
        };
        let r = m.runner.draft(self.backend.as_mut(), &mut m.hist, ask);
        if r.is_err() {
            // The draft model's rings are undefined after a failed step.
            m.clear();
        }
        r
    }

    /// The draft model's logits for the token after `next` (what its first
    /// draft is the argmax of): for validation against a reference.
    pub fn draft_logits(&mut self, next: u32) -> Result<Vec<f32>, SessionError> {
        if self.model_draft(next, 1)?.is_empty() {
            return Err(SessionError::Speculation(
                "the draft model has no target state to draft from yet".into(),
            ));
        }
        let m = self.drafter.as_ref().expect("drafted above");
        m.runner.first_logits(self.backend.as_ref())
    }
}

/// What a draft model keeps of the target's steps: one row per position of
/// the last `window` (the values it drafts from), and how far its own rings
/// are caught up. A verify step's rejected rows are taken back; a step that
/// does not continue the kept positions (a snapshot was loaded) starts over.
pub(crate) struct TargetRows {
    window: usize,
    /// Rows of positions `end - rows.len() .. end`.
    rows: VecDeque<Vec<f32>>,
    end: usize,
    /// The draft model's ring rows of positions below this are written.
    pub done: usize,
}

impl TargetRows {
    pub fn new(window: usize) -> TargetRows {
        TargetRows {
            window: window.max(1),
            rows: VecDeque::new(),
            end: 0,
            done: 0,
        }
    }

    /// How many of an `n`-row step's last rows are worth keeping.
    pub fn kept(&self, n: usize) -> usize {
        n.min(self.window)
    }

    /// Keeps `rows`, the last rows of a step over `pos0 .. pos0 + n`.
    pub fn push(&mut self, pos0: usize, n: usize, rows: impl IntoIterator<Item = Vec<f32>>) {
        if pos0 != self.end {
            self.rows.clear();
            self.done = self.done.min(pos0);
        }
        self.rows.extend(rows);
        while self.rows.len() > self.window {
            self.rows.pop_front();
        }
        self.end = pos0 + n;
    }

    /// The session now holds `len` tokens.
    pub fn truncate(&mut self, len: usize) {
        if len < self.end {
            let drop = (self.end - len).min(self.rows.len());
            self.rows.truncate(self.rows.len() - drop);
            self.end = len;
        }
        self.done = self.done.min(len);
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.end = 0;
        self.done = 0;
    }

    /// Whether the rows end at `len` tokens (something to draft from).
    pub fn ready(&self, len: usize) -> bool {
        !self.rows.is_empty() && self.end == len
    }

    /// The first position with a kept row.
    pub fn oldest(&self) -> usize {
        self.end - self.rows.len()
    }

    /// The row of position `pos` (kept).
    pub fn row(&self, pos: usize) -> &[f32] {
        &self.rows[pos - self.oldest()]
    }
}
