//! Graph operations: one descriptor per op, each next to its CPU twin.
//!
//! The CPU twins are the reference every GPU kernel is tested against, so
//! their numerics are plain: f32 activations, weights dequantised to f32 on
//! the fly, f32 accumulation in fixed order (results do not depend on the
//! number of threads). Families: [`matmul`], [`norm`], [`hc`], [`rope`],
//! [`round`], [`attention`], [`compress`], [`indexer`], [`moe`], [`basic`],
//! [`gather`].

pub mod attention;
pub mod basic;
pub mod candidate;
pub mod compress;
pub mod engram;
pub mod gather;
pub mod hc;
pub mod indexer;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod parallel;
pub mod rope;
pub mod round;
pub mod source_compress;
pub mod v41;

use crate::graph::{Graph, Segment, StateId, StepParams, ValueDesc, ValueId};

/// Every op a graph can hold. Backends match on this exhaustively.
#[derive(Clone, Debug)]
pub enum Op {
    Embed(basic::Embed),
    HcInit(hc::HcInit),
    RmsNorm(norm::RmsNorm),
    MatMul(matmul::MatMul),
    HcMix(hc::HcMix),
    HcCollapse(hc::HcCollapse),
    HcExpand(hc::HcExpand),
    Rope(rope::Rope),
    KvRound(round::KvRound),
    HadamardFp4(round::HadamardFp4),
    BlockRound(round::BlockRound),
    Attention(attention::Attention),
    RingWrite(attention::RingWrite),
    Compress(compress::Compress),
    IndexerTopK(indexer::IndexerTopK),
    Router(moe::Router),
    MoeExperts(moe::MoeExperts),
    SwiGlu(moe::SwiGlu),
    Add(basic::Add),
    Scale(basic::Scale),
    TakeLast(basic::TakeLast),
    GatherLast(gather::GatherLast),
    /// DeepSeek V4.1's own ops (Engram, candidate blocks, its compressor).
    V41(v41::V41Op),
}

impl Op {
    /// Values this op reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        match self {
            Op::Embed(o) => vec![o.tokens],
            Op::HcInit(o) => vec![o.x],
            Op::RmsNorm(o) => vec![o.x],
            Op::MatMul(o) => vec![o.x],
            Op::HcMix(o) => vec![o.logits],
            Op::HcCollapse(o) => vec![o.state, o.pre],
            Op::HcExpand(o) => vec![o.state, o.y, o.post, o.comb],
            Op::Rope(o) => vec![o.x],
            Op::KvRound(o) => vec![o.x],
            Op::HadamardFp4(o) => vec![o.x],
            Op::BlockRound(o) => vec![o.x],
            Op::Attention(o) => {
                let mut v = vec![o.q, o.kv];
                v.extend(o.selected);
                v
            }
            Op::RingWrite(o) => vec![o.kv],
            Op::Compress(o) => vec![o.kv, o.gate],
            Op::IndexerTopK(o) => vec![o.q, o.weights],
            Op::Router(o) => vec![o.logits, o.tokens],
            Op::MoeExperts(o) => vec![o.x, o.selected, o.weights],
            Op::SwiGlu(o) => vec![o.gate, o.up],
            Op::Add(o) => vec![o.a, o.b],
            Op::Scale(o) => vec![o.x],
            Op::TakeLast(o) => vec![o.x],
            Op::GatherLast(o) => vec![o.x],
            Op::V41(o) => o.inputs(),
        }
    }

    /// Values this op writes.
    pub fn outputs(&self) -> Vec<ValueId> {
        match self {
            Op::Embed(o) => vec![o.out],
            Op::HcInit(o) => vec![o.out],
            Op::RmsNorm(o) => vec![o.out],
            Op::MatMul(o) => vec![o.out],
            Op::HcMix(o) => {
                let mut v = vec![o.pre];
                v.extend(o.post);
                v.extend(o.comb);
                v
            }
            Op::HcCollapse(o) => vec![o.out],
            Op::HcExpand(o) => vec![o.out],
            Op::Rope(o) => vec![o.out],
            Op::KvRound(o) => vec![o.out],
            Op::HadamardFp4(o) => vec![o.out],
            Op::BlockRound(o) => vec![o.out],
            Op::Attention(o) => vec![o.out],
            Op::RingWrite(_) => vec![],
            Op::Compress(_) => vec![],
            Op::IndexerTopK(o) => vec![o.out],
            Op::Router(o) => vec![o.selected, o.weights],
            Op::MoeExperts(o) => vec![o.out],
            Op::SwiGlu(o) => vec![o.out],
            Op::Add(o) => vec![o.out],
            Op::Scale(o) => vec![o.out],
            Op::TakeLast(o) => vec![o.out],
            Op::GatherLast(o) => vec![o.out],
            Op::V41(o) => o.outputs(),
        }
    }

    /// Whether this op depends on its rows' positions or session state
    /// (RoPE, attention, the ring, the compressor, the indexer): such an op
    /// runs once per [`Segment`] of a step; the others run over all rows.
    pub fn per_segment(&self) -> bool {
        matches!(
            self,
            Op::Rope(_)
                | Op::Attention(_)
                | Op::RingWrite(_)
                | Op::Compress(_)
                | Op::IndexerTopK(_)
        )
    }

    /// Persistent state this op reads or writes.
    pub fn states(&self) -> Vec<StateId> {
        match self {
            Op::Attention(o) => {
                let mut v = vec![o.ring];
                v.extend(o.compressed.map(|c| c.rows));
                v
            }
            Op::RingWrite(o) => vec![o.ring],
            Op::Compress(o) => vec![o.state_kv, o.state_score, o.rows],
            Op::IndexerTopK(o) => vec![o.rows],
            Op::V41(o) => o.states(),
            _ => vec![],
        }
    }

    /// Weight tensors this op reads, so a backend can upload (and chunk)
    /// each once before the first step. Matrices first in each list.
    pub fn weights(&self) -> Vec<&TensorRef> {
        match self {
            Op::Embed(o) => vec![&o.table],
            Op::RmsNorm(o) => o.weight.iter().collect(),
            Op::MatMul(o) => vec![&o.w],
            Op::HcMix(o) => vec![&o.scale, &o.base],
            Op::Attention(o) => vec![&o.sinks],
            Op::Compress(o) => vec![&o.ape, &o.norm],
            Op::Router(o) => o.bias.iter().chain(o.tid2eid.iter()).collect(),
            Op::MoeExperts(o) => vec![&o.gate, &o.up, &o.down],
            Op::V41(o) => o.weights(),
            Op::HcInit(_)
            | Op::HcCollapse(_)
            | Op::HcExpand(_)
            | Op::Rope(_)
            | Op::KvRound(_)
            | Op::HadamardFp4(_)
            | Op::BlockRound(_)
            | Op::RingWrite(_)
            | Op::IndexerTopK(_)
            | Op::SwiGlu(_)
            | Op::Add(_)
            | Op::Scale(_)
            | Op::TakeLast(_)
            | Op::GatherLast(_) => vec![],
        }
    }

    /// How the row or column counts this op carries disagree with its output
    /// value (`values` indexed by `ValueId`); `None` when they agree. The
    /// recorder checks every op once, so a hand-built descriptor cannot
    /// carry geometry its values contradict.
    pub fn geometry_mismatch(&self, values: &[ValueDesc]) -> Option<String> {
        let v = |id: ValueId| &values[id.0 as usize];
        let cols = |cols: usize, out: ValueId| {
            let want = v(out).cols;
            (cols != want).then(|| format!("{cols} columns, its output value has {want}"))
        };
        let rows = |got: Rows, want: Rows| {
            (got != want).then(|| format!("rows {got:?}, its output value gives {want:?}"))
        };
        match self {
            Op::RmsNorm(o) => rows(o.rows, Rows::of(v(o.out), o.dim)),
            Op::MatMul(o) => rows(o.rows, Rows::value(v(o.out))),
            Op::Add(o) => cols(o.cols, o.out),
            Op::Scale(o) => cols(o.cols, o.out),
            Op::SwiGlu(o) => cols(o.cols, o.out),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed(_) => "embed",
            Op::HcInit(_) => "hc_init",
            Op::RmsNorm(_) => "rms_norm",
            Op::MatMul(_) => "matmul",
            Op::HcMix(_) => "hc_mix",
            Op::HcCollapse(_) => "hc_collapse",
            Op::HcExpand(_) => "hc_expand",
            Op::Rope(_) => "rope",
            Op::KvRound(_) => "kv_round",
            Op::HadamardFp4(_) => "hadamard_fp4",
            Op::BlockRound(_) => "block_round",
            Op::Attention(_) => "attention",
            Op::RingWrite(_) => "ring_write",
            Op::Compress(_) => "compress",
            Op::IndexerTopK(_) => "indexer_topk",
            Op::Router(_) => "router",
            Op::MoeExperts(_) => "moe_experts",
            Op::SwiGlu(_) => "swiglu",
            Op::Add(_) => "add",
            Op::Scale(_) => "scale",
            Op::TakeLast(_) => "take_last",
            Op::GatherLast(_) => "gather_last",
            Op::V41(o) => o.name(),
        }
    }
}

use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::quant;

/// Rows an op covers in a step: `per_token · n_tokens + fixed`. Computed once
/// from the output value's descriptor when the op is recorded
/// ([`Rows::of`]); the CPU twins, the WGSL dispatch and the CUDA grid all
/// read it from the descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rows {
    pub per_token: usize,
    pub fixed: usize,
}

impl Rows {
    /// The `width`-wide rows of value `d` (token-indexed values give rows
    /// per token, the others a fixed count).
    pub fn of(d: &ValueDesc, width: usize) -> Rows {
        let w = width.max(1);
        if d.per_token {
            Rows {
                per_token: d.cols / w,
                fixed: 0,
            }
        } else {
            Rows {
                per_token: 0,
                fixed: d.rows * d.cols / w,
            }
        }
    }

    /// The rows of value `d` itself (one per token, or its fixed rows).
    pub fn value(d: &ValueDesc) -> Rows {
        Rows::of(d, d.cols)
    }

    /// Live rows in a step of `n_tokens`.
    pub fn at(&self, n_tokens: usize) -> usize {
        self.per_token * n_tokens + self.fixed
    }

    /// `Some(rows)` when the count does not depend on the step.
    pub fn fixed_only(&self) -> Option<usize> {
        (self.per_token == 0).then_some(self.fixed)
    }
}

/// What every CPU twin runs against (`fn cpu(&self, cx: &mut CpuCx)`): the
/// step's value slots, the persistent states of every session in the step,
/// the weight file and the step scalars. The CPU backends build one per step.
///
/// A step's rows may belong to several sessions ([`Segment`]s). The
/// position-dependent ops ([`Op::per_segment`]) run once per segment: while
/// they run, `p` is the segment's first position and row count, token-indexed
/// values read through [`CpuCx::get`] and written through [`CpuCx::write`]
/// start at the segment's first row, and [`CpuCx::state`] is that session's
/// state. Every other op sees the whole step (`p.n_tokens` rows).
pub struct CpuCx<'a> {
    pub file: &'a GgufFile,
    pub graph: &'a Graph,
    pub p: StepParams,
    /// The step's segments (one for a single-session step).
    segments: &'a [Segment],
    /// First row and state set of the current view.
    row0: usize,
    set: usize,
    n_rows: usize,
    slot_of: &'a [usize],
    slots: &'a mut [Vec<f32>],
    /// `states[set][s]`: state `s` of session `set`.
    states: &'a mut [Vec<Vec<f32>>],
    /// The routed-expert slices an expert cache pinned for the op about to
    /// run (SSD streaming); `None`: experts are read through the mapping.
    pub experts: Option<std::sync::Arc<dyn moe::PinnedSlabs>>,
}

impl<'a> CpuCx<'a> {
    /// `slot_of[v]` is value `v`'s slot in `slots` (the memory plan);
    /// `states[set][s]` is state `s` of session `set`; `segments` (at least
    /// one) cover the step's rows in order.
    pub fn new(
        file: &'a GgufFile,
        graph: &'a Graph,
        segments: &'a [Segment],
        slot_of: &'a [usize],
        slots: &'a mut [Vec<f32>],
        states: &'a mut [Vec<Vec<f32>>],
    ) -> CpuCx<'a> {
        let n_rows = segments.iter().map(|s| s.n).sum();
        let first = segments.first().copied().unwrap_or(Segment {
            row0: 0,
            n: 0,
            pos0: 0,
            state: 0,
        });
        CpuCx {
            file,
            graph,
            p: StepParams {
                pos0: first.pos0,
                n_tokens: n_rows,
            },
            segments,
            row0: 0,
            set: first.state,
            n_rows,
            slot_of,
            slots,
            states,
            experts: None,
        }
    }

    /// Where a routed-expert pass reads its slabs.
    pub fn expert_source(&self) -> moe::SlabSource<'_> {
        match &self.experts {
            Some(p) => moe::SlabSource::Pinned(self.file, &**p),
            None => moe::SlabSource::File(self.file),
        }
    }

    /// Tokens in the current view (the step, or one segment).
    pub fn n(&self) -> usize {
        self.p.n_tokens
    }

    /// The step's segments.
    pub fn segments(&self) -> &[Segment] {
        self.segments
    }

    /// Runs `f` once per segment with the view narrowed to it, then
    /// restores the whole-step view.
    pub fn for_each_segment(&mut self, mut f: impl FnMut(&mut Self)) {
        let whole = (self.p, self.row0, self.set);
        for i in 0..self.segments.len() {
            let s = self.segments[i];
            self.p = StepParams {
                pos0: s.pos0,
                n_tokens: s.n,
            };
            self.row0 = s.row0;
            self.set = s.state;
            f(self);
        }
        (self.p, self.row0, self.set) = whole;
    }

    /// Where the current view starts in value `v` (0 for fixed values).
    fn offset(&self, v: ValueId) -> usize {
        let d = self.graph.value(v);
        if d.per_token {
            self.row0 * d.cols
        } else {
            0
        }
    }

    /// Value `v` (f32) from the current view's first row to its capacity.
    pub fn get(&self, v: ValueId) -> &[f32] {
        let len = self.graph.value(v).len();
        &self.slots[self.slot_of[v.0 as usize]][self.offset(v)..len]
    }

    /// An i32 value (stored bit-cast in its f32 slot).
    pub fn get_i32(&self, v: ValueId) -> &[i32] {
        bytemuck::cast_slice(self.get(v))
    }

    /// Takes `v`'s whole buffer out of its slot so inputs can be borrowed
    /// alongside it; [`CpuCx::put`] returns it. Whole-step ops only (the
    /// buffer is not narrowed to a segment).
    pub fn take(&mut self, v: ValueId) -> Vec<f32> {
        debug_assert!(self.row0 == 0 && self.n_rows == self.p.n_tokens);
        std::mem::take(&mut self.slots[self.slot_of[v.0 as usize]])
    }

    pub fn put(&mut self, v: ValueId, buf: Vec<f32>) {
        self.slots[self.slot_of[v.0 as usize]] = buf;
    }

    /// Runs `f` with `out`'s buffer (from the view's first row) writable and
    /// every other value readable.
    pub fn write<R>(&mut self, out: ValueId, f: impl FnOnce(&Self, &mut [f32]) -> R) -> R {
        let off = self.offset(out);
        let mut buf = std::mem::take(&mut self.slots[self.slot_of[out.0 as usize]]);
        let r = f(self, &mut buf[off..]);
        self.put(out, buf);
        r
    }

    /// [`CpuCx::write`] for an i32 output.
    pub fn write_i32<R>(&mut self, out: ValueId, f: impl FnOnce(&Self, &mut [i32]) -> R) -> R {
        self.write(out, |cx, buf| f(cx, bytemuck::cast_slice_mut(buf)))
    }

    /// State `s`'s buffer of the current view's session.
    pub fn state(&self, s: StateId) -> &[f32] {
        &self.states[self.set][s.0 as usize]
    }

    /// Takes state `s`'s buffer out ([`CpuCx::put_state`] returns it).
    pub fn take_state(&mut self, s: StateId) -> Vec<f32> {
        std::mem::take(&mut self.states[self.set][s.0 as usize])
    }

    pub fn put_state(&mut self, s: StateId, buf: Vec<f32>) {
        self.states[self.set][s.0 as usize] = buf;
    }
}

/// A whole tensor widened to f32 (norm weights, biases, small mixers).
pub fn load_f32(file: &GgufFile, t: &TensorRef) -> Vec<f32> {
    let n: u64 = t.ne.iter().product();
    let mut out = vec![0f32; n as usize];
    let row = t.ne[0] as usize;
    let rb = t.row_bytes();
    for (dst, src) in out
        .chunks_exact_mut(row)
        .zip(t.bytes(file).chunks_exact(rb))
    {
        // Types were validated when binding; a failure here is a bug.
        quant::dequantize_row(t.ty, src, dst).expect("validated tensor type");
    }
    out
}

/// A tensor of I32 values (the hash-routing table).
pub fn load_i32(file: &GgufFile, t: &TensorRef) -> Vec<i32> {
    t.bytes(file)
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Dot product with eight independent f32 accumulators: vectorises well and
/// sums in a fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}
