//! From a recorded graph to a launch list: every op becomes one or more
//! kernel launches with fixed device pointers and parameters (the step's
//! position and token count are read by the kernels from device memory, so
//! the same list, or the CUDA graph captured from it, serves every step).
//! Launch configurations are documented in docs/CUDA.md and in each
//! `cuda/<family>.cu`.
//!
//! Several sessions in one step: the per-session ops ([`Op::per_segment`]:
//! RoPE, ring write, attention, compressor, indexer) get one launch per
//! state set, each with that set's state buffers and its own `Step` (the
//! session's position, row count and first row in the step); the other ops
//! get one launch over all rows.

use cudarc::driver::sys::{CUdeviceptr, CUfunction};

use std::collections::HashMap;

use super::mem::DevBuf;
use super::weights::{Progress, Weights};
use crate::backend::BackendError;
use crate::gguf::TensorRef;
use crate::graph::ops::compress::RowRounding;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, ValueId};
use crate::quant::GgmlType;

mod v41;

/// One kernel argument (stored as 8 bytes; the kernel reads its size).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(CUdeviceptr),
    U32(u32),
    U64(u64),
    F32(f32),
}

impl Arg {
    pub fn bits(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::U32(v) => v as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// `ceil(per_token · n / div) + fixed`.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    pub per_token: u32,
    pub div: u32,
    pub fixed: u32,
}

impl Count {
    pub fn at(self, n: u32) -> u32 {
        (self.per_token * n).div_ceil(self.div) + self.fixed
    }
}

const fn per_token(k: u32) -> Count {
    Count {
        per_token: k,
        div: 1,
        fixed: 0,
    }
}

/// One per `div` tokens (rounded up).
const fn per_tokens(div: u32) -> Count {
    Count {
        per_token: 1,
        div,
        fixed: 0,
    }
}

const fn fixed(k: u32) -> Count {
    Count {
        per_token: 0,
        div: 1,
        fixed: k,
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Grid {
    /// Grid-stride kernels: enough 256-thread blocks for the items (capped).
    Threads(Count),
    /// Explicit blocks in x and y.
    Blocks(Count, Count),
}

/// Threads per block of the grid-stride kernels.
pub const THREADS: u32 = 256;
/// Most blocks a grid-stride launch uses (the kernels loop past it).
const MAX_STRIDE_BLOCKS: u32 = 8192;

impl Grid {
    /// `(x, y)` for `n` tokens; `None` when there is no work.
    pub fn dims(self, n: u32) -> Option<(u32, u32)> {
        let (x, y) = match self {
            Grid::Threads(c) => (c.at(n).div_ceil(THREADS).min(MAX_STRIDE_BLOCKS), 1),
            Grid::Blocks(x, y) => (x.at(n), y.at(n)),
        };
        (x > 0 && y > 0).then_some((x, y))
    }
}

pub struct Launch {
    pub kernel: &'static str,
    pub func: CUfunction,
    pub grid: Grid,
    pub block: u32,
    pub shared: u32,
    pub args: Vec<Arg>,
    /// Steps whose token count lies in this range run the launch (the
    /// tensor-core prefill and the CUDA-core matmul split a graph's steps).
    pub tokens: std::ops::RangeInclusive<u32>,
    /// `Some(set)` for a per-session launch: it runs for the rows of state
    /// set `set` (sized from that session's rows), reading its `Step`.
    pub set: Option<usize>,
}

/// Prefill steps of at least this many tokens take the tensor-core matmul
/// (when enabled): below it a 32-token tile is mostly padding, and decode
/// (1 token) stays on the bandwidth-bound CUDA-core kernel.
pub const MMA_MIN_TOKENS: u32 = 32;

fn unsupported(what: String) -> BackendError {
    BackendError::Unsupported {
        backend: "cuda".into(),
        what,
    }
}

/// Suffix of the per-type kernels for a weight type.
pub fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Bf16 => "bf16",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q2K => "q2_k",
        GgmlType::Q4K => "q4_k",
        GgmlType::Iq2Xxs => "iq2_xxs",
        GgmlType::Mxfp4 => "mxfp4",
        _ => return None,
    })
}

fn u(v: usize) -> u32 {
    v as u32
}

/// What recording reads and fills (fields of the backend and the graph,
/// borrowed separately).
pub struct Ctx<'a> {
    pub file: &'a crate::gguf::GgufFile,
    pub funcs: &'a HashMap<String, CUfunction>,
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

struct List<'a> {
    funcs: &'a HashMap<String, CUfunction>,
    step: CUdeviceptr,
    out: Vec<Launch>,
}

impl List<'_> {
    fn launch(
        &mut self,
        kernel: &'static str,
        grid: Grid,
        block: u32,
        shared: u32,
        mut args: Vec<Arg>,
    ) -> Result<(), BackendError> {
        args.push(Arg::Ptr(self.step));
        let func = *self
            .funcs
            .get(kernel)
            .ok_or_else(|| unsupported(format!("kernel {kernel} (not in the loaded modules)")))?;
        self.out.push(Launch {
            kernel,
            func,
            grid,
            block,
            shared,
            args,
            tokens: 0..=u32::MAX,
            set: None,
        });
        Ok(())
    }

    /// Limits the last launch to steps with a token count in `tokens`.
    fn only_for(&mut self, tokens: std::ops::RangeInclusive<u32>) {
        if let Some(l) = self.out.last_mut() {
            l.tokens = tokens;
        }
    }
}

pub(super) fn scratch(list: &mut Vec<DevBuf>, bytes: usize) -> Result<CUdeviceptr, BackendError> {
    let b = DevBuf::alloc(bytes)?;
    let p = b.ptr;
    list.push(b);
    Ok(p)
}

/// Rope frequencies (ops::rope::frequencies, f64) on the device, once per
/// configuration.
fn freqs(
    map: &mut HashMap<String, DevBuf>,
    r: &crate::graph::ops::rope::RopeConfig,
) -> Result<CUdeviceptr, BackendError> {
    let key = format!("{r:?}");
    if let Some(b) = map.get(&key) {
        return Ok(b.ptr);
    }
    let f = crate::graph::ops::rope::frequencies(r);
    let b = DevBuf::from_bytes(bytemuck::cast_slice(&f))?;
    let p = b.ptr;
    map.insert(key, b);
    Ok(p)
}

/// The launch list of `graph`.
pub fn record(c: Ctx<'_>, graph: &Graph) -> Result<Vec<Launch>, BackendError> {
    let Ctx {
        file,
        funcs,
        weights,
        states,
        set_steps,
        row_states,
        layout,
        freqs: freq_map,
        step,
        values,
        scratch: scratch_list,
        tensor_cores,
        streamed,
        points,
    } = c;
    let mut progress = Progress::new(weight_bytes(graph));
    let mut list = List {
        funcs,
        step,
        out: Vec::new(),
    };
    let v = |id: ValueId| Arg::Ptr(values[id.0 as usize]);
    for node in &graph.nodes {
        let Node::Op(op) = node else { continue };
        let per_session = op.per_segment();
        for set in 0..if per_session { states.len() } else { 1 } {
            list.step = if per_session { set_steps[set] } else { step };
            let st = |s: crate::graph::StateId| -> Result<Arg, BackendError> {
                states[set]
                    .get(s.0 as usize)
                    .map(|d| Arg::Ptr(d.ptr))
                    .ok_or_else(|| unsupported(format!("state #{} outside the layout", s.0)))
            };
            let before = list.out.len();
            let mut pending: Option<super::streaming::StreamPoint> = None;
            let mut launch =
                |kernel: &'static str, grid: Grid, block: u32, shared: u32, args: Vec<Arg>| {
                    list.launch(kernel, grid, block, shared, args)
                };
            match op {
                Op::Embed(o) => {
                    let ty = o.table.ty;
                    let name = per_type("embed_", ty)?;
                    let d = o.dim();
                    let items = if d % 32 == 0 { d / 32 } else { d };
                    let table = weights.tensor(file, &o.table, &mut progress)?;
                    launch(
                        name,
                        Grid::Threads(per_token(u(items))),
                        THREADS,
                        0,
                        vec![
                            Arg::Ptr(table),
                            Arg::U32(u(o.table.row_bytes())),
                            Arg::U32(u(d)),
                            v(o.tokens),
                            v(o.out),
                        ],
                    )?;
                }
                Op::HcInit(o) => launch(
                    "hc_init",
                    Grid::Threads(per_token(u(o.items()))),
                    THREADS,
                    0,
                    vec![v(o.x), v(o.out), Arg::U32(u(o.n_hc)), Arg::U32(u(o.dim))],
                )?,
                Op::RmsNorm(o) => {
                    let w = match &o.weight {
                        Some(t) => weights.small_f32(file, t)?,
                        None => 0,
                    };
                    let (rows_per_token, fixed_rows) = (u(o.rows.per_token), u(o.rows.fixed));
                    let grid = match o.rows.fixed_only() {
                        None => per_token(rows_per_token),
                        Some(_) => fixed(fixed_rows),
                    };
                    launch(
                        "rms_norm",
                        Grid::Blocks(grid, fixed(1)),
                        THREADS,
                        0,
                        vec![
                            v(o.x),
                            Arg::Ptr(w),
                            v(o.out),
                            Arg::U32(u(o.dim)),
                            Arg::F32(o.eps),
                            Arg::U32(rows_per_token),
                            Arg::U32(fixed_rows),
                        ],
                    )?;
                }
                Op::MatMul(o) => {
                    let name = per_type("matmul_", o.w.ty)?;
                    let (n_in, n_out) = (o.in_dim(), o.out_dim());
                    if o.groups == 0 || n_out % o.groups != 0 {
                        return Err(unsupported(format!(
                            "matmul {} ({n_in} × {n_out}, {} groups)",
                            o.w.name, o.groups
                        )));
                    }
                    let fixed_rows = u(o.rows.fixed_only().unwrap_or(0));
                    let per_token_rows = o.rows.fixed_only().is_none();
                    let w = weights.tensor(file, &o.w, &mut progress)?;
                    // y: token tiles of MM_TT = 8.
                    let ty = if per_token_rows {
                        per_tokens(8)
                    } else {
                        fixed(fixed_rows.div_ceil(8))
                    };
                    let args = vec![
                        Arg::Ptr(w),
                        Arg::U32(u(o.w.row_bytes())),
                        Arg::U32(u(n_in)),
                        Arg::U32(u(n_out)),
                        Arg::U32(u(o.groups)),
                        v(o.x),
                        v(o.out),
                    ];
                    let mut cuda_core = args.clone();
                    cuda_core.push(Arg::U32(fixed_rows));
                    launch(
                        name,
                        Grid::Blocks(fixed(u(n_out).div_ceil(8)), ty),
                        THREADS,
                        0,
                        cuda_core,
                    )?;
                    // Tensor cores for prefill steps: whole 32-value units and
                    // 64-row tiles that never straddle an output group.
                    let per_group = n_out / o.groups;
                    if tensor_cores
                        && per_token_rows
                        && u(graph.max_tokens) >= MMA_MIN_TOKENS
                        && n_in % 32 == 0
                        && (o.groups == 1 || per_group % 64 == 0)
                    {
                        list.only_for(0..=MMA_MIN_TOKENS - 1);
                        list.launch(
                            per_type("mma_", o.w.ty)?,
                            Grid::Blocks(fixed(u(n_out).div_ceil(64)), per_tokens(32)),
                            128,
                            0,
                            args,
                        )?;
                        list.only_for(MMA_MIN_TOKENS..=u32::MAX);
                    }
                }
                Op::HcMix(o) => {
                    let scale = weights.small_f32(file, &o.scale)?;
                    let base = weights.small_f32(file, &o.base)?;
                    if o.n_hc > 8 {
                        return Err(unsupported(format!(
                            "{} hyper-connection streams (at most 8)",
                            o.n_hc
                        )));
                    }
                    launch(
                        "hc_mix",
                        Grid::Blocks(per_tokens(64), fixed(1)),
                        64,
                        0,
                        vec![
                            v(o.logits),
                            Arg::Ptr(scale),
                            Arg::Ptr(base),
                            v(o.pre),
                            o.post.map_or(Arg::Ptr(0), v),
                            o.comb.map_or(Arg::Ptr(0), v),
                            Arg::U32(u(o.n_hc)),
                            Arg::U32(u(o.mix_dim())),
                            Arg::U32(u(o.sinkhorn_iters)),
                            Arg::F32(o.eps),
                        ],
                    )?;
                }
                Op::HcCollapse(o) => launch(
                    "hc_collapse",
                    Grid::Threads(per_token(u(o.items()))),
                    THREADS,
                    0,
                    vec![
                        v(o.state),
                        v(o.pre),
                        v(o.out),
                        Arg::U32(u(o.n_hc)),
                        Arg::U32(u(o.dim)),
                    ],
                )?,
                Op::HcExpand(o) => launch(
                    "hc_expand",
                    Grid::Threads(per_token(u(o.items()))),
                    THREADS,
                    0,
                    vec![
                        v(o.state),
                        v(o.y),
                        v(o.post),
                        v(o.comb),
                        v(o.out),
                        Arg::U32(u(o.n_hc)),
                        Arg::U32(u(o.dim)),
                    ],
                )?,
                Op::Rope(o) => {
                    let f = freqs(freq_map, &o.rope)?;
                    launch(
                        "rope",
                        Grid::Threads(per_token(u(o.items()))),
                        THREADS,
                        0,
                        vec![
                            v(o.x),
                            v(o.out),
                            Arg::Ptr(f),
                            Arg::U32(u(o.rope.n_rot / 2)),
                            Arg::U32(u(o.heads)),
                            Arg::U32(u(o.head_dim)),
                            Arg::U32(o.inverse as u32),
                        ],
                    )?;
                }
                Op::KvRound(o) => {
                    let block = 32 * u(o.dim.div_ceil(64));
                    if block > 1024 {
                        return Err(unsupported(format!(
                            "kv_round of {} dims (at most 2048)",
                            o.dim
                        )));
                    }
                    launch(
                        "kv_round",
                        Grid::Blocks(per_token(1), fixed(1)),
                        block,
                        0,
                        vec![
                            v(o.x),
                            v(o.out),
                            Arg::U32(u(o.dim)),
                            Arg::U32(u(o.n_rot)),
                            Arg::U32(o.fp8 as u32),
                            Arg::U32(o.f16 as u32),
                        ],
                    )?;
                }
                Op::HadamardFp4(o) => {
                    let hd = o.head_dim;
                    if !hd.is_power_of_two() || hd > 1024 || o.cols % hd != 0 {
                        return Err(unsupported(format!("hadamard_fp4 over heads of {hd}")));
                    }
                    launch(
                        "hadamard_fp4",
                        Grid::Blocks(per_token(u(o.blocks())), fixed(1)),
                        u(hd.max(32)),
                        u(4 * hd),
                        vec![v(o.x), v(o.out), Arg::U32(u(o.cols)), Arg::U32(u(hd))],
                    )?;
                }
                Op::Attention(o) => {
                    if o.head_dim > 512 {
                        return Err(unsupported(format!(
                            "attention head dim {} (at most 512)",
                            o.head_dim
                        )));
                    }
                    let sinks = weights.small_f32(file, &o.sinks)?;
                    let (comp, ratio) = match o.compressed {
                        Some(c) => (st(c.rows)?, c.ratio),
                        None => (Arg::Ptr(0), 0),
                    };
                    launch(
                        "attention",
                        Grid::Blocks(fixed(u(o.n_head)), per_token(1)),
                        THREADS,
                        0,
                        vec![
                            v(o.q),
                            v(o.kv),
                            st(o.ring)?,
                            comp,
                            o.selected.map_or(Arg::Ptr(0), v),
                            Arg::Ptr(sinks),
                            v(o.out),
                            Arg::U32(u(o.window)),
                            Arg::U32(u(ratio)),
                            Arg::U32(u(o.top_k)),
                            Arg::U32(u(o.n_head)),
                            Arg::U32(u(o.head_dim)),
                        ],
                    )?;
                }
                Op::RingWrite(o) => launch(
                    "ring_write",
                    Grid::Threads(per_token(u(o.dim))),
                    THREADS,
                    0,
                    vec![
                        v(o.kv),
                        st(o.ring)?,
                        Arg::U32(u(o.window)),
                        Arg::U32(u(o.dim)),
                    ],
                )?,
                Op::Compress(o) => {
                    let hd = o.head_dim;
                    if o.width() > 1024
                        || (o.rounding == RowRounding::HadamardFp4F16 && !hd.is_power_of_two())
                    {
                        return Err(unsupported(format!("compressor of width {}", o.width())));
                    }
                    let ape = weights.small_f32(file, &o.ape)?;
                    let norm = weights.small_f32(file, &o.norm)?;
                    let f = freqs(freq_map, &o.rope)?;
                    let rounding = match o.rounding {
                        RowRounding::None => 0,
                        RowRounding::Fp8F16 => 1,
                        RowRounding::HadamardFp4F16 => 2,
                    };
                    launch(
                        "compress",
                        Grid::Blocks(fixed(1), fixed(1)),
                        1024,
                        0,
                        vec![
                            v(o.kv),
                            v(o.gate),
                            Arg::Ptr(ape),
                            Arg::Ptr(norm),
                            st(o.state_kv)?,
                            st(o.state_score)?,
                            st(o.rows)?,
                            Arg::Ptr(f),
                            Arg::U32(u(o.ratio)),
                            Arg::U32(u(hd)),
                            Arg::U32(o.overlapped as u32),
                            Arg::U32(u(o.rope.n_rot)),
                            Arg::U32(rounding),
                            Arg::F32(o.eps),
                        ],
                    )?;
                }
                Op::IndexerTopK(o) => {
                    let max_rows = layout.get(o.rows).rows;
                    let blocks = u(graph.max_tokens).min(64);
                    let scratch = scratch(scratch_list, blocks as usize * max_rows.max(1) * 4)?;
                    launch(
                        "indexer_topk",
                        Grid::Blocks(fixed(blocks), fixed(1)),
                        256,
                        0,
                        vec![
                            v(o.q),
                            v(o.weights),
                            st(o.rows)?,
                            v(o.out),
                            Arg::Ptr(scratch),
                            Arg::U32(u(o.ratio)),
                            Arg::U32(u(o.top_k)),
                            Arg::U32(u(o.n_head)),
                            Arg::U32(u(o.head_dim)),
                            Arg::U32(u(max_rows)),
                        ],
                    )?;
                }
                Op::Router(o) => {
                    if o.n_expert > 1024 {
                        return Err(unsupported(format!(
                            "router over {} experts (at most 1024)",
                            o.n_expert
                        )));
                    }
                    let bias = match &o.bias {
                        Some(t) => weights.small_f32(file, t)?,
                        None => 0,
                    };
                    let (table, table_cols) = match &o.tid2eid {
                        Some(t) => (
                            weights.tensor(file, t, &mut progress)?,
                            o.table_cols() as u32,
                        ),
                        None => (0, 0),
                    };
                    launch(
                        "router",
                        Grid::Blocks(per_token(1), fixed(1)),
                        256,
                        0,
                        vec![
                            v(o.logits),
                            v(o.tokens),
                            Arg::Ptr(bias),
                            Arg::Ptr(table),
                            Arg::U32(table_cols),
                            v(o.selected),
                            v(o.weights),
                            Arg::U32(u(o.n_expert)),
                            Arg::U32(u(o.k)),
                            Arg::F32(o.scale),
                            Arg::U32(o.normalize as u32),
                        ],
                    )?;
                }
                Op::MoeExperts(o) => {
                    let crate::graph::ops::moe::ExpertDims {
                        dim: d,
                        hidden: ff,
                        n_expert,
                    } = o.dims();
                    if n_expert == 0 {
                        return Err(unsupported(format!("experts {d} × {ff}")));
                    }
                    let k = o.k;
                    let slots = graph.max_tokens * k;
                    let h = scratch(scratch_list, slots * ff * 4)?;
                    let y = scratch(scratch_list, slots * d * 4)?;
                    // A streamed layer reads its device slots through a slot-id
                    // selection (super::streaming).
                    let stream = streamed.get(&o.gate.offset);
                    let (n_ex, sel) = match stream {
                        Some(l) => {
                            let slot_sel = scratch(scratch_list, slots * 4)?;
                            pending = Some(super::streaming::StreamPoint {
                                first: 0,
                                sum: 0,
                                gate: o.gate.offset,
                                k,
                                n_expert,
                                selected: values[o.selected.0 as usize],
                                slot_sel,
                                hash: super::streaming::hash_of(graph, o),
                            });
                            (l.slots, Arg::Ptr(slot_sel))
                        }
                        None => (n_expert, v(o.selected)),
                    };
                    let wptr = |weights: &mut Weights,
                                progress: &mut Progress,
                                t: &TensorRef|
                     -> Result<CUdeviceptr, BackendError> {
                        match stream {
                            Some(l) => l.ptr(t).ok_or_else(|| {
                                unsupported(format!("streamed {} without slots", t.name))
                            }),
                            None => weights.tensor(file, t, progress),
                        }
                    };
                    let rows =
                        |weights: &mut Weights,
                         progress: &mut Progress,
                         t: &TensorRef,
                         n_in: usize,
                         n_out: usize,
                         x: Arg,
                         per_slot: u32,
                         dst: CUdeviceptr|
                         -> Result<(&'static str, Vec<Arg>), BackendError> {
                            let name = per_type("expert_rows_", t.ty)?;
                            let w = wptr(weights, progress, t)?;
                            let slab = t.n_bytes / n_expert as u64;
                            Ok((
                                name,
                                vec![
                                    Arg::Ptr(w),
                                    Arg::U32(u(t.row_bytes())),
                                    Arg::U64(slab),
                                    Arg::U32(u(n_ex)),
                                    Arg::U32(u(n_in)),
                                    Arg::U32(u(n_out)),
                                    x,
                                    Arg::U32(per_slot),
                                    sel,
                                    Arg::U32(u(k)),
                                    Arg::Ptr(dst),
                                ],
                            ))
                        };
                    let grid =
                        |n_out: usize| Grid::Blocks(fixed(u(n_out).div_ceil(8)), per_token(u(k)));
                    if o.gate_up_alike() {
                        // One launch reads both rows and writes the weighted,
                        // clamped SwiGLU product (cuda/moe.cu expert_gate_up_*).
                        let name = per_type("expert_gate_up_", o.gate.ty)?;
                        let gw = wptr(weights, &mut progress, &o.gate)?;
                        let uw = wptr(weights, &mut progress, &o.up)?;
                        launch(
                            name,
                            grid(ff),
                            THREADS,
                            0,
                            vec![
                                Arg::Ptr(gw),
                                Arg::Ptr(uw),
                                Arg::U32(u(o.gate.row_bytes())),
                                Arg::U64(o.gate.n_bytes / n_expert as u64),
                                Arg::U32(u(n_ex)),
                                Arg::U32(u(d)),
                                Arg::U32(u(ff)),
                                v(o.x),
                                sel,
                                v(o.weights),
                                Arg::U32(u(k)),
                                Arg::F32(o.clamp),
                                Arg::Ptr(h),
                            ],
                        )?;
                    } else {
                        let g = scratch(scratch_list, slots * ff * 4)?;
                        let up = scratch(scratch_list, slots * ff * 4)?;
                        let (name, args) =
                            rows(weights, &mut progress, &o.gate, d, ff, v(o.x), 0, g)?;
                        launch(name, grid(ff), THREADS, 0, args)?;
                        let (name, args) =
                            rows(weights, &mut progress, &o.up, d, ff, v(o.x), 0, up)?;
                        launch(name, grid(ff), THREADS, 0, args)?;
                        launch(
                            "expert_swiglu",
                            Grid::Threads(per_token(u(k * ff))),
                            THREADS,
                            0,
                            vec![
                                Arg::Ptr(g),
                                Arg::Ptr(up),
                                v(o.weights),
                                Arg::Ptr(h),
                                Arg::U32(u(ff)),
                                Arg::U32(u(k)),
                                Arg::F32(o.clamp),
                            ],
                        )?;
                    }
                    let (name, args) =
                        rows(weights, &mut progress, &o.down, ff, d, Arg::Ptr(h), 1, y)?;
                    launch(name, grid(d), THREADS, 0, args)?;
                    launch(
                        "expert_sum",
                        Grid::Threads(per_token(u(d))),
                        THREADS,
                        0,
                        vec![Arg::Ptr(y), v(o.out), Arg::U32(u(d)), Arg::U32(u(k))],
                    )?;
                }
                Op::SwiGlu(o) => launch(
                    "swiglu_clamped",
                    Grid::Threads(per_token(u(o.cols))),
                    THREADS,
                    0,
                    vec![
                        v(o.gate),
                        v(o.up),
                        v(o.out),
                        Arg::F32(o.clamp),
                        Arg::U32(u(o.cols)),
                    ],
                )?,
                Op::Add(o) => launch(
                    "add",
                    Grid::Threads(per_token(u(o.cols))),
                    THREADS,
                    0,
                    vec![v(o.a), v(o.b), v(o.out), Arg::U32(u(o.cols))],
                )?,
                Op::Scale(o) => launch(
                    "scale",
                    Grid::Threads(per_token(u(o.cols))),
                    THREADS,
                    0,
                    vec![v(o.x), v(o.out), Arg::F32(o.factor), Arg::U32(u(o.cols))],
                )?,
                Op::TakeLast(o) => launch(
                    "take_last",
                    Grid::Threads(fixed(u(o.cols))),
                    THREADS,
                    0,
                    vec![v(o.x), v(o.out), Arg::U32(u(o.cols))],
                )?,
                // One state set: every row is state 0 (a null row-state array);
                // several: the step's row states, uploaded by `run_step`.
                Op::GatherLast(o) => launch(
                    "gather_last",
                    Grid::Threads(fixed(u(o.states * o.cols))),
                    THREADS,
                    0,
                    vec![
                        v(o.x),
                        v(o.out),
                        Arg::Ptr(if states.len() > 1 { row_states } else { 0 }),
                        Arg::U32(u(o.cols)),
                        Arg::U32(u(o.states)),
                    ],
                )?,
                Op::V41(o) => v41::V41Cx {
                    list: &mut list,
                    file,
                    weights,
                    states: &states[set],
                    layout,
                    freqs: freq_map,
                    values,
                    scratch: scratch_list,
                    max_tokens: graph.max_tokens,
                }
                .record(o)?,
            }
            if let Some(mut p) = pending {
                // The pass's launches: rows from `before`, the sum last.
                p.first = before;
                p.sum = list.out.len() - 1;
                points.push(p);
            }
            if per_session {
                for l in &mut list.out[before..] {
                    l.set = Some(set);
                }
            }
        }
    }
    progress.finish();
    Ok(list.out)
}

fn per_type(prefix: &str, ty: GgmlType) -> Result<&'static str, BackendError> {
    let s = type_suffix(ty).ok_or_else(|| unsupported(format!("weights of type {ty:?}")))?;
    super::kernels::static_name(&format!("{prefix}{s}"))
        .ok_or_else(|| unsupported(format!("kernel {prefix}{s}")))
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
