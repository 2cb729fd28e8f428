//! Backends execute recorded graphs. One small trait over the whole graph:
//! load a graph, run a step, read values and state back.

pub mod cpu;
pub mod select;

use std::sync::Arc;

use thiserror::Error;

use crate::graph::{Graph, StateId, StepParams, ValueId};

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("backend {backend} is not available: {reason}")]
    Unavailable { backend: String, reason: String },
    #[error("{backend} cannot run {what}")]
    Unsupported { backend: String, what: String },
    #[error("step of {n_tokens} tokens exceeds the graph capacity {capacity}")]
    TooManyTokens { n_tokens: usize, capacity: usize },
    #[error("state {state}: {msg}")]
    State { state: String, msg: String },
    #[error("unknown graph handle {0}")]
    UnknownGraph(usize),
}

/// A graph loaded into a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphHandle(pub usize);

pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// Prepares a recorded graph (memory plan, uploads, pipelines).
    fn load_graph(&mut self, graph: Arc<Graph>) -> Result<GraphHandle, BackendError>;

    /// Runs one step: `tokens` are the step's token ids.
    fn run(
        &mut self,
        g: GraphHandle,
        tokens: &[u32],
        params: StepParams,
    ) -> Result<(), BackendError>;

    /// Reads back the live rows of a value after a step (logits, dumps).
    fn read_value(&self, g: GraphHandle, v: ValueId) -> Result<Vec<f32>, BackendError>;

    /// Reads or writes a whole persistent state buffer (snapshots).
    fn read_state(&self, s: StateId) -> Result<Vec<f32>, BackendError>;
    fn write_state(&mut self, s: StateId, data: &[f32]) -> Result<(), BackendError>;

    /// Puts every state buffer back to its fresh value.
    fn reset_states(&mut self);
}
