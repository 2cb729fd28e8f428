//! The launches of each kernel family, one file per `cuda/<family>.cu`
//! (as ggml's `norm.cu` holds its launch beside its kernel): each op's
//! function checks what its kernel supports, gets its weights and scratch,
//! and appends its launches with typed arguments ([`launch!`]) to the list
//! `record.rs` builds.
//!
//! A launch's arguments are the kernel's parameters in order, each given
//! as what it is: a [`ValueId`] or [`StateId`] (resolved to its device
//! address), a device pointer ([`Dev`]), a `usize`, `u32` or `bool` (a
//! `u32` parameter), an `f32`, a `u64`. The step pointer is appended last,
//! as every kernel takes it.

use std::collections::HashMap;

use cudarc::driver::sys::{CUdeviceptr, CUfunction};

use super::kernels::Kernel;
use super::mem::DevBuf;
use super::streaming::{StreamPoint, StreamedLayer};
use super::weights::{Progress, Weights};
use crate::backend::BackendError;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::{Graph, StateId, StateLayout, ValueId};

pub mod attention;
pub mod candidate;
pub mod compress;
pub mod elementwise;
pub mod embed;
pub mod engram;
pub mod gather;
pub mod hc;
pub mod hc_mix;
pub mod indexer;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod ring;
pub mod rope;
pub mod round;
pub mod router;
pub mod source_compress;

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

/// A device address (a weight, a scratch buffer, a table); [`Dev::NULL`]
/// where a kernel takes no such input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dev(pub CUdeviceptr);

impl Dev {
    pub const NULL: Dev = Dev(0);
}

/// A typed kernel argument (see the module docs).
pub trait KernelArg {
    fn arg(self, cx: &Cx<'_>) -> Result<Arg, BackendError>;
}

impl KernelArg for ValueId {
    fn arg(self, cx: &Cx<'_>) -> Result<Arg, BackendError> {
        Ok(Arg::Ptr(cx.value(self)))
    }
}

/// A null pointer for an absent value.
impl KernelArg for Option<ValueId> {
    fn arg(self, cx: &Cx<'_>) -> Result<Arg, BackendError> {
        Ok(Arg::Ptr(self.map_or(0, |v| cx.value(v))))
    }
}

/// This launch's set's copy of the state.
impl KernelArg for StateId {
    fn arg(self, cx: &Cx<'_>) -> Result<Arg, BackendError> {
        cx.states
            .get(self.0 as usize)
            .map(|d| Arg::Ptr(d.ptr))
            .ok_or_else(|| unsupported(format!("state #{} outside the layout", self.0)))
    }
}

/// A null pointer for an absent state.
impl KernelArg for Option<StateId> {
    fn arg(self, cx: &Cx<'_>) -> Result<Arg, BackendError> {
        match self {
            Some(s) => s.arg(cx),
            None => Ok(Arg::Ptr(0)),
        }
    }
}

/// Arguments passed by value: a device pointer, a `u32` parameter (from a
/// `usize`, `u32` or `bool`), an `f32`, a `u64`.
macro_rules! by_value {
    ($($t:ty => |$v:ident| $arg:expr),* $(,)?) => {$(
        impl KernelArg for $t {
            fn arg(self, _: &Cx<'_>) -> Result<Arg, BackendError> {
                let $v = self;
                Ok($arg)
            }
        }
    )*};
}

by_value! {
    Dev => |d| Arg::Ptr(d.0),
    usize => |v| Arg::U32(v as u32),
    u32 => |v| Arg::U32(v),
    bool => |v| Arg::U32(v as u32),
    f32 => |v| Arg::F32(v),
    u64 => |v| Arg::U64(v),
}

/// `launch!(cx, kernel, grid, block, shared; args…)`: appends a launch of
/// `kernel` (an `Entry`, or a per-type `Kernel`) whose parameters are the
/// typed `args` in order, then the step pointer.
macro_rules! launch {
    ($cx:expr, $kernel:expr, $grid:expr, $block:expr, $shared:expr; $($a:expr),* $(,)?) => {{
        let args = vec![$($crate::backend::cuda::launch::KernelArg::arg($a, &*$cx)?),*];
        $cx.launch($kernel, $grid, $block, $shared, args)
    }};
}
pub(crate) use launch;

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

/// `k` per token.
pub const fn per_token(k: usize) -> Count {
    Count {
        per_token: k as u32,
        div: 1,
        fixed: 0,
    }
}

/// One per `div` tokens (rounded up).
pub const fn per_tokens(div: u32) -> Count {
    Count {
        per_token: 1,
        div,
        fixed: 0,
    }
}

/// `k` whatever the token count.
pub const fn fixed(k: usize) -> Count {
    Count {
        per_token: 0,
        div: 1,
        fixed: k as u32,
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

pub(super) fn unsupported(what: String) -> BackendError {
    BackendError::Unsupported {
        backend: "cuda".into(),
        what,
    }
}

/// `Ok` when the kernel supports the op (`ok`), else an `Unsupported`
/// error saying `what` it was asked.
pub(super) fn supported(ok: bool, what: impl FnOnce() -> String) -> Result<(), BackendError> {
    if ok {
        Ok(())
    } else {
        Err(unsupported(what()))
    }
}

/// A device allocation kept in `list` (the graph's scratch).
pub fn scratch(list: &mut Vec<DevBuf>, bytes: usize) -> Result<CUdeviceptr, BackendError> {
    let b = DevBuf::alloc(bytes)?;
    let p = b.ptr;
    list.push(b);
    Ok(p)
}

/// What one op's launches read and fill: the backend's fields and the
/// graph's, borrowed for the op (and, for a per-session op, one state set).
pub struct Cx<'a> {
    pub file: &'a GgufFile,
    pub graph: &'a Graph,
    pub funcs: &'a HashMap<&'static str, CUfunction>,
    pub weights: &'a mut Weights,
    pub progress: &'a mut Progress,
    /// The state buffers of this launch's set.
    pub states: &'a [DevBuf],
    pub layout: &'a StateLayout,
    /// Rope frequencies on the device, once per configuration.
    pub freqs: &'a mut HashMap<String, DevBuf>,
    /// Device address of every value.
    pub values: &'a [CUdeviceptr],
    /// Scratch allocations of the graph (kept alive with it).
    pub scratch: &'a mut Vec<DevBuf>,
    /// The `Step` the launches read (a per-session op's: its set's).
    pub step: CUdeviceptr,
    /// The step's per-row state set (u32 per row), or 0 (a null array:
    /// every row is set 0) when one set is held.
    pub row_states: CUdeviceptr,
    /// Record the tensor-core prefill matmul (sm_80+, opt-in).
    pub tensor_cores: bool,
    /// Streamed layers' device slots (`--ssd-streaming`), by `gate` offset.
    pub streamed: &'a HashMap<u64, StreamedLayer>,
    /// The streamed routed pass this op records, if any (`record.rs` fills
    /// in where its launches sit).
    pub pending: Option<StreamPoint>,
    pub out: &'a mut Vec<Launch>,
}

impl Cx<'_> {
    /// Device address of value `v`.
    pub fn value(&self, v: ValueId) -> CUdeviceptr {
        self.values[v.0 as usize]
    }

    /// The most tokens a step of the graph has.
    pub fn max_tokens(&self) -> usize {
        self.graph.max_tokens
    }

    /// A matrix or table as stored (uploaded or mapped once).
    pub fn tensor(&mut self, t: &TensorRef) -> Result<Dev, BackendError> {
        Ok(Dev(self.weights.tensor(self.file, t, self.progress)?))
    }

    /// A small tensor widened to f32 (once).
    pub fn small(&mut self, t: &TensorRef) -> Result<Dev, BackendError> {
        Ok(Dev(self.weights.small_f32(self.file, t)?))
    }

    /// [`Cx::small`], or [`Dev::NULL`] for an absent tensor.
    pub fn small_opt(&mut self, t: &Option<TensorRef>) -> Result<Dev, BackendError> {
        match t {
            Some(t) => self.small(t),
            None => Ok(Dev::NULL),
        }
    }

    /// Scratch of `bytes` kept with the graph.
    pub fn scratch(&mut self, bytes: usize) -> Result<Dev, BackendError> {
        Ok(Dev(scratch(self.scratch, bytes)?))
    }

    /// Rope frequencies (ops::rope::frequencies, f64) on the device, once
    /// per configuration.
    pub fn freqs(&mut self, r: &crate::graph::ops::rope::RopeConfig) -> Result<Dev, BackendError> {
        let key = format!("{r:?}");
        if let Some(b) = self.freqs.get(&key) {
            return Ok(Dev(b.ptr));
        }
        let f = crate::graph::ops::rope::frequencies(r);
        let b = DevBuf::from_bytes(bytemuck::cast_slice(&f))?;
        let p = b.ptr;
        self.freqs.insert(key, b);
        Ok(Dev(p))
    }

    /// Appends a launch of `kernel` with `args` (the step pointer added).
    pub fn launch(
        &mut self,
        kernel: impl Into<Kernel>,
        grid: Grid,
        block: u32,
        shared: u32,
        mut args: Vec<Arg>,
    ) -> Result<(), BackendError> {
        let kernel = kernel.into().name().map_err(unsupported)?;
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
    pub fn only_for(&mut self, tokens: std::ops::RangeInclusive<u32>) {
        if let Some(l) = self.out.last_mut() {
            l.tokens = tokens;
        }
    }
}
