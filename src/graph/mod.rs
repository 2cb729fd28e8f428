//! The command-graph recorder.
//!
//! The model is written once ([`crate::model::forward`]) as a flat tape of
//! [`Node`]s over named values. A graph is recorded once per *shape class* — a
//! decode step (1 token) or a prefill chunk (up to N tokens) — and replayed
//! with per-step scalars ([`StepParams`]: first position and token count), so
//! nothing is re-recorded per token. Values are either per-step activations
//! (planned into reusable slots by [`plan`]), persistent session state (KV
//! rings, compressed rows, compressor frontiers), or inputs/outputs.
//!
//! Backends execute a graph with one exhaustive `match` over [`Op`]; a new op
//! does not compile until every backend handles it. [`Node::Flush`] marks
//! points where a GPU backend may submit the work recorded so far.

pub mod ops;
mod plan;

use std::fmt;

pub use plan::{plan, Plan};

use crate::graph::ops::Op;

/// A value of a graph (activation, input or output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// A persistent state buffer shared by every graph of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I32,
}

/// Name and layer of a value, as used by `--dump NAME@LAYER`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueName {
    pub name: String,
    pub layer: Option<usize>,
}

impl fmt::Display for ValueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer {
            Some(l) => write!(f, "{}@{}", self.name, l),
            None => write!(f, "{}", self.name),
        }
    }
}

impl ValueName {
    /// Parses `NAME@LAYER` or `NAME`.
    pub fn parse(s: &str) -> Option<ValueName> {
        match s.split_once('@') {
            Some((n, l)) => Some(ValueName {
                name: n.to_string(),
                layer: Some(l.parse().ok()?),
            }),
            None => Some(ValueName {
                name: s.to_string(),
                layer: None,
            }),
        }
    }
}

/// A per-step value: `rows × cols`, where `rows` is the graph's token capacity
/// for token-indexed values (only the first `n_tokens` rows are live in a step).
#[derive(Clone, Debug)]
pub struct ValueDesc {
    pub name: ValueName,
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    /// Token-indexed: row `t` belongs to token `t` of the step.
    pub per_token: bool,
}

impl ValueDesc {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows holding data after a step of `n_tokens` (all of a fixed value).
    pub fn live_rows(&self, n_tokens: usize) -> usize {
        if self.per_token {
            n_tokens
        } else {
            self.rows
        }
    }
}

/// Persistent state: `rows × cols` f32, with the value a fresh session holds.
#[derive(Clone, Debug)]
pub struct StateDesc {
    pub name: ValueName,
    pub rows: usize,
    pub cols: usize,
    pub init: f32,
    /// Every value ever written here is an f16 value (cached rows under
    /// model numerics): a backend may store it as f16 without loss. Reads
    /// and writes through the `Backend` API stay f32.
    pub f16_values: bool,
}

/// One entry of the tape.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // ops are few (a few thousand per graph)
pub enum Node {
    Op(Op),
    /// A GPU backend may submit everything recorded so far here (layer ends).
    Flush,
}

/// Per-step scalars read by the ops at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepParams {
    /// Absolute position of the first token of the step.
    pub pos0: usize,
    /// Tokens in this step (≤ the graph's capacity).
    pub n_tokens: usize,
}

/// One token row of a step: its absolute position and the session state
/// (KV slot) it belongs to. A single-session step is the table
/// `(pos0 + t, 0)`; a batched step holds the rows of several states.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowRecord {
    pub pos: u32,
    pub state: u32,
}

impl RowRecord {
    /// The row table of a single-session step.
    pub fn contiguous(p: StepParams) -> Vec<RowRecord> {
        (0..p.n_tokens)
            .map(|t| RowRecord {
                pos: (p.pos0 + t) as u32,
                state: 0,
            })
            .collect()
    }
}

/// The rows of one state in a step: `n` rows from row `row0`, at positions
/// `pos0..pos0 + n`. Position-dependent ops (RoPE, attention, the ring,
/// the compressor and indexer) run once per segment against that state;
/// every other op runs over all rows at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub row0: usize,
    pub n: usize,
    pub pos0: usize,
    pub state: usize,
}

impl Segment {
    /// `n` one-row segments at position 0, row `t` of state `t`: `n`
    /// sessions that each decode one token in the step.
    pub fn one_row_each(n: usize) -> Vec<Segment> {
        (0..n)
            .map(|t| Segment {
                row0: t,
                n: 1,
                pos0: 0,
                state: t,
            })
            .collect()
    }
}

/// Splits a row table into its segments. Each state's rows must be one
/// block of consecutive positions in order (a session appends one piece
/// per step), and states must be below `n_states`; the error says which
/// row breaks that.
pub fn segments(rows: &[RowRecord], n_states: usize) -> Result<Vec<Segment>, String> {
    let mut out: Vec<Segment> = Vec::new();
    for (t, r) in rows.iter().enumerate() {
        let (pos, state) = (r.pos as usize, r.state as usize);
        if state >= n_states {
            return Err(format!("row {t}: state {state} of {n_states}"));
        }
        match out.last_mut() {
            Some(s) if s.state == state && s.pos0 + s.n == pos => s.n += 1,
            Some(s) if s.state == state => {
                return Err(format!(
                    "row {t}: position {pos} does not follow {} of the same state",
                    s.pos0 + s.n - 1
                ))
            }
            _ => {
                if out.iter().any(|s| s.state == state) {
                    return Err(format!("row {t}: state {state} has two blocks of rows"));
                }
                out.push(Segment {
                    row0: t,
                    n: 1,
                    pos0: pos,
                    state,
                });
            }
        }
    }
    Ok(out)
}

/// The layout of a session's persistent state (identical for every graph of
/// a model, so the decode and prefill graphs share one set of buffers).
#[derive(Clone, Debug, Default)]
pub struct StateLayout {
    pub states: Vec<StateDesc>,
}

impl StateLayout {
    pub fn add(
        &mut self,
        name: &str,
        layer: Option<usize>,
        rows: usize,
        cols: usize,
        init: f32,
    ) -> StateId {
        self.states.push(StateDesc {
            name: ValueName {
                name: name.to_string(),
                layer,
            },
            rows,
            cols,
            init,
            f16_values: false,
        });
        StateId(self.states.len() as u32 - 1)
    }

    /// Declares that every value written to `s` is an f16 value.
    /// Bytes of every state (f32).
    pub fn bytes(&self) -> usize {
        self.states.iter().map(|s| s.rows * s.cols * 4).sum()
    }

    pub fn mark_f16_values(&mut self, s: StateId) {
        if let Some(d) = self.states.get_mut(s.0 as usize) {
            d.f16_values = true;
        }
    }

    pub fn get(&self, s: StateId) -> &StateDesc {
        &self.states[s.0 as usize]
    }

    pub fn find(&self, name: &str, layer: Option<usize>) -> Option<StateId> {
        self.states
            .iter()
            .position(|d| d.name.name == name && d.name.layer == layer)
            .map(|i| StateId(i as u32))
    }
}

/// A recorded graph for one shape class.
#[derive(Clone, Debug)]
pub struct Graph {
    /// Token capacity of this shape class.
    pub max_tokens: usize,
    pub values: Vec<ValueDesc>,
    pub nodes: Vec<Node>,
    /// Token ids of the step (i32, `max_tokens`).
    pub tokens: ValueId,
    /// Logits (`rows × vocab`): the last token only, or every token.
    pub logits: ValueId,
    /// Values that must survive the step (outputs and dump targets).
    pub keep: Vec<ValueId>,
    /// Every row takes the kernel path of a one-row step, whatever the
    /// step's row count: a speculative verify step, whose rows must equal
    /// decoding them one at a time bit for bit (`session::speculate`).
    /// Only the fast CPU backend chooses paths by row count; the others
    /// compute each row alike at any count and ignore it.
    pub decode_paths: bool,
}

impl Graph {
    pub fn value(&self, v: ValueId) -> &ValueDesc {
        &self.values[v.0 as usize]
    }

    pub fn find(&self, name: &ValueName) -> Option<ValueId> {
        self.values
            .iter()
            .position(|d| &d.name == name)
            .map(|i| ValueId(i as u32))
    }

    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Op(op) => Some(op),
            Node::Flush => None,
        })
    }
}

/// Records values and ops in order; the model's forward pass talks only to this.
pub struct Recorder {
    max_tokens: usize,
    values: Vec<ValueDesc>,
    nodes: Vec<Node>,
    layer: Option<usize>,
}

impl Recorder {
    pub fn new(max_tokens: usize) -> Recorder {
        Recorder {
            max_tokens,
            values: Vec::new(),
            nodes: Vec::new(),
            layer: None,
        }
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Values created from now on are tagged with layer `l`.
    pub fn set_layer(&mut self, l: Option<usize>) {
        self.layer = l;
    }

    fn new_value(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        dtype: DType,
        per_token: bool,
    ) -> ValueId {
        self.values.push(ValueDesc {
            name: ValueName {
                name: name.to_string(),
                layer: self.layer,
            },
            rows,
            cols,
            dtype,
            per_token,
        });
        ValueId(self.values.len() as u32 - 1)
    }

    /// A token-indexed f32 value of `cols` per token.
    pub fn tokens_f32(&mut self, name: &str, cols: usize) -> ValueId {
        self.new_value(name, self.max_tokens, cols, DType::F32, true)
    }

    /// A token-indexed i32 value of `cols` per token.
    pub fn tokens_i32(&mut self, name: &str, cols: usize) -> ValueId {
        self.new_value(name, self.max_tokens, cols, DType::I32, true)
    }

    /// A value with a fixed number of rows (not token-indexed).
    pub fn fixed_f32(&mut self, name: &str, rows: usize, cols: usize) -> ValueId {
        self.new_value(name, rows, cols, DType::F32, false)
    }

    /// Appends `op`. Panics when the geometry it carries disagrees with its
    /// values ([`Op::geometry_mismatch`]): a recording bug.
    pub fn op(&mut self, op: Op) {
        if let Some(msg) = op.geometry_mismatch(&self.values) {
            panic!("{} recorded with {msg}", op.name());
        }
        self.nodes.push(Node::Op(op));
    }

    pub fn flush(&mut self) {
        self.nodes.push(Node::Flush);
    }

    pub fn value(&self, v: ValueId) -> &ValueDesc {
        &self.values[v.0 as usize]
    }

    pub fn finish(self, tokens: ValueId, logits: ValueId, mut keep: Vec<ValueId>) -> Graph {
        keep.push(tokens);
        keep.push(logits);
        keep.sort();
        keep.dedup();
        Graph {
            max_tokens: self.max_tokens,
            values: self.values,
            nodes: self.nodes,
            tokens,
            logits,
            keep,
            decode_paths: false,
        }
    }
}
