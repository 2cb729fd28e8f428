//! The CUDA backend (feature `cuda`): the recorded graph runs as CUDA C++
//! kernels (`cuda/<family>.cu`, the same families as `shaders/`), compiled
//! to PTX by NVRTC for the device at start-up and cached on disk; the driver
//! is loaded at run time by cudarc, so a binary built with the feature runs
//! (and falls back cleanly) on machines without a GPU.
//!
//! `load_graph` plans memory ([`crate::graph::plan`]: one arena, values at
//! 256-byte aligned offsets) and turns the tape into a launch list once. A
//! step writes the token ids and the [`StepDev`] parameters to device
//! memory, then launches the list; a small graph (decode, MTP draft) is
//! captured into a CUDA graph on its first step and replayed afterwards, so a
//! decode step costs one graph launch. See docs/CUDA.md.

pub mod bandwidth;
pub mod device;
pub mod kernels;
pub mod launch;
pub mod mem;
pub mod modules;
pub mod nvrtc;
pub mod record;
pub mod streaming;
pub mod weights;

use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};

pub use device::{list_devices, DeviceInfo};

use super::{
    clamp_rows, state_range, Backend, BackendError, BackendOptions, GraphHandle, WeightFile,
};
use crate::graph::{plan, DType, Graph, Segment, StateId, StateLayout, StepParams, ValueId};
use device::Device;
use launch::{Launch, THREADS};
use mem::{checked, download, upload, upload_async, DevBuf};
use modules::Modules;

/// Per-step parameters in device memory (twin of `struct Step` in
/// cuda/common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable, Default)]
pub struct StepDev {
    pub pos0: u32,
    pub n_tokens: u32,
    /// First row of these tokens in the step's activations (0 in the
    /// step-wide parameters; a session's first row in its set's).
    pub row0: u32,
    pub _pad: u32,
}

/// Graphs up to this many tokens are captured into a CUDA graph (decode and
/// draft steps); larger ones (prefill) launch their list directly with grids
/// sized for the step. `DS4_CUDA_GRAPH=0` turns capture off.
pub const CAPTURE_MAX_TOKENS: usize = 16;

/// Slot alignment in the activation arena (float4 loads, coalescing).
const ALIGN: usize = 256;

struct Captured {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

struct LoadedGraph {
    graph: Arc<Graph>,
    _arena: DevBuf,
    values: Vec<CUdeviceptr>,
    _scratch: Vec<DevBuf>,
    launches: Vec<Launch>,
    captured: Option<Captured>,
    n_tokens: usize,
    /// The streamed layers' routed passes in `launches` (`--ssd-streaming`).
    points: Vec<streaming::StreamPoint>,
    /// Device u32 per row: the step's state set of each row.
    row_states: CUdeviceptr,
}

pub struct CudaBackend {
    // Field order matters for drop: graphs and buffers before the modules
    // and the context.
    graphs: Vec<LoadedGraph>,
    /// Routed experts streamed through this cache (`--ssd-streaming`): the
    /// streamed layers' slots by their `gate` tensor's file offset, the
    /// slices pinned for the pass being enqueued, the slots' policy.
    experts: Option<Arc<super::experts::ExpertCache>>,
    streamed: HashMap<u64, streaming::StreamedLayer>,
    staged: Option<Arc<super::experts::Pinned>>,
    stream_policy: super::options::EvictionPolicy,
    /// `sets[set][state]`: one copy of the state buffers per session.
    sets: Vec<Vec<DevBuf>>,
    /// The step-wide parameters every launch over all rows reads.
    step: DevBuf,
    /// Per state set: the parameters of its per-session launches.
    set_steps: Vec<DevBuf>,
    freqs: HashMap<String, DevBuf>,
    weights: weights::Weights,
    modules: Modules,
    file: WeightFile,
    layout: StateLayout,
    use_graphs: bool,
    /// Prefill matmuls on tensor cores (`mma_*`): opt-in (`DS4_CUDA_MMA=1`)
    /// until a GPU run has checked them; sm_80+ only.
    tensor_cores: bool,
    description: String,
    dev: Device,
}

// SAFETY: driver handles are used from one thread at a time (`&mut self` or
// `&self` of a backend that is not Sync), with the context bound first.
unsafe impl Send for CudaBackend {}

fn unsupported(what: String) -> BackendError {
    BackendError::Unsupported {
        backend: "cuda".into(),
        what,
    }
}

/// What recording a graph gives: its launches, its scratch, its streamed
/// passes and the device address of its row-state buffer.
type Recorded = (
    Vec<Launch>,
    Vec<DevBuf>,
    Vec<streaming::StreamPoint>,
    CUdeviceptr,
);

impl CudaBackend {
    /// Opens device `opts.cuda_device` (default 0), compiles or loads the
    /// kernels for it, allocates the state. Errors say plainly why CUDA is
    /// not usable (no driver, no device, no NVRTC).
    pub fn open(
        file: WeightFile,
        layout: StateLayout,
        opts: &BackendOptions,
    ) -> Result<CudaBackend, BackendError> {
        let ordinal = device::chosen_ordinal(opts)?;
        let dev = Device::open(ordinal)?;
        let modules = Modules::load(&dev, crate::backend::kernels::Family::ALL, opts)?;
        let (arch, nv_version) = (modules.arch, modules.nvrtc);
        let gf: &crate::gguf::GgufFile = (*file).as_ref();
        let weights = weights::Weights::new(gf, &dev.info, opts.cuda_weights.as_deref());
        let description = format!(
            "{} (sm_{}{}, {:.1} GiB, PTX compute_{arch} by NVRTC {}.{}; {})",
            dev.info.name,
            dev.info.cc.0,
            dev.info.cc.1,
            dev.info.total_mem as f64 / (1u64 << 30) as f64,
            nv_version.0,
            nv_version.1,
            weights.mode
        );
        let states = alloc_states(&layout)?;
        Ok(CudaBackend {
            graphs: Vec::new(),
            experts: None,
            streamed: HashMap::new(),
            staged: None,
            stream_policy: Default::default(),
            sets: vec![states],
            step: DevBuf::alloc(std::mem::size_of::<StepDev>())?,
            set_steps: vec![DevBuf::alloc(std::mem::size_of::<StepDev>())?],
            freqs: HashMap::new(),
            weights,
            modules,
            file,
            layout,
            use_graphs: opts.cuda_graph,
            tensor_cores: dev.info.cc_number() >= 80 && opts.cuda_mma,
            description,
            dev,
        })
    }

    /// Turns the tensor-core prefill matmul on or off for graphs loaded
    /// from now on (the default is `DS4_CUDA_MMA=1`); returns whether it is
    /// on (never below compute capability 8.0).
    pub fn set_tensor_cores(&mut self, on: bool) -> bool {
        // The tensor-core path is chosen by the whole step's row count, so
        // a session's rows would round differently beside other sessions:
        // not with several state sets.
        self.tensor_cores = on && self.dev.info.cc_number() >= 80 && self.sets.len() == 1;
        self.tensor_cores
    }

    /// Streams routed experts through `cache` into device slots evicted by
    /// `policy`, instead of uploading the expert tensors; no CUDA graph is
    /// captured (docs/SSD_STREAMING.md). Before the first graph.
    pub fn with_experts(
        mut self,
        cache: Arc<super::experts::ExpertCache>,
        policy: super::options::EvictionPolicy,
    ) -> CudaBackend {
        self.experts = Some(cache);
        self.stream_policy = policy;
        self.use_graphs = false;
        self
    }

    /// The launch list of `graph` over the value addresses `values`, the
    /// scratch it allocated, its streamed passes and its row-state buffer.
    fn record(&mut self, graph: &Graph, values: &[CUdeviceptr]) -> Result<Recorded, BackendError> {
        let mut scratch = Vec::new();
        let mut points = Vec::new();
        let file = self.file.clone();
        let set_steps: Vec<CUdeviceptr> = self.set_steps.iter().map(|b| b.ptr).collect();
        // The step's per-row state sets (the head's gather reads them).
        let row_states = launch::scratch(&mut scratch, graph.max_tokens.max(1) * 4)?;
        let launches = record::record(
            record::Ctx {
                file: (*file).as_ref(),
                funcs: &self.modules.funcs,
                weights: &mut self.weights,
                states: &self.sets,
                set_steps: &set_steps,
                row_states,
                layout: &self.layout,
                freqs: &mut self.freqs,
                step: self.step.ptr,
                values,
                scratch: &mut scratch,
                tensor_cores: self.tensor_cores,
                streamed: &self.streamed,
                points: &mut points,
            },
            graph,
        )?;
        Ok((launches, scratch, points, row_states))
    }

    /// The state buffers of set `set`, or an error naming it.
    fn set(&self, set: usize) -> Result<&[DevBuf], BackendError> {
        self.sets
            .get(set)
            .map(|v| &v[..])
            .ok_or_else(|| BackendError::State {
                state: format!("set {set}"),
                msg: format!("cuda holds {} state sets", self.sets.len()),
            })
    }

    fn reset_set_buffers(&self, set: usize) -> Result<(), BackendError> {
        for (b, d) in self.sets[set].iter().zip(&self.layout.states) {
            upload(b.ptr, bytemuck::cast_slice(&vec![d.init; d.rows * d.cols]))?;
        }
        Ok(())
    }

    /// One step over the rows `rows` (checked into `segs`).
    fn run_step(
        &mut self,
        h: GraphHandle,
        tokens: &[u32],
        rows: &[crate::graph::RowRecord],
        segs: &[Segment],
    ) -> Result<(), BackendError> {
        self.dev.bind()?;
        let g = self.loaded(h)?;
        let graph = g.graph.clone();
        if let Some(s) = segs.iter().find(|s| s.pos0 + s.n > u32::MAX as usize) {
            return Err(unsupported(format!("position {} (beyond 2^32)", s.pos0)));
        }
        let n_rows = rows.len();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        upload_async(
            g.values[graph.tokens.0 as usize],
            bytemuck::cast_slice(&ids),
            self.dev.stream,
        )?;
        let step = StepDev {
            pos0: segs.first().map_or(0, |s| s.pos0 as u32),
            n_tokens: n_rows as u32,
            ..Default::default()
        };
        upload_async(self.step.ptr, bytemuck::bytes_of(&step), self.dev.stream)?;
        if self.sets.len() > 1 {
            let states: Vec<u32> = rows.iter().map(|r| r.state).collect();
            upload_async(g.row_states, bytemuck::cast_slice(&states), self.dev.stream)?;
        }
        if let Some(c) = &self.experts {
            let file = self.file.clone();
            c.begin_step_except((*file).as_ref(), tokens, &|gate, e| self.on_device(gate, e))
                .map_err(|e| BackendError::Weights(e.to_string()))?;
        }
        // Every set's parameters: a set without rows this step has none (a
        // captured graph launches its per-session kernels all the same).
        for (set, buf) in self.set_steps.iter().enumerate() {
            let s = segs.iter().find(|s| s.state == set);
            let p = StepDev {
                pos0: s.map_or(0, |s| s.pos0 as u32),
                n_tokens: s.map_or(0, |s| s.n as u32),
                row0: s.map_or(0, |s| s.row0 as u32),
                _pad: 0,
            };
            upload_async(buf.ptr, bytemuck::bytes_of(&p), self.dev.stream)?;
        }
        if self.experts.is_some() {
            let r = self.enqueue_streaming(h.0, &tokens[..n_rows], segs);
            self.staged = None;
            r?;
            self.dev.sync()?;
            self.graphs[h.0].n_tokens = n_rows;
            return Ok(());
        }
        let capture = self.use_graphs && graph.max_tokens <= CAPTURE_MAX_TOKENS;
        if capture && g.captured.is_none() {
            // Captured once with grids for the graph's capacity; kernels
            // bound-check against the step's token count.
            let stream = self.dev.stream;
            // SAFETY: our stream; capture ends below on every path.
            checked("cuStreamBeginCapture", unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            })?;
            let enq = self.enqueue(&g.launches, graph.max_tokens as u32, None);
            let mut cg: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: ends the capture begun above.
            let end = checked("cuStreamEndCapture", unsafe {
                sys::cuStreamEndCapture(stream, &mut cg)
            });
            enq?;
            end?;
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: `cg` is the graph just captured.
            checked("cuGraphInstantiate", unsafe {
                sys::cuGraphInstantiateWithFlags(&mut exec, cg, 0)
            })?;
            self.graphs[h.0].captured = Some(Captured { graph: cg, exec });
        }
        let g = &self.graphs[h.0];
        match &g.captured {
            // SAFETY: an instantiated graph on our stream.
            Some(c) if capture => checked("cuGraphLaunch", unsafe {
                sys::cuGraphLaunch(c.exec, self.dev.stream)
            })?,
            _ => self.enqueue(&g.launches, n_rows as u32, Some(segs))?,
        }
        self.dev.sync()?;
        self.graphs[h.0].n_tokens = n_rows;
        Ok(())
    }

    fn loaded(&self, h: GraphHandle) -> Result<&LoadedGraph, BackendError> {
        self.graphs.get(h.0).ok_or(BackendError::UnknownGraph(h.0))
    }

    /// Enqueues a launch list on the stream for `n` live tokens; a
    /// per-session launch is sized from its session's rows in `segs` (and
    /// skipped when the set has none), or from `n` when `segs` is `None`
    /// (capture: the kernels bound-check against their set's parameters).
    fn enqueue(
        &self,
        launches: &[Launch],
        n: u32,
        segs: Option<&[Segment]>,
    ) -> Result<(), BackendError> {
        for l in launches {
            if !l.tokens.contains(&n) {
                continue;
            }
            let rows = match (l.set, segs) {
                (Some(set), Some(segs)) => match segs.iter().find(|s| s.state == set) {
                    Some(s) => s.n as u32,
                    None => continue,
                },
                _ => n,
            };
            let Some((gx, gy)) = l.grid.dims(rows) else {
                continue;
            };
            let mut storage: Vec<u64> = l.args.iter().map(|a| a.bits()).collect();
            let mut params: Vec<*mut c_void> = storage
                .iter_mut()
                .map(|s| s as *mut u64 as *mut c_void)
                .collect();
            // SAFETY: every kernel's parameters are (in order) the recorded
            // args, each read from its own 8-byte cell (little-endian: a u32
            // or f32 argument is the low half); pointers are live device
            // allocations owned by the backend or the graph.
            let r = unsafe {
                sys::cuLaunchKernel(
                    l.func,
                    gx,
                    gy,
                    1,
                    l.block,
                    1,
                    1,
                    l.shared,
                    self.dev.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            checked(l.kernel, r)?;
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        let _ = self.dev.sync();
        for g in &mut self.graphs {
            if let Some(c) = g.captured.take() {
                // SAFETY: created in `run`, destroyed once.
                unsafe {
                    let _ = sys::cuGraphExecDestroy(c.exec);
                    let _ = sys::cuGraphDestroy(c.graph);
                }
            }
        }
        self.graphs.clear();
        // The modules unload when the field drops (before the device).
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device(&self) -> String {
        self.description.clone()
    }

    fn state_layout(&self) -> &StateLayout {
        &self.layout
    }

    fn expert_cache(&self) -> Option<Arc<super::experts::ExpertCache>> {
        self.experts.clone()
    }

    fn load_graph(&mut self, graph: Arc<Graph>) -> Result<GraphHandle, BackendError> {
        self.dev.bind()?;
        let p = plan(&graph);
        let mut offsets = Vec::with_capacity(p.slot_len.len());
        let mut total = 0usize;
        for &n in &p.slot_len {
            offsets.push(total);
            total += (n * 4).div_ceil(ALIGN) * ALIGN;
        }
        let arena = DevBuf::alloc(total.max(ALIGN))?;
        let values: Vec<CUdeviceptr> = p
            .slot_of
            .iter()
            .map(|&s| {
                if s == usize::MAX {
                    arena.ptr
                } else {
                    arena.ptr + offsets[s] as u64
                }
            })
            .collect();
        self.stream_layers(&graph)?;
        let (launches, scratch, points, row_states) = self.record(&graph, &values)?;
        self.graphs.push(LoadedGraph {
            graph,
            _arena: arena,
            values,
            _scratch: scratch,
            launches,
            captured: None,
            n_tokens: 0,
            points,
            row_states,
        });
        Ok(GraphHandle(self.graphs.len() - 1))
    }

    fn run(&mut self, h: GraphHandle, tokens: &[u32], p: StepParams) -> Result<(), BackendError> {
        self.run_rows(h, tokens, &crate::graph::RowRecord::contiguous(p))
    }

    fn state_sets(&self) -> usize {
        self.sets.len()
    }

    /// Holds `n` fresh state sets; the loaded graphs are recorded again so
    /// that their per-session launches cover every set. Refused with the
    /// tensor-core prefill on (it picks its kernel by the whole step's rows).
    fn set_state_sets(&mut self, n: usize) -> Result<(), BackendError> {
        if n == 0 || (n > 1 && self.tensor_cores) {
            return Err(BackendError::Unsupported {
                backend: "cuda".into(),
                what: if n == 0 {
                    "zero state sets".into()
                } else {
                    format!("{n} sessions in one step with the tensor-core prefill (DS4_CUDA_MMA)")
                },
            });
        }
        self.dev.bind()?;
        self.dev.sync()?;
        self.sets.truncate(n);
        self.set_steps.truncate(n);
        while self.sets.len() < n {
            self.sets.push(alloc_states(&self.layout)?);
            self.set_steps
                .push(DevBuf::alloc(std::mem::size_of::<StepDev>())?);
        }
        for set in 0..n {
            self.reset_set_buffers(set)?;
        }
        for i in 0..self.graphs.len() {
            if let Some(c) = self.graphs[i].captured.take() {
                // SAFETY: created in `run_step`, destroyed once.
                unsafe {
                    let _ = sys::cuGraphExecDestroy(c.exec);
                    let _ = sys::cuGraphDestroy(c.graph);
                }
            }
            let graph = self.graphs[i].graph.clone();
            let values = std::mem::take(&mut self.graphs[i].values);
            let r = self.record(&graph, &values);
            self.graphs[i].values = values;
            let (launches, scratch, points, row_states) = r?;
            self.graphs[i].launches = launches;
            self.graphs[i]._scratch = scratch;
            self.graphs[i].points = points;
            self.graphs[i].row_states = row_states;
        }
        Ok(())
    }

    fn run_rows(
        &mut self,
        h: GraphHandle,
        tokens: &[u32],
        rows: &[crate::graph::RowRecord],
    ) -> Result<(), BackendError> {
        let graph = self.loaded(h)?.graph.clone();
        let segs = super::check_rows(&graph, tokens, rows, self.sets.len())?;
        self.run_step(h, tokens, rows, &segs)
    }

    fn read_set_rows(
        &self,
        set: usize,
        s: StateId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError> {
        self.dev.bind()?;
        let r = state_range(&self.layout, s, 0, None, Some(rows))?;
        let mut out = vec![0f32; r.len()];
        download(
            self.set(set)?[s.0 as usize].ptr + (r.start * 4) as u64,
            bytemuck::cast_slice_mut(&mut out),
        )?;
        Ok(out)
    }

    fn write_set_rows(
        &mut self,
        set: usize,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        self.dev.bind()?;
        let r = state_range(&self.layout, s, first, Some(data.len()), None)?;
        upload(
            self.set(set)?[s.0 as usize].ptr + (r.start * 4) as u64,
            bytemuck::cast_slice(data),
        )
    }

    fn reset_set(&mut self, set: usize) -> Result<(), BackendError> {
        self.dev.bind()?;
        self.set(set)?;
        self.reset_set_buffers(set)
    }

    fn read_value_rows(
        &self,
        h: GraphHandle,
        v: ValueId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError> {
        self.dev.bind()?;
        let g = self.loaded(h)?;
        let d = g.graph.value(v);
        let rows = clamp_rows(rows, d.live_rows(g.n_tokens));
        let mut raw = vec![0u32; rows.len() * d.cols];
        let first = (rows.start * d.cols * 4) as u64;
        download(
            g.values[v.0 as usize] + first,
            bytemuck::cast_slice_mut(&mut raw),
        )?;
        Ok(match d.dtype {
            DType::F32 => raw.iter().map(|&b| f32::from_bits(b)).collect(),
            DType::I32 => raw.iter().map(|&b| b as i32 as f32).collect(),
        })
    }

    fn write_value(
        &mut self,
        h: GraphHandle,
        v: ValueId,
        data: &[f32],
    ) -> Result<(), BackendError> {
        self.dev.bind()?;
        let g = self.loaded(h)?;
        let d = g.graph.value(v);
        if data.len() > d.len() {
            return Err(BackendError::Value {
                value: d.name.to_string(),
                msg: format!("{} values given, it holds {}", data.len(), d.len()),
            });
        }
        let raw: Vec<u32> = match d.dtype {
            DType::F32 => data.iter().map(|x| x.to_bits()).collect(),
            DType::I32 => data.iter().map(|&x| x as i32 as u32).collect(),
        };
        upload(g.values[v.0 as usize], bytemuck::cast_slice(&raw))
    }

    fn reset_states(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        // The trait gives no way to report this; a failed reset leaves a
        // device error that the next step reports.
        let _ = self.reset_set_buffers(0);
    }
}

/// One set of state buffers for `layout`, at their fresh values.
fn alloc_states(layout: &StateLayout) -> Result<Vec<DevBuf>, BackendError> {
    let mut states = Vec::new();
    for s in &layout.states {
        let b = DevBuf::alloc(s.rows * s.cols * 4)?;
        upload(b.ptr, bytemuck::cast_slice(&vec![s.init; s.rows * s.cols]))?;
        states.push(b);
    }
    Ok(states)
}

/// Threads per block of the grid-stride kernels (re-exported for docs).
pub const GRID_STRIDE_THREADS: u32 = THREADS;
