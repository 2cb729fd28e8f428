//! Backends execute recorded graphs. One small trait over the whole graph:
//! load a graph, run a step, read and write values and state rows.
//! [`open`] builds the backend a [`BackendKind`] names.

pub mod bandwidth;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod experts;
pub mod kernels;
pub mod options;
pub mod wgpu;

pub use options::BackendOptions;

use std::ops::Range;
use std::sync::Arc;

use thiserror::Error;

use crate::gguf::GgufFile;
use crate::graph::{Graph, RowRecord, Segment, StateId, StateLayout, StepParams, ValueId};

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("backend {backend} is not available: {reason}")]
    Unavailable { backend: String, reason: String },
    #[error("{backend} cannot run {what}")]
    Unsupported { backend: String, what: String },
    /// A step of no tokens, more than the graph holds, or a token list
    /// whose length is not the step's token count.
    #[error("bad step: {n_tokens} tokens ({given} ids given) for a graph of at most {capacity}")]
    BadStep {
        n_tokens: usize,
        given: usize,
        capacity: usize,
    },
    /// A row table a batched step cannot take (see [`crate::graph::segments`]).
    #[error("bad step rows: {0}")]
    BadRows(String),
    #[error("state {state}: {msg}")]
    State { state: String, msg: String },
    #[error("value {value}: {msg}")]
    Value { value: String, msg: String },
    /// A device error reported by the driver (validation, out of memory, lost).
    #[error("{device}: {msg}")]
    Device { device: String, msg: String },
    #[error("unknown graph handle {0}")]
    UnknownGraph(usize),
    #[error("backend {0:?} is unknown (auto, cpu, cpu-ref, wgpu, cuda; aliases metal, vulkan)")]
    UnknownKind(String),
    /// Streamed weights (`--ssd-streaming`): a read that failed or fell
    /// short (file and offset named), a file changed on disk, a budget
    /// that cannot work.
    #[error("{0}")]
    Weights(String),
}

/// Which backend runs the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// A real GPU through wgpu if there is one, else the CPU (one-line notice).
    Auto,
    /// The fast CPU backend: quantised activations, integer SIMD kernels
    /// ([`BackendOptions::cpu_isa`] forces a path).
    Cpu,
    /// The CPU reference backend (f32, dequantise-then-dot): the oracle.
    CpuRef,
    /// wgpu on the adapter [`BackendOptions::wgpu_adapter`] names, else the best one
    /// (CPU emulators such as lavapipe included).
    Wgpu,
    Cuda,
}

impl BackendKind {
    pub fn parse(s: &str) -> Result<BackendKind, BackendError> {
        match s {
            "auto" => Ok(BackendKind::Auto),
            "cpu" => Ok(BackendKind::Cpu),
            "cpu-ref" => Ok(BackendKind::CpuRef),
            "wgpu" | "metal" | "vulkan" => Ok(BackendKind::Wgpu),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(BackendError::UnknownKind(other.to_string())),
        }
    }
}

/// A graph loaded into a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphHandle(pub usize);

pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// The device in one line (`cpu`, or the adapter's name and API).
    fn device(&self) -> String {
        self.name().to_string()
    }

    /// The persistent state this backend holds (lengths of every state).
    fn state_layout(&self) -> &StateLayout;

    /// Prepares a recorded graph (memory plan, uploads, pipelines).
    fn load_graph(&mut self, graph: Arc<Graph>) -> Result<GraphHandle, BackendError>;

    /// Runs one step: `tokens` are the step's token ids.
    fn run(
        &mut self,
        g: GraphHandle,
        tokens: &[u32],
        params: StepParams,
    ) -> Result<(), BackendError>;

    /// Reads back the live rows of a value after a step (logits, dumps); i32
    /// values come back as f32 numbers.
    fn read_value(&self, g: GraphHandle, v: ValueId) -> Result<Vec<f32>, BackendError> {
        self.read_value_rows(g, v, 0..usize::MAX)
    }

    /// Reads back rows `rows` of a value's live rows after a step (clamped
    /// to them): only those rows cross to the host (the MTP drafter keeps
    /// the last window's target states of a 2,048-row prefill chunk).
    fn read_value_rows(
        &self,
        g: GraphHandle,
        v: ValueId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError>;

    /// Writes the first `data.len()` elements of a value (i32 values given as
    /// f32 numbers), for one-op tests that feed a graph's inputs directly.
    fn write_value(&mut self, g: GraphHandle, v: ValueId, data: &[f32])
        -> Result<(), BackendError>;

    /// Reads rows `rows` of a persistent state buffer (of state set 0).
    fn read_state_rows(&self, s: StateId, rows: Range<usize>) -> Result<Vec<f32>, BackendError> {
        self.read_set_rows(0, s, rows)
    }

    /// Writes whole rows of a state buffer starting at row `first` (of
    /// state set 0).
    fn write_state_rows(
        &mut self,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        self.write_set_rows(0, s, first, data)
    }

    /// Reads a whole state buffer (its length comes from the layout).
    fn read_state(&self, s: StateId) -> Result<Vec<f32>, BackendError> {
        let rows = state_desc(self.state_layout(), s)?.rows;
        self.read_state_rows(s, 0..rows)
    }

    /// Writes a whole state buffer.
    fn write_state(&mut self, s: StateId, data: &[f32]) -> Result<(), BackendError> {
        let d = state_desc(self.state_layout(), s)?;
        if data.len() != d.rows * d.cols {
            return Err(BackendError::State {
                state: d.name.to_string(),
                msg: format!("{} values given, {} expected", data.len(), d.rows * d.cols),
            });
        }
        self.write_state_rows(s, 0, data)
    }

    /// Puts every state buffer back to its fresh value.
    fn reset_states(&mut self);

    /// The routed-expert cache when this backend streams experts
    /// (`--ssd-streaming`): its start-up line and counters.
    fn expert_cache(&self) -> Option<Arc<experts::ExpertCache>> {
        None
    }

    /// Session states (KV slots) this backend holds, each a whole copy of
    /// the layout; the `Backend` methods above address set 0.
    fn state_sets(&self) -> usize {
        1
    }

    /// Holds `n` fresh state sets, so one step can carry the rows of `n`
    /// sessions ([`Backend::run_rows`]). Backends with one set refuse `n > 1`.
    fn set_state_sets(&mut self, n: usize) -> Result<(), BackendError> {
        if n == 1 {
            Ok(())
        } else {
            Err(BackendError::Unsupported {
                backend: self.name().into(),
                what: format!("{n} sessions in one step"),
            })
        }
    }

    /// Runs one step whose row `t` is at position `rows[t].pos` of session
    /// `rows[t].state` (each session's rows one block of consecutive
    /// positions). The default runs a single-session table with [`Backend::run`].
    fn run_rows(
        &mut self,
        g: GraphHandle,
        tokens: &[u32],
        rows: &[RowRecord],
    ) -> Result<(), BackendError> {
        let segs =
            crate::graph::segments(rows, self.state_sets()).map_err(BackendError::BadRows)?;
        match segs[..] {
            [Segment {
                pos0, n, state: 0, ..
            }] => self.run(g, tokens, StepParams { pos0, n_tokens: n }),
            _ => Err(BackendError::Unsupported {
                backend: self.name().into(),
                what: "rows of several sessions in one step".into(),
            }),
        }
    }

    /// Reads rows `rows` of state buffer `s` of state set `set`.
    fn read_set_rows(
        &self,
        set: usize,
        s: StateId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError>;

    /// Writes whole rows of state buffer `s` of state set `set`, from row
    /// `first`.
    fn write_set_rows(
        &mut self,
        set: usize,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError>;

    /// Puts state set `set` back to its fresh value.
    fn reset_set(&mut self, set: usize) -> Result<(), BackendError>;
}

/// Checks a step against the graph it runs: at least one token, at most the
/// graph's capacity, and one id per token. Every backend calls it first.
pub fn check_step(graph: &Graph, tokens: &[u32], p: &StepParams) -> Result<(), BackendError> {
    if p.n_tokens == 0 || p.n_tokens > graph.max_tokens || tokens.len() != p.n_tokens {
        return Err(BackendError::BadStep {
            n_tokens: p.n_tokens,
            given: tokens.len(),
            capacity: graph.max_tokens,
        });
    }
    Ok(())
}

/// Checks a batched step's row table against the graph and the state sets:
/// one row per token, within capacity, each session's rows one block of
/// consecutive positions. Returns the step's segments.
pub fn check_rows(
    graph: &Graph,
    tokens: &[u32],
    rows: &[RowRecord],
    n_sets: usize,
) -> Result<Vec<Segment>, BackendError> {
    let n = rows.len();
    if n == 0 || n > graph.max_tokens || tokens.len() != n {
        return Err(BackendError::BadStep {
            n_tokens: n,
            given: tokens.len(),
            capacity: graph.max_tokens,
        });
    }
    crate::graph::segments(rows, n_sets).map_err(BackendError::BadRows)
}

/// The layout entry of `s`, or an error for an id outside it.
pub fn state_desc(
    layout: &StateLayout,
    s: StateId,
) -> Result<&crate::graph::StateDesc, BackendError> {
    layout.states.get(s.0 as usize).ok_or(BackendError::State {
        state: format!("#{}", s.0),
        msg: "no such state".into(),
    })
}

/// Checks a row-range access against the layout; returns the element range.
pub fn state_range(
    layout: &StateLayout,
    s: StateId,
    first: usize,
    n_values: Option<usize>,
    rows: Option<Range<usize>>,
) -> Result<Range<usize>, BackendError> {
    let d = state_desc(layout, s)?;
    let err = |msg: String| BackendError::State {
        state: d.name.to_string(),
        msg,
    };
    let (start, end) = match (rows, n_values) {
        (Some(r), _) => (r.start, r.end),
        (None, Some(n)) => {
            if n % d.cols != 0 {
                return Err(err(format!("{n} values are not whole rows of {}", d.cols)));
            }
            (first, first + n / d.cols)
        }
        (None, None) => (first, d.rows),
    };
    if start > end || end > d.rows {
        return Err(err(format!("rows {start}..{end} outside 0..{}", d.rows)));
    }
    Ok(start * d.cols..end * d.cols)
}

/// Where a backend reads weights from: a whole model, or a bare GGUF file
/// (one-op tests build a backend from a file of a few tensors).
pub type WeightFile = Arc<dyn AsRef<GgufFile> + Send + Sync>;

/// A backend and the one line saying what was picked.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    pub notice: String,
}

/// Builds the backend `kind` names over `file` with the session state
/// `layout`, as `opts` says: the one switchboard for every backend, with or
/// without SSD streaming. `Auto` takes a real GPU through wgpu when there
/// is one, then CUDA (when built with it and present), then the fast CPU
/// backend; the notice says what was picked and why. With
/// `opts.ssd_streaming` the routed experts are then streamed from disk
/// through an [`experts::ExpertCache`]: the CPU backends read from the
/// cache, wgpu and CUDA keep the cached experts in device slots
/// (docs/SSD_STREAMING.md).
pub fn open(
    kind: BackendKind,
    file: WeightFile,
    layout: StateLayout,
    opts: &BackendOptions,
) -> Result<Opened, BackendError> {
    let (built, auto) = match kind {
        BackendKind::CpuRef => (
            Built::Cpu(cpu::CpuBackend::new(file.clone(), layout).with_profile(opts.cpu_profile)),
            String::new(),
        ),
        BackendKind::Cpu => (
            Built::Cpu(fast_cpu(file.clone(), layout, opts)?),
            String::new(),
        ),
        BackendKind::Wgpu => (
            Built::Wgpu(self::wgpu::WgpuBackend::open(
                opts,
                true,
                file.clone(),
                layout,
            )?),
            String::new(),
        ),
        BackendKind::Cuda => (open_cuda(file.clone(), layout, opts)?, String::new()),
        BackendKind::Auto => auto(file.clone(), layout, opts)?,
    };
    let Some(so) = &opts.ssd_streaming else {
        let notice = format!("backend: {}{auto}", built.describe());
        return Ok(Opened {
            backend: built.boxed(),
            notice,
        });
    };
    let on_device = !matches!(built, Built::Cpu(_));
    let open = if on_device {
        experts::ExpertCache::open_for_device
    } else {
        experts::ExpertCache::open
    };
    let cache = Arc::new(open((*file).as_ref(), so).map_err(BackendError::Weights)?);
    let backend = built.with_experts(cache, so.policy).boxed();
    let notice = format!(
        "backend: {}{auto}, experts streamed from disk{}",
        backend_line(backend.as_ref()),
        if on_device { " into device slots" } else { "" }
    );
    Ok(Opened { backend, notice })
}

/// A backend before it is boxed: what `open` may still configure.
enum Built {
    Cpu(cpu::CpuBackend),
    Wgpu(self::wgpu::WgpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaBackend),
}

impl Built {
    fn with_experts(
        self,
        cache: Arc<experts::ExpertCache>,
        policy: options::EvictionPolicy,
    ) -> Built {
        match self {
            Built::Cpu(b) => Built::Cpu(b.with_experts(cache)),
            Built::Wgpu(b) => Built::Wgpu(b.with_experts(cache, policy)),
            #[cfg(feature = "cuda")]
            Built::Cuda(b) => Built::Cuda(b.with_experts(cache, policy)),
        }
    }

    fn boxed(self) -> Box<dyn Backend> {
        match self {
            Built::Cpu(b) => Box::new(b),
            Built::Wgpu(b) => Box::new(b),
            #[cfg(feature = "cuda")]
            Built::Cuda(b) => Box::new(b),
        }
    }

    fn describe(&self) -> String {
        match self {
            Built::Cpu(b) => backend_line(b),
            Built::Wgpu(b) => backend_line(b),
            #[cfg(feature = "cuda")]
            Built::Cuda(b) => backend_line(b),
        }
    }
}

/// `cpu-ref`, the fast CPU's kernels and threads, or `wgpu on …`/`cuda on …`.
fn backend_line(b: &dyn Backend) -> String {
    match b.name() {
        "cpu-ref" => "cpu-ref".into(),
        "wgpu" | "cuda" => format!("{} on {}", b.name(), b.device()),
        _ => b.device(),
    }
}

/// The `Auto` policy: a real GPU adapter through wgpu, else CUDA, else the
/// fast CPU backend; with the note the notice carries.
fn auto(
    file: WeightFile,
    layout: StateLayout,
    opts: &BackendOptions,
) -> Result<(Built, String), BackendError> {
    let e = match self::wgpu::WgpuBackend::open(opts, false, file.clone(), layout.clone()) {
        Ok(b) => return Ok((Built::Wgpu(b), " (auto)".into())),
        Err(e) => e,
    };
    let ce = match open_cuda(file.clone(), layout.clone(), opts) {
        Ok(b) => return Ok((b, " (auto)".into())),
        Err(ce) => ce,
    };
    let b = fast_cpu(file, layout, opts)?;
    Ok((
        Built::Cpu(b),
        format!(" (auto; wgpu not used: {e}; cuda not used: {ce})"),
    ))
}

/// The CUDA backend on `opts.cuda_device` (default 0); a clear error when
/// the binary was built without the `cuda` feature or there is no driver,
/// device or NVRTC.
#[cfg(feature = "cuda")]
fn open_cuda(
    file: WeightFile,
    layout: StateLayout,
    opts: &BackendOptions,
) -> Result<Built, BackendError> {
    Ok(Built::Cuda(cuda::CudaBackend::open(file, layout, opts)?))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    _file: WeightFile,
    _layout: StateLayout,
    _opts: &BackendOptions,
) -> Result<Built, BackendError> {
    Err(BackendError::Unavailable {
        backend: "cuda".into(),
        reason: "this binary was built without CUDA support (cargo build --features cuda); use --backend cpu or wgpu".into(),
    })
}

/// CUDA devices, one line each (`ds4 --list-devices`); the reason when
/// there are none or the binary was built without CUDA.
pub fn cuda_device_lines() -> Result<Vec<String>, BackendError> {
    #[cfg(feature = "cuda")]
    {
        Ok(cuda::list_devices()?.iter().map(|d| d.line()).collect())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(BackendError::Unavailable {
            backend: "cuda".into(),
            reason: "built without the cuda feature".into(),
        })
    }
}

/// The fast CPU backend on the path `opts.cpu_isa` names, else the best one.
fn fast_cpu(
    file: WeightFile,
    layout: StateLayout,
    opts: &BackendOptions,
) -> Result<cpu::CpuBackend, BackendError> {
    let isa = cpu::fast::Isa::choose(opts.cpu_isa.as_deref()).map_err(|reason| {
        BackendError::Unavailable {
            backend: "cpu".into(),
            reason,
        }
    })?;
    let kernels = cpu::fast::Kernels::new(isa).ok_or_else(|| BackendError::Unavailable {
        backend: "cpu".into(),
        reason: format!(
            "the {} kernels need CPU features this machine lacks",
            isa.name()
        ),
    })?;
    Ok(cpu::CpuBackend::fast(file, layout, kernels).with_profile(opts.cpu_profile))
}

/// `rows` clamped to the `live` rows a value holds after a step.
pub(crate) fn clamp_rows(rows: Range<usize>, live: usize) -> Range<usize> {
    let end = rows.end.min(live);
    rows.start.min(end)..end
}
