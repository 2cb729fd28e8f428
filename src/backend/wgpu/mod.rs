//! The wgpu backend: the recorded graph runs as WGSL compute kernels on
//! Metal, Vulkan (including lavapipe, Mesa's CPU Vulkan) or DX12.
//!
//! `load_graph` turns the tape into a dispatch list once: activations get
//! one buffer per slot of [`crate::graph::plan`], every op its pipeline, a
//! uniform with its parameters and a bind group. A step writes the token ids
//! and the [`StepUniform`], encodes the list (one compute pass per segment
//! between [`Node::Flush`] points, each submitted as soon as it is encoded)
//! and reads back only the logits. Kernels bound-check against the step's
//! token count, so one recorded list serves every step of its shape class.
//!
//! Several sessions in one step ([`Backend::run_rows`]): the backend holds
//! one copy of the state buffers per session ([`Backend::set_state_sets`]).
//! The per-session ops (ring write, attention, compressor, indexer) are
//! recorded with one bind group per state set, each binding that set's
//! states and its own step uniform (the session's `pos0`, row count and first
//! row); a step dispatches them once per session piece. Every other op runs
//! once over all rows; its kernels reduce each row in one fixed order
//! whatever the row count, so a session's logits do not depend on the rest
//! of the batch.

pub mod bandwidth;
pub mod gpu;
pub mod kernels;
mod launch;
pub mod matmul;
pub mod params;
pub mod shaders;
mod state;
mod step;
pub mod streaming;
pub mod weights;

mod record;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub use gpu::{AdapterChoice, Gpu, RowRecord, StepUniform};
pub use state::GpuState;

use state::{make_states, step_buffer};

use super::{
    clamp_rows, state_range, Backend, BackendError, BackendOptions, GraphHandle, WeightFile,
};
use crate::graph::{plan, DType, Graph, Segment, StateId, StateLayout, StepParams, ValueId};

/// How many workgroups a dispatch needs for `n` live tokens.
#[derive(Clone, Copy, Debug)]
pub enum Size {
    /// One thread per item: `per_token · n + fixed` items.
    Threads { per_token: u32, fixed: u32 },
    /// One workgroup per item.
    Groups { per_token: u32, fixed: u32 },
    /// One workgroup per live token in `first..first + count` (a kernel run
    /// in token blocks so that its scratch fits one binding).
    TokenBlock { first: u32, count: u32 },
}

/// Bindings a kernel has for one chunked state (`comp0..comp7` etc. in the
/// WGSL): a state may span at most this many chunks of whole rows.
pub const MAX_STATE_CHUNKS: usize = 8;

/// Threads per workgroup (`WG` in shaders/common.wgsl).
pub const WG: u32 = 256;
/// Workgroups per dispatch dimension that every adapter allows.
const MAX_GROUPS_X: u32 = 65535;

impl Size {
    /// `[x, y, 1]`, split over y above 65535 workgroups; `None` for no work.
    pub fn workgroups(self, n: u32) -> Option<[u32; 3]> {
        let groups = match self {
            Size::Threads { per_token, fixed } => (per_token * n + fixed).div_ceil(WG),
            Size::Groups { per_token, fixed } => per_token * n + fixed,
            Size::TokenBlock { first, count } => n.saturating_sub(first).min(count),
        };
        if groups == 0 {
            return None;
        }
        let x = groups.min(MAX_GROUPS_X);
        Some([x, groups.div_ceil(x), 1])
    }
}

/// One entry of a recorded dispatch list.
pub enum Work {
    Kernel {
        pipeline: wgpu::ComputePipeline,
        bind: wgpu::BindGroup,
        size: Size,
    },
    /// A matrix product; `Some(rows)` for one over a fixed number of rows
    /// (the last-token head) rather than the step's tokens.
    Dense(matmul::DenseMatmul, Option<u32>),
    Experts(matmul::RoutedExperts),
    /// A routed pass over a streamed layer (`--ssd-streaming`): `run_step`
    /// stops encoding there to find its experts and upload the misses.
    Streamed(Box<streaming::StreamedExperts>),
    /// A per-session kernel: `binds[set]` binds state set `set` and its
    /// step uniform; dispatched once per session piece of the step, sized
    /// from the piece's row count.
    PerSession {
        pipeline: wgpu::ComputePipeline,
        binds: Vec<wgpu::BindGroup>,
        size: Size,
    },
}

impl Work {
    /// Records this entry for a step of `n` rows whose session pieces are
    /// `segs`.
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, segs: &[Segment]) {
        match self {
            Work::Kernel {
                pipeline,
                bind,
                size,
            } => {
                if let Some([x, y, z]) = size.workgroups(n) {
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind, &[]);
                    pass.dispatch_workgroups(x, y, z);
                }
            }
            Work::PerSession {
                pipeline,
                binds,
                size,
            } => {
                for s in segs {
                    if let Some([x, y, z]) = size.workgroups(s.n as u32) {
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, &binds[s.state], &[]);
                        pass.dispatch_workgroups(x, y, z);
                    }
                }
            }
            Work::Dense(d, fixed) => d.encode(pass, fixed.unwrap_or(n)),
            Work::Experts(e) => e.encode(pass, n),
            Work::Streamed(s) => s.experts.encode(pass, n),
        }
    }
}

struct LoadedGraph {
    graph: Arc<Graph>,
    /// Buffer of every value (values sharing a plan slot share a buffer).
    slot_of: Vec<usize>,
    slots: Vec<wgpu::Buffer>,
    /// The row table: one [`RowRecord`] per token row, written per step.
    rows: wgpu::Buffer,
    /// Dispatch lists between flush points.
    segments: Vec<Vec<(&'static str, Work)>>,
    /// Live token count of the last step.
    n_tokens: usize,
    /// The logits read back after the last step.
    logits: Vec<f32>,
}

impl LoadedGraph {
    fn buffer(&self, v: ValueId) -> &wgpu::Buffer {
        &self.slots[self.slot_of[v.0 as usize]]
    }
}

pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    /// The device's compiled pipelines (shared with other backends on it).
    pipes: Arc<kernels::Pipelines>,
    file: WeightFile,
    layout: StateLayout,
    /// `sets[set][state]`: one copy of the state buffers per session.
    sets: Vec<Vec<GpuState>>,
    /// The step uniform every kernel over all rows reads.
    step: wgpu::Buffer,
    /// Per state set: the uniform its per-session kernels read (the
    /// session's `pos0`, row count and first row in the step).
    set_steps: Vec<wgpu::Buffer>,
    /// States may be stored as f16 (device feature, not `kv_f32`).
    f16_ok: bool,
    /// Matrices and expert tensors as stored in the file, in chunks of
    /// whole rows (shared by every graph).
    tensors: HashMap<String, Arc<weights::GpuTensor>>,
    /// Small tensors widened to f32 once (norms, sinks, biases, mixers).
    small: HashMap<String, wgpu::Buffer>,
    /// Embedding tables in chunks of whole rows: (buffer, first row, rows).
    tables: HashMap<String, Vec<(wgpu::Buffer, u32, u32)>>,
    /// Bound where an op has no such input (read-only), or no such output.
    dummy_read: wgpu::Buffer,
    /// Distinct per writable binding: wgpu refuses one buffer bound
    /// writable twice in a bind group.
    dummy_write: Vec<wgpu::Buffer>,
    graphs: Vec<LoadedGraph>,
    /// The largest binding of a state chunk (or of state-sized scratch):
    /// the device's limit, or [`BackendOptions::state_chunk_cap`] below it.
    chunk_bytes: u64,
    /// [`BackendOptions::wgpu_profile`].
    profile: bool,
    /// Routed experts streamed through this cache (`--ssd-streaming`); the
    /// streamed layers' slots, by their `gate` tensor's file offset.
    experts: Option<Arc<super::experts::ExpertCache>>,
    streamed: Mutex<HashMap<u64, streaming::StreamedLayer>>,
    /// How the device slots evict (`--ssd-policy`).
    stream_policy: super::options::EvictionPolicy,
}

fn bytes_of_f32(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl WgpuBackend {
    /// Opens the adapter `opts` names (CPU emulators only if
    /// `allow_emulation`) and creates the state buffers.
    pub fn open(
        opts: &BackendOptions,
        allow_emulation: bool,
        file: WeightFile,
        layout: StateLayout,
    ) -> Result<WgpuBackend, BackendError> {
        Self::with_options(Gpu::shared(opts, allow_emulation)?, file, layout, opts)
    }

    /// A backend on an already open device (tests share one device), with
    /// the default options.
    pub fn new(
        gpu: Arc<Gpu>,
        file: WeightFile,
        layout: StateLayout,
    ) -> Result<WgpuBackend, BackendError> {
        Self::with_options(gpu, file, layout, &BackendOptions::default())
    }

    /// A backend on an already open device with the state options of
    /// `opts` (chunk cap, f32 rows, profiling).
    pub fn with_options(
        gpu: Arc<Gpu>,
        file: WeightFile,
        layout: StateLayout,
        opts: &BackendOptions,
    ) -> Result<WgpuBackend, BackendError> {
        let cap = match opts.state_chunk_cap {
            Some(c) if c > 0 => c.min(gpu.max_binding()),
            _ => gpu.max_binding(),
        };
        // f16 rows need shader-f16 and whole u32 words per row (buffer
        // copies and writes move 4-byte multiples).
        let f16_ok = !opts.kv_f32 && gpu.features.contains(wgpu::Features::SHADER_F16);
        let states = make_states(&gpu, &layout, cap, f16_ok)?;
        let step = step_buffer(&gpu, "step");
        let set_step = step_buffer(&gpu, "step of set 0");
        let small_buf = |label: &str| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let dummy_read = small_buf("dummy read");
        // Two chunked writable states in one kernel (V4.1's compressor:
        // rows and index keys) take dummies i and MAX_STATE_CHUNKS + i for
        // an unused chunk i >= 1; indices 0 and MAX_STATE_CHUNKS stand for
        // other absent outputs.
        let dummy_write = (0..2 * MAX_STATE_CHUNKS)
            .map(|i| small_buf(&format!("dummy write {i}")))
            .collect();
        let mut b = WgpuBackend {
            pipes: kernels::Pipelines::of(&gpu),
            gpu,
            file,
            layout,
            sets: vec![states],
            set_steps: vec![set_step],
            step,
            f16_ok,
            tensors: HashMap::new(),
            small: HashMap::new(),
            tables: HashMap::new(),
            dummy_read,
            dummy_write,
            graphs: Vec::new(),
            chunk_bytes: cap,
            profile: opts.wgpu_profile,
            experts: None,
            streamed: Mutex::default(),
            stream_policy: Default::default(),
        };
        b.reset_states();
        b.gpu.check()?;
        Ok(b)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Streams routed experts through `cache` into device slots evicted by
    /// `policy`, instead of uploading the expert tensors
    /// (docs/SSD_STREAMING.md). Before the first graph.
    pub fn with_experts(
        mut self,
        cache: Arc<super::experts::ExpertCache>,
        policy: super::options::EvictionPolicy,
    ) -> WgpuBackend {
        self.experts = Some(cache);
        self.stream_policy = policy;
        self
    }

    /// Whether `o`'s layer streams (its tensors are not uploaded).
    fn is_streamed(&self, o: &crate::graph::ops::moe::MoeExperts) -> bool {
        self.experts
            .as_ref()
            .is_some_and(|c| c.is_streamed(o.gate.offset))
    }

    /// Uploads every matrix and expert tensor the graph's products read
    /// (`Op::weights`), streamed from the mmap in chunks of whole rows, with
    /// a progress bar on a terminal when there is much to move.
    fn upload_matrices(&mut self, graph: &Graph) -> Result<(), BackendError> {
        use crate::graph::ops::Op;
        let mut todo: Vec<&crate::gguf::TensorRef> = Vec::new();
        for op in graph.ops() {
            let streamed = matches!(op, Op::MoeExperts(o) if self.is_streamed(o));
            if matches!(op, Op::MatMul(_) | Op::MoeExperts(_)) && !streamed {
                for t in op.weights() {
                    if !self.tensors.contains_key(&t.name) && !todo.iter().any(|x| x.name == t.name)
                    {
                        todo.push(t);
                    }
                }
            }
        }
        let total: u64 = todo.iter().map(|t| t.n_bytes).sum();
        let bar = (total > 256 << 20 && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(
            || {
                let b = indicatif::ProgressBar::new(total);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "uploading weights {bytes}/{total_bytes} {wide_bar} {percent}%",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                b
            },
        );
        let file = self.file.clone();
        let file: &crate::gguf::GgufFile = (*file).as_ref();
        let mut done = 0u64;
        for t in todo {
            let w = weights::GpuTensor::upload(
                &self.gpu,
                &t.name,
                t.ty,
                t.ne,
                t.bytes(file),
                &mut |n| {
                    if let Some(b) = &bar {
                        b.set_position(done + n);
                    }
                },
            )?;
            done += t.n_bytes;
            self.tensors.insert(t.name.clone(), Arc::new(w));
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        self.gpu.check()
    }

    fn loaded(&self, h: GraphHandle) -> Result<&LoadedGraph, BackendError> {
        self.graphs.get(h.0).ok_or(BackendError::UnknownGraph(h.0))
    }

    /// A uniform buffer holding `p`.
    fn uniform<T: bytemuck::Pod>(&self, label: &str, p: &T) -> wgpu::Buffer {
        self.gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::bytes_of(p),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// A read-only storage buffer holding `data` (at least 4 bytes).
    fn storage_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut bytes = data.to_vec();
        bytes.resize(bytes.len().next_multiple_of(4).max(4), 0);
        self.gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &bytes,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    /// The state buffers of set `set`, or an error naming it.
    fn set(&self, set: usize) -> Result<&[GpuState], BackendError> {
        self.sets
            .get(set)
            .map(|v| &v[..])
            .ok_or_else(|| BackendError::State {
                state: format!("set {set}"),
                msg: format!("wgpu holds {} state sets", self.sets.len()),
            })
    }

    /// Puts every state of set `set` back to its fresh value.
    fn reset_set_buffers(&self, set: usize) {
        for (st, d) in self.sets[set].iter().zip(&self.layout.states) {
            let vb = st.value_bytes();
            for (c, off, n) in st.pieces(0..d.rows * d.cols) {
                let bytes = st.encode(&vec![d.init; n]);
                self.gpu
                    .queue
                    .write_buffer(&st.chunks[c], (off * vb) as u64, &bytes);
            }
        }
    }
}

/// Values read back, i32 ones converted to f32 numbers (as the CPU does).
fn to_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytemuck::pod_collect_to_vec(bytes),
        DType::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(bytes)
            .into_iter()
            .map(|x| x as f32)
            .collect(),
    }
}

/// Refuses a buffer the device cannot bind whole.
fn check_binding(gpu: &Gpu, what: &str, bytes: u64) -> Result<(), BackendError> {
    if bytes > gpu.max_binding() {
        return Err(BackendError::Device {
            device: gpu.describe(),
            msg: format!(
                "{what} needs {bytes} bytes in one binding; this device binds at most {} \
                 (max_storage_buffer_binding_size {}, max_buffer_size {}); use a smaller --ctx \
                 or prefill chunk",
                gpu.max_binding(),
                gpu.limits.max_storage_buffer_binding_size,
                gpu.limits.max_buffer_size
            ),
        });
    }
    Ok(())
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device(&self) -> String {
        self.gpu.describe()
    }

    fn state_layout(&self) -> &StateLayout {
        &self.layout
    }

    fn expert_cache(&self) -> Option<Arc<super::experts::ExpertCache>> {
        self.experts.clone()
    }

    fn load_graph(&mut self, graph: Arc<Graph>) -> Result<GraphHandle, BackendError> {
        let p = plan(&graph);
        let mut slots = Vec::with_capacity(p.slot_len.len());
        for (i, &len) in p.slot_len.iter().enumerate() {
            let bytes = (len * 4).max(4) as u64;
            check_binding(&self.gpu, &format!("activation slot {i}"), bytes)?;
            slots.push(self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("slot"),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let rows = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("row table"),
            size: (graph.max_tokens.max(1) * std::mem::size_of::<RowRecord>()) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut lg = LoadedGraph {
            graph: graph.clone(),
            slot_of: p.slot_of,
            slots,
            rows,
            segments: Vec::new(),
            n_tokens: 0,
            logits: Vec::new(),
        };
        self.stream_layers(&graph)?;
        self.upload_matrices(&graph)?;
        lg.segments = record::record(self, &lg)?;
        self.gpu.wait()?;
        self.graphs.push(lg);
        Ok(GraphHandle(self.graphs.len() - 1))
    }

    fn run(&mut self, h: GraphHandle, tokens: &[u32], p: StepParams) -> Result<(), BackendError> {
        self.run_rows(h, tokens, &crate::graph::RowRecord::contiguous(p))
    }

    fn state_sets(&self) -> usize {
        self.sets.len()
    }

    /// Holds `n` fresh state sets; the loaded graphs are recorded again so
    /// that their per-session kernels bind every set.
    fn set_state_sets(&mut self, n: usize) -> Result<(), BackendError> {
        if n == 0 {
            return Err(BackendError::State {
                state: "sets".into(),
                msg: "at least one state set".into(),
            });
        }
        let cap = self.chunk_bytes;
        self.sets.truncate(n);
        self.set_steps.truncate(n);
        while self.sets.len() < n {
            let states = make_states(&self.gpu, &self.layout, cap, self.f16_ok)?;
            self.sets.push(states);
            let label = format!("step of set {}", self.set_steps.len());
            self.set_steps.push(step_buffer(&self.gpu, &label));
        }
        for set in 0..n {
            self.reset_set_buffers(set);
        }
        let mut graphs = std::mem::take(&mut self.graphs);
        let r = graphs.iter_mut().try_for_each(|g| {
            g.segments = record::record(self, g)?;
            Ok(())
        });
        self.graphs = graphs;
        r?;
        self.gpu.check()
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
        let r = state_range(&self.layout, s, 0, None, Some(rows))?;
        let st = &self.set(set)?[s.0 as usize];
        let mut out = Vec::with_capacity(r.len());
        let vb = st.value_bytes();
        for (c, off, n) in st.pieces(r) {
            let bytes = self.read_bytes(&st.chunks[c], (off * vb) as u64, (n * vb) as u64)?;
            out.extend(st.decode(&bytes));
        }
        Ok(out)
    }

    fn write_set_rows(
        &mut self,
        set: usize,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let r = state_range(&self.layout, s, first, Some(data.len()), None)?;
        let st = &self.set(set)?[s.0 as usize];
        let mut at = 0;
        let vb = st.value_bytes();
        for (c, off, n) in st.pieces(r) {
            let bytes = st.encode(&data[at..at + n]);
            self.gpu
                .queue
                .write_buffer(&st.chunks[c], (off * vb) as u64, &bytes);
            at += n;
        }
        Ok(())
    }

    fn reset_set(&mut self, set: usize) -> Result<(), BackendError> {
        self.set(set)?;
        self.reset_set_buffers(set);
        Ok(())
    }

    fn read_value_rows(
        &self,
        h: GraphHandle,
        v: ValueId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError> {
        let g = self.loaded(h)?;
        let d = g.graph.value(v);
        let rows = clamp_rows(rows, d.live_rows(g.n_tokens));
        let (first, len) = (rows.start * d.cols * 4, rows.len() * d.cols * 4);
        if v == g.graph.logits && g.n_tokens > 0 {
            // Read back with the step already.
            return Ok(g.logits[first / 4..(first + len) / 4].to_vec());
        }
        let bytes = self.read_bytes(g.buffer(v), first as u64, len as u64)?;
        Ok(to_f32(d.dtype, &bytes))
    }

    fn write_value(
        &mut self,
        h: GraphHandle,
        v: ValueId,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let g = self.loaded(h)?;
        let d = g.graph.value(v);
        if data.len() > d.len() {
            return Err(BackendError::Value {
                value: d.name.to_string(),
                msg: format!("{} values given, it holds {}", data.len(), d.len()),
            });
        }
        let bytes: Vec<u8> = match d.dtype {
            DType::F32 => bytes_of_f32(data).to_vec(),
            DType::I32 => {
                let ids: Vec<i32> = data.iter().map(|&x| x as i32).collect();
                bytemuck::cast_slice(&ids).to_vec()
            }
        };
        if !bytes.is_empty() {
            self.gpu.queue.write_buffer(g.buffer(v), 0, &bytes);
        }
        Ok(())
    }

    fn reset_states(&mut self) {
        self.reset_set_buffers(0);
    }
}
