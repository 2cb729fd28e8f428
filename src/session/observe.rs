//! A step observer: a seam beside the draft model through which a caller
//! sees the kept values of every target step (`ds4 --imatrix-dataset`,
//! `app::imatrix`). The observer names what each graph keeps for it when
//! the session records the graph, and reads those values after each step
//! the session runs, where the draft model records its rows.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::draft::TargetStep;
use super::net::Net;
use super::SessionError;
use crate::graph::{Graph, ValueId, ValueName};
use crate::model::logits::Logits;

/// What a session shows an observer.
pub trait StepObserver: Send {
    /// The values a graph keeps readable for the observer. `probe` is the
    /// graph recorded without them (names are alike in every graph of a
    /// session); asked once for each graph the session records (decode,
    /// prefill, scoring), so an observer may keep values in some graphs
    /// only (the imatrix collector: graphs with logits at every row).
    fn targets(&self, probe: &Graph) -> Vec<ValueName>;

    /// After each target step. An error ends the step with it (and the
    /// session starts over, as after a failed step).
    fn observe(&mut self, step: &ObservedStep<'_>) -> Result<(), SessionError>;
}

/// A shared observer, as [`super::SessionOptions::observer`] holds it: the
/// caller keeps a clone of the `Arc` to read what it gathered.
#[derive(Clone)]
pub struct Observer(pub Arc<Mutex<dyn StepObserver>>);

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observer")
    }
}

impl Observer {
    pub(super) fn targets(&self, probe: &Graph) -> Vec<ValueName> {
        match self.0.lock() {
            Ok(o) => o.targets(probe),
            Err(p) => p.into_inner().targets(probe),
        }
    }

    pub(super) fn observe(&self, step: &TargetStep<'_>) -> Result<(), SessionError> {
        let view = ObservedStep(step);
        match self.0.lock() {
            Ok(mut o) => o.observe(&view),
            Err(_) => Err(SessionError::Observer(
                "an earlier step panicked inside the observer".into(),
            )),
        }
    }
}

/// A finished step of graph [`ObservedStep::graph`] over positions
/// `pos0 .. pos0 + n`, with its kept values readable.
pub struct ObservedStep<'a>(&'a TargetStep<'a>);

impl ObservedStep<'_> {
    pub fn graph(&self) -> &Graph {
        self.0.graph
    }

    /// Rows (tokens) of the step.
    pub fn n(&self) -> usize {
        self.0.n
    }

    /// Position of the step's first row.
    pub fn pos0(&self) -> usize {
        self.0.pos0
    }

    /// Whether value `v` survived the step (only kept values are readable).
    pub fn kept(&self, v: ValueId) -> bool {
        self.0.graph.keep.binary_search(&v).is_ok()
    }

    /// Rows `rows` of value `v`'s live rows (clamped), on the host; i32
    /// values come as their f32 numbers.
    pub fn read_rows(&self, v: ValueId, rows: Range<usize>) -> Result<Vec<f32>, SessionError> {
        Ok(self.0.backend.read_value_rows(self.0.g, v, rows)?)
    }

    /// Every live row of value `v`.
    pub fn read(&self, v: ValueId) -> Result<Vec<f32>, SessionError> {
        self.read_rows(v, 0..usize::MAX)
    }
}

/// `net`'s graph for steps of up to `max_tokens` tokens keeping `keep` and,
/// with an observer, what the observer asks of this graph.
pub(super) fn record(
    net: &dyn Net,
    observer: Option<&Observer>,
    max_tokens: usize,
    logits: Logits,
    keep: &[ValueName],
) -> Graph {
    let Some(o) = observer else {
        return net.record(max_tokens, logits, keep);
    };
    let probe = net.record(max_tokens, logits, keep);
    let more = o.targets(&probe);
    if more.is_empty() {
        return probe;
    }
    let mut all = keep.to_vec();
    all.extend(more);
    net.record(max_tokens, logits, &all)
}
