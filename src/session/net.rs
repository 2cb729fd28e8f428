//! The model family as a session runs it: one [`Net`] trait, implemented by
//! V4 (`v4.rs`) and V4.1 (`v41.rs`), and opened by `session::open_net`. A
//! session, a batch and the snapshot code talk to the family only through
//! it; a third family would add one implementation and one arm there, not
//! another arm in each of them.

use crate::backend::{Backend, GraphHandle};
use crate::graph::{Graph, StateLayout, ValueName};
use crate::model::logits::Logits;
use crate::model::v41::engram_reader::EngramStats;

use super::draft::Drafter;
use super::SessionError;

/// A model family's graphs, state and snapshot payload for one session (or
/// one batch of slots sharing a backend).
pub(crate) trait Net: Send {
    /// The session state every graph reads and writes.
    fn state_layout(&self) -> &StateLayout;

    /// The forward pass for steps of up to `max_tokens` tokens, with the
    /// values in `keep` readable after a step.
    fn record(&self, max_tokens: usize, logits: Logits, keep: &[ValueName]) -> Graph;

    /// Why one graph cannot step several state sets at once
    /// ([`Backend::run_rows`]), if it cannot: V4's can; V4.1's per-session
    /// host state (Engram history) is not kept per set yet.
    fn no_batching(&self) -> Option<&'static str>;

    /// What the host writes into graph `g` before a step over `tokens`
    /// (V4.1: the step's Engram rows). Nothing by default.
    fn feed(
        &mut self,
        _backend: &mut dyn Backend,
        _g: GraphHandle,
        _graph: &Graph,
        _tokens: &[u32],
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// Serialises one state set with the session's tokens and logits (the
    /// family's snapshot payload).
    fn save(&self, at: Saving<'_>) -> Result<Vec<u8>, SessionError>;

    /// Reads a payload made by [`Net::save`] into one state set; returns
    /// its tokens and logits. On error the set is undefined (the caller
    /// resets).
    fn load(&mut self, at: Loading<'_>) -> Result<(Vec<u32>, Vec<f32>), SessionError>;

    /// The draft model's runner, with its graphs loaded on `backend`, when
    /// the session runs one (V4 with `--mtp` or `--dspark`).
    fn open_drafter(&self, _backend: &mut dyn Backend) -> Result<Option<Drafter>, SessionError> {
        Ok(None)
    }

    /// Forgets host-side state for an empty sequence.
    fn reset(&mut self) {}

    /// Puts host-side state back to what it is after `tokens` (a
    /// speculative step took rows back; V4.1: the Engram history).
    fn rewind_host(&mut self, _tokens: &[u32]) {}

    /// What the Engram reader did (V4.1 only).
    fn engram_stats(&self) -> Option<EngramStats> {
        None
    }
}

/// The session sizes a snapshot records and checks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    pub ctx: usize,
    pub prefill_chunk: usize,
}

/// What [`Net::save`] serialises: state set `set` of `backend`, with the
/// sequence it holds.
pub(crate) struct Saving<'a> {
    pub backend: &'a dyn Backend,
    pub set: usize,
    pub tokens: &'a [u32],
    pub logits: &'a [f32],
    pub frame: Frame,
}

/// What [`Net::load`] reads `payload` into: state set `set` of `backend`.
pub(crate) struct Loading<'a> {
    pub backend: &'a mut dyn Backend,
    pub set: usize,
    pub payload: &'a [u8],
    pub frame: Frame,
}
