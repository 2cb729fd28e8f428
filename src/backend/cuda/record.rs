//! From a recorded graph to a launch list: the one exhaustive match of this
//! backend over [`Op`], one line per op, each handing the op to its
//! family's launch file (`launch/<family>.rs` ↔ `cuda/<family>.cu`). Every
//! op becomes one or more kernel launches with fixed device pointers and
//! parameters (the step's position and token count are read by the kernels
//! from device memory, so the same list, or the CUDA graph captured from
//! it, serves every step). Launch configurations are documented in
//! docs/CUDA.md and in each `cuda/<family>.cu`.
//!
//! Several sessions in one step: the per-session ops ([`Op::per_segment`]:
//! RoPE, ring write, attention, compressor, indexer) get one launch per
//! state set, each with that set's state buffers and its own `Step` (the
//! session's position, row count and first row in the step); the other ops
//! get one launch over all rows.

use cudarc::driver::sys::{CUdeviceptr, CUfunction};

use std::collections::HashMap;

use super::launch::{self as l, Cx, Launch};
use super::mem::DevBuf;
use super::weights::{Progress, Weights};
use crate::backend::kernels::launch_op;
use crate::backend::BackendError;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node};

/// What recording reads and fills (fields of the backend and the graph,
/// borrowed separately).
pub struct Ctx<'a> {
    pub file: &'a crate::gguf::GgufFile,
    pub funcs: &'a HashMap<&'static str, CUfunction>,
    pub weights: &'a mut Weights,
    /// `states[set][state]`: one copy of the state buffers per session.
    pub states: &'a [Vec<DevBuf>],
    /// Device address of each state set's `Step` (per-session launches).
    pub set_steps: &'a [CUdeviceptr],
    /// The step's per-row state set (u32 per row, uploaded each step), read
    /// by the head's gather when several sets are held.
    pub row_states: CUdeviceptr,
    pub layout: &'a crate::graph::StateLayout,
    pub freqs: &'a mut HashMap<String, DevBuf>,
    /// Device address of the step parameters.
    pub step: CUdeviceptr,
    /// Device address of every value.
    pub values: &'a [CUdeviceptr],
    /// Scratch allocations of the graph (kept alive with it).
    pub scratch: &'a mut Vec<DevBuf>,
    /// Record the tensor-core prefill matmul (sm_80+, opt-in).
    pub tensor_cores: bool,
    /// Streamed layers' device slots (`--ssd-streaming`), by `gate` offset:
    /// their routed passes read the slots and are marked in `points`.
    pub streamed: &'a HashMap<u64, super::streaming::StreamedLayer>,
    pub points: &'a mut Vec<super::streaming::StreamPoint>,
}

/// The launches of one op: the one match over [`Op`], shared with the other
/// GPU backend ([`launch_op`]), each arm calling its family's launch file.
fn op(cx: &mut Cx, op: &Op) -> Result<(), BackendError> {
    launch_op!(l, cx, op)
}

/// The launch list of `graph`.
pub fn record(c: Ctx<'_>, graph: &Graph) -> Result<Vec<Launch>, BackendError> {
    let mut progress = Progress::new(weight_bytes(graph));
    let mut out = Vec::new();
    // One state set: every row is state 0 (the gather reads a null array).
    let row_states = if c.states.len() > 1 { c.row_states } else { 0 };
    for node in &graph.nodes {
        let Node::Op(o) = node else { continue };
        let per_session = o.per_segment();
        for set in 0..if per_session { c.states.len() } else { 1 } {
            let before = out.len();
            let mut cx = Cx {
                file: c.file,
                graph,
                funcs: c.funcs,
                weights: &mut *c.weights,
                progress: &mut progress,
                states: &c.states[set],
                layout: c.layout,
                freqs: &mut *c.freqs,
                values: c.values,
                scratch: &mut *c.scratch,
                step: if per_session {
                    c.set_steps[set]
                } else {
                    c.step
                },
                row_states,
                tensor_cores: c.tensor_cores,
                streamed: c.streamed,
                pending: None,
                out: &mut out,
            };
            op(&mut cx, o)?;
            if let Some(mut p) = cx.pending.take() {
                // The pass's launches: rows from `before`, the sum last.
                p.first = before;
                p.sum = out.len() - 1;
                c.points.push(p);
            }
            if per_session {
                for l in &mut out[before..] {
                    l.set = Some(set);
                }
            }
        }
    }
    progress.finish();
    Ok(out)
}

/// Bytes of the big tensors a graph reads (for the progress bar).
fn weight_bytes(graph: &Graph) -> u64 {
    graph
        .ops()
        .map(|op| match op {
            Op::MatMul(o) => o.w.n_bytes,
            Op::Embed(o) => o.table.n_bytes,
            Op::MoeExperts(o) => o.gate.n_bytes + o.up.n_bytes + o.down.n_bytes,
            _ => 0,
        })
        .sum()
}
