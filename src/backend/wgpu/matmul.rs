//! Matrix products on the GPU: dense weights × activations (decode and
//! prefill, grouped output projection) and the routed experts, for every
//! weight type the WGSL decoders read (shaders/quant.wgsl, matmul.wgsl,
//! moe.wgsl).
//!
//! Pipelines are built lazily per weight type (the type is the pipeline
//! constant `WTYPE`, so each pipeline contains one decoder only). `dense` and
//! `experts` build the bind groups of one recorded op once; `encode` only sets
//! pipelines and bind groups and dispatches, sized from the step's token count
//! (the kernels also bound-check against the step uniform).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Mutex;

use wgpu::util::DeviceExt;

use super::gpu::Gpu;
use super::shaders::Module;
use super::weights::GpuTensor;
use crate::backend::kernels::{Entry, Family};
use crate::backend::BackendError;
use crate::graph::ops::moe::ExpertDims;
use crate::quant::iq2xxs_tables::IQ2XXS_GRID;
use crate::quant::GgmlType;

/// Activation rows per workgroup tile (`TILE_TOKENS` in matmul.wgsl).
pub const TILE_TOKENS: u32 = 8;
/// Invocations per workgroup (`WG` in matmul.wgsl).
pub const WORKGROUP: u32 = 64;
/// Default weight rows per workgroup (the pipeline constant `ROWS` of
/// matmul.wgsl; [`MatmulKernels::with_rows`] picks another): 16 lanes per
/// row on GPUs.
pub const ROWS_PER_WORKGROUP: u32 = 4;
/// On CPU emulation (lavapipe) a workgroup runs on one core, so fewer, fuller
/// workgroups win: 16 rows of 4 lanes measured ~1.3–2× faster than 4 rows
/// (docs/PERFORMANCE.md).
pub const ROWS_PER_WORKGROUP_CPU: u32 = 16;
/// Workgroups along x before rows fold into y.
const GRID_X: u64 = 32768;
const MAX_GRID: u64 = 65535;

const MODE_GATE: u32 = 1;
const MODE_UP: u32 = 2;
const MODE_DOWN: u32 = 3;

/// Per-dispatch constants of matmul.wgsl's `MatmulParams` (same layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MatmulParams {
    pub n_in: u32,
    pub n_rows: u32,
    pub row0: u32,
    pub row_bytes: u32,
    pub rows_per_group: u32,
    pub x_stride: u32,
    pub out_stride: u32,
    pub grid_x: u32,
    pub expert0: u32,
    pub n_experts: u32,
    pub k: u32,
    pub mode: u32,
    pub clamp: f32,
    pub pad: [u32; 3],
}

/// A range of a device buffer holding f32 (or i32) values.
#[derive(Clone, Debug)]
pub struct BufRange {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl BufRange {
    /// The whole buffer.
    pub fn whole(buffer: &wgpu::Buffer) -> BufRange {
        BufRange {
            buffer: buffer.clone(),
            offset: 0,
            size: buffer.size(),
        }
    }
}

/// The shape of a dense product (ops::matmul::MatMul's `in_dim`,
/// `out_dim`, `groups`): `n_out` rows of `n_in` weights in `groups` equal
/// row groups, group g reading slice g of each token's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseShape {
    pub n_in: usize,
    pub n_out: usize,
    pub groups: usize,
}

/// The compiled modules, the shared bind-group layout and the pipelines.
pub struct MatmulKernels {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    matmul_module: wgpu::ShaderModule,
    moe_module: wgpu::ShaderModule,
    pipelines: Mutex<HashMap<(Entry, u32), wgpu::ComputePipeline>>,
    /// The IQ2_XXS grid as 512 u32 words (from src/quant/iq2xxs_tables.rs).
    grid: wgpu::Buffer,
    /// Bound where a kernel ignores a binding.
    dummy: wgpu::Buffer,
    /// Weight rows per workgroup.
    rows: u32,
}

/// A dense product recorded once: one dispatch per weight chunk.
pub struct DenseMatmul {
    pipeline: wgpu::ComputePipeline,
    dispatches: Vec<(wgpu::BindGroup, u32, u32)>,
    max_tokens: usize,
}

/// The routed experts of one layer recorded once.
pub struct RoutedExperts {
    rows: wgpu::ComputePipeline,
    rows_gate: wgpu::ComputePipeline,
    rows_down: wgpu::ComputePipeline,
    sum: wgpu::ComputePipeline,
    /// (which pipeline: 0 gate type, 1 up type, 2 down type), bind group, grid.
    chunk_dispatches: Vec<(u8, wgpu::BindGroup, u32, u32)>,
    /// V4.1 model numerics: the FP8 round trip of w2's input, run after
    /// the last up chunk (pipeline, bind group, grid).
    mid_round: Option<(wgpu::ComputePipeline, wgpu::BindGroup, u32, u32)>,
    sum_dispatch: (wgpu::BindGroup, u32, u32),
    k: u32,
    max_tokens: usize,
    /// Intermediates: SwiGLU outputs (slots × ff) and expert outputs (slots × d).
    pub hidden: wgpu::Buffer,
    pub contrib: wgpu::Buffer,
}

fn device_err(gpu: &Gpu, msg: String) -> BackendError {
    BackendError::Device {
        device: gpu.describe(),
        msg,
    }
}

fn fold(rows: u64) -> (u32, u32) {
    let gx = rows.clamp(1, GRID_X);
    (gx as u32, rows.div_ceil(gx) as u32)
}

pub(super) fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

pub(super) fn uniform_entry(binding: u32) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// Runs `f` inside validation and out-of-memory error scopes.
fn scoped<T>(gpu: &Gpu, what: &str, f: impl FnOnce() -> T) -> Result<T, BackendError> {
    let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let val = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = f();
    let v = pollster::block_on(val.pop());
    let o = pollster::block_on(oom.pop());
    if let Some(e) = v.or(o) {
        return Err(device_err(gpu, format!("{what}: {e}")));
    }
    Ok(out)
}

/// A storage binding of `r`, checked against the device's alignment and
/// binding limits and against the bytes the kernel may touch.
fn check_range(gpu: &Gpu, what: &str, r: &BufRange, need: u64) -> Result<(), BackendError> {
    let align = gpu.limits.min_storage_buffer_offset_alignment as u64;
    if r.offset % align != 0 {
        return Err(device_err(
            gpu,
            format!("{what}: offset {} is not a multiple of {align}", r.offset),
        ));
    }
    if r.size < need || r.size == 0 || r.offset + r.size > r.buffer.size() {
        return Err(device_err(
            gpu,
            format!(
                "{what}: range of {} bytes at {} (buffer {}) cannot hold {need} bytes",
                r.size,
                r.offset,
                r.buffer.size()
            ),
        ));
    }
    if r.size > gpu.max_binding() {
        return Err(device_err(
            gpu,
            format!(
                "{what}: {} bytes exceed the binding limit {}",
                r.size,
                gpu.max_binding()
            ),
        ));
    }
    Ok(())
}

fn binding(r: &BufRange) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: &r.buffer,
        offset: r.offset,
        size: NonZeroU64::new(r.size),
    })
}

impl MatmulKernels {
    pub fn new(gpu: &Gpu) -> Result<Self, BackendError> {
        let mut rows = if gpu.info.device_type == wgpu::DeviceType::Cpu {
            ROWS_PER_WORKGROUP_CPU
        } else {
            ROWS_PER_WORKGROUP
        };
        if gpu.shader_variant().subgroups {
            // One subgroup per row: at least as many rows as the workgroup
            // can have subgroups, so none idles.
            let most = WORKGROUP / gpu.info.subgroup_min_size.clamp(1, WORKGROUP);
            rows = rows.max(most.next_power_of_two()).min(WORKGROUP);
        }
        Self::with_rows(gpu, rows)
    }

    /// Kernels with `rows` weight rows per workgroup (a power of two ≤ 64;
    /// the benchmark compares them).
    pub fn with_rows(gpu: &Gpu, rows: u32) -> Result<Self, BackendError> {
        if !rows.is_power_of_two() || rows > WORKGROUP {
            return Err(device_err(
                gpu,
                format!("{rows} rows per workgroup: need a power of two ≤ {WORKGROUP}"),
            ));
        }
        let dev = &gpu.device;
        let mut entries = vec![uniform_entry(0), uniform_entry(1)];
        for (b, ro) in [
            (2, true),
            (3, true),
            (4, false),
            (5, true),
            (6, true),
            (7, true),
        ] {
            entries.push(storage_entry(b, ro));
        }
        let layout = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("matmul"),
            entries: &entries,
        });
        let pipeline_layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("matmul"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = |family: Family| {
            let src = Module::of(family).source(gpu.shader_variant());
            scoped(gpu, &format!("WGSL module {family}"), || {
                dev.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(family.stem()),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                })
            })
        };
        let matmul_module = module(Family::Matmul)?;
        let moe_module = module(Family::Moe)?;
        let words: Vec<u32> = IQ2XXS_GRID
            .iter()
            .flat_map(|&g| [g as u32, (g >> 32) as u32])
            .collect();
        let grid = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("iq2xxs grid"),
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let dummy = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("matmul unused binding"),
            size: 256,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: false,
        });
        Ok(MatmulKernels {
            layout,
            pipeline_layout,
            matmul_module,
            moe_module,
            pipelines: Mutex::new(HashMap::new()),
            grid,
            dummy,
            rows,
        })
    }

    /// Weight rows per workgroup of these kernels.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    fn pipeline(
        &self,
        gpu: &Gpu,
        entry: Entry,
        ty: GgmlType,
    ) -> Result<wgpu::ComputePipeline, BackendError> {
        let key = (entry, ty.id());
        let mut cache = match self.pipelines.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let module = match entry.family() {
            Family::Matmul => &self.matmul_module,
            _ => &self.moe_module,
        };
        let name = entry.name();
        let constants = [("WTYPE", ty.id() as f64), ("ROWS", self.rows as f64)];
        let p = scoped(gpu, &format!("pipeline {name} for {ty}"), || {
            gpu.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(name),
                    layout: Some(&self.pipeline_layout),
                    module,
                    entry_point: Some(name),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &constants,
                        // Every workgroup variable is written before it is read.
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                })
        })?;
        cache.insert(key, p.clone());
        Ok(p)
    }

    fn params_buffer(&self, gpu: &Gpu, p: &MatmulParams) -> wgpu::Buffer {
        gpu.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("matmul params"),
                contents: bytemuck::bytes_of(p),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    #[allow(clippy::too_many_arguments)]
    fn bind_group(
        &self,
        gpu: &Gpu,
        params: &wgpu::Buffer,
        step: &wgpu::Buffer,
        w: Option<&wgpu::Buffer>,
        x: &BufRange,
        out: &BufRange,
        sel: Option<&BufRange>,
        rw: Option<&BufRange>,
    ) -> wgpu::BindGroup {
        let dummy = BufRange::whole(&self.dummy);
        let w = w.map(BufRange::whole).unwrap_or_else(|| dummy.clone());
        let grid = BufRange::whole(&self.grid);
        let step = BufRange {
            buffer: step.clone(),
            offset: 0,
            size: 16,
        };
        let params = BufRange::whole(params);
        let sel = sel.unwrap_or(&dummy);
        let rw = rw.unwrap_or(&dummy);
        let res = [&params, &step, &w, x, out, &grid, sel, rw];
        let entries: Vec<wgpu::BindGroupEntry> = res
            .iter()
            .enumerate()
            .map(|(i, r)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: binding(r),
            })
            .collect();
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matmul"),
            layout: &self.layout,
            entries: &entries,
        })
    }

    /// `out[t][o] = Σ_i W[o][i] · x[t][g·in + i]` (ops::matmul::MatMul,
    /// groups included) for up to `max_tokens` tokens per step; `w` holds
    /// the weights of `shape`.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        &self,
        gpu: &Gpu,
        w: &GpuTensor,
        shape: DenseShape,
        x: BufRange,
        out: BufRange,
        step: &wgpu::Buffer,
        max_tokens: usize,
    ) -> Result<DenseMatmul, BackendError> {
        let n_in = shape.n_in as u64;
        let n_out = shape.n_out as u64;
        let groups = shape.groups.max(1) as u64;
        if w.unit_rows != 1 || !w.holds(&[n_in, n_out]) || n_out % groups != 0 {
            return Err(device_err(
                gpu,
                format!(
                    "weight {} {:?} is not a matrix of {groups} equal row groups",
                    w.name, w.ne
                ),
            ));
        }
        let x_stride = groups * n_in;
        let mt = max_tokens.max(1) as u64;
        check_range(gpu, "matmul input", &x, mt * x_stride * 4)?;
        check_range(gpu, "matmul output", &out, mt * n_out * 4)?;
        if mt.div_ceil(TILE_TOKENS as u64) > MAX_GRID || x_stride * mt > u32::MAX as u64 {
            return Err(device_err(
                gpu,
                format!("{max_tokens} tokens is too many for one step"),
            ));
        }
        let pipeline = self.pipeline(gpu, Entry::MatMul, w.ty)?;
        let mut dispatches = Vec::new();
        for c in &w.chunks {
            let (gx, gy) = fold(c.count.div_ceil(self.rows as u64));
            if gy as u64 > MAX_GRID {
                return Err(device_err(gpu, format!("weight {}: too many rows", w.name)));
            }
            let p = MatmulParams {
                n_in: n_in as u32,
                n_rows: c.count as u32,
                row0: c.first as u32,
                row_bytes: w.row_bytes as u32,
                rows_per_group: (n_out / groups) as u32,
                x_stride: x_stride as u32,
                out_stride: n_out as u32,
                grid_x: gx,
                ..Default::default()
            };
            let pb = self.params_buffer(gpu, &p);
            let bg = scoped(gpu, "matmul bind group", || {
                self.bind_group(gpu, &pb, step, Some(&c.buffer), &x, &out, None, None)
            })?;
            dispatches.push((bg, gx, gy));
        }
        Ok(DenseMatmul {
            pipeline,
            dispatches,
            max_tokens,
        })
    }

    /// ops::moe::MoeExperts: for each token t and slot i, expert
    /// `e = selected[t·k + i]` computes `down_e(weights[t·k+i] ·
    /// swiglu(gate_e·x[t], up_e·x[t]))`; `out[t]` sums the k slots in slot
    /// order. `selected` (i32) and `weights` (f32) are read on the GPU.
    /// `[gate, up, down]` hold experts of `dims` (or, streamed, slots of
    /// them: the selection then names slots). `mid_fp8`: w2's input goes
    /// through FP8 first (V4.1 model numerics).
    #[allow(clippy::too_many_arguments)]
    pub fn experts(
        &self,
        gpu: &Gpu,
        [gate, up, down]: [&GpuTensor; 3],
        dims: ExpertDims,
        clamp: f32,
        k: usize,
        mid_fp8: bool,
        x: BufRange,
        selected: BufRange,
        weights: BufRange,
        out: BufRange,
        step: &wgpu::Buffer,
        max_tokens: usize,
    ) -> Result<RoutedExperts, BackendError> {
        let (d, ff) = (dims.dim as u64, dims.hidden as u64);
        // Slabs of one count (experts, or slots of a streamed layer).
        let n = gate.ne[2];
        let shape_ok = gate.holds(&[d, ff, n])
            && up.holds(&[d, ff, n])
            && down.holds(&[ff, d, n])
            && gate.unit_rows == ff
            && down.unit_rows == d
            && k > 0;
        if !shape_ok {
            return Err(device_err(
                gpu,
                format!(
                    "experts {:?} / {:?} / {:?} with k = {k} do not fit together",
                    gate.ne, up.ne, down.ne
                ),
            ));
        }
        let mt = max_tokens.max(1) as u64;
        let k64 = k as u64;
        let slots = mt * k64;
        if slots > MAX_GRID || slots * ff.max(d) > u32::MAX as u64 {
            return Err(device_err(
                gpu,
                format!("{max_tokens} tokens × {k} experts is too many for one step"),
            ));
        }
        check_range(gpu, "experts input", &x, mt * d * 4)?;
        check_range(gpu, "experts selection", &selected, slots * 4)?;
        check_range(gpu, "experts weights", &weights, slots * 4)?;
        check_range(gpu, "experts output", &out, mt * d * 4)?;
        let scratch = |label: &str, floats: u64| {
            scoped(gpu, label, || {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: floats * 4,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            })
        };
        let hidden = scratch("experts hidden", slots * ff)?;
        let contrib = scratch("experts contributions", slots * d)?;
        let h = BufRange::whole(&hidden);
        let c = BufRange::whole(&contrib);
        check_range(gpu, "experts hidden", &h, slots * ff * 4)?;
        check_range(gpu, "experts contributions", &c, slots * d * 4)?;
        let mut chunk_dispatches = Vec::new();
        // (which pipeline, part, mode, input, output, n_in, n_rows).
        type Part<'a> = (u8, &'a GpuTensor, u32, &'a BufRange, &'a BufRange, u64, u64);
        let plan: [Part; 3] = [
            (0, gate, MODE_GATE, &x, &h, d, ff),
            (1, up, MODE_UP, &x, &h, d, ff),
            (2, down, MODE_DOWN, &h, &c, ff, d),
        ];
        for (which, t, mode, input, output, n_in, n_rows) in plan {
            let (gx, gy) = fold(n_rows.div_ceil(self.rows as u64));
            for ch in &t.chunks {
                let p = MatmulParams {
                    n_in: n_in as u32,
                    n_rows: n_rows as u32,
                    row_bytes: t.row_bytes as u32,
                    rows_per_group: n_rows as u32,
                    x_stride: n_in as u32,
                    out_stride: n_rows as u32,
                    grid_x: gx,
                    expert0: ch.first as u32,
                    n_experts: ch.count as u32,
                    k: k as u32,
                    mode,
                    clamp,
                    ..Default::default()
                };
                let pb = self.params_buffer(gpu, &p);
                let bg = scoped(gpu, "experts bind group", || {
                    self.bind_group(
                        gpu,
                        &pb,
                        step,
                        Some(&ch.buffer),
                        input,
                        output,
                        Some(&selected),
                        Some(&weights),
                    )
                })?;
                chunk_dispatches.push((which, bg, gx, gy));
            }
        }
        let mid_round = if mid_fp8 {
            let (gx, gy) = fold(ff.div_ceil(32).div_ceil(64));
            let p = MatmulParams {
                n_rows: ff as u32,
                grid_x: gx,
                k: k as u32,
                ..Default::default()
            };
            let pb = self.params_buffer(gpu, &p);
            // In place in the hidden rows (OUT); X is bound but not read.
            let bg = scoped(gpu, "experts bind group", || {
                self.bind_group(gpu, &pb, step, None, &c, &h, None, None)
            })?;
            let pipe = self.pipeline(gpu, Entry::ExpertMidRound, GgmlType::F32)?;
            Some((pipe, bg, gx, gy))
        } else {
            None
        };
        let (gx, gy) = fold(d.div_ceil(WORKGROUP as u64));
        let p = MatmulParams {
            n_rows: d as u32,
            out_stride: d as u32,
            grid_x: gx,
            k: k as u32,
            ..Default::default()
        };
        let pb = self.params_buffer(gpu, &p);
        let bg = scoped(gpu, "experts bind group", || {
            self.bind_group(gpu, &pb, step, None, &c, &out, None, None)
        })?;
        Ok(RoutedExperts {
            rows_gate: self.pipeline(gpu, Entry::ExpertRows, gate.ty)?,
            rows: self.pipeline(gpu, Entry::ExpertRows, up.ty)?,
            rows_down: self.pipeline(gpu, Entry::ExpertRows, down.ty)?,
            sum: self.pipeline(gpu, Entry::ExpertSum, GgmlType::F32)?,
            chunk_dispatches,
            mid_round,
            sum_dispatch: (bg, gx, gy),
            k: k as u32,
            max_tokens,
            hidden,
            contrib,
        })
    }
}

impl DenseMatmul {
    /// Records the product for a step of `n_tokens` tokens (at most the
    /// `max_tokens` it was built for; more are clamped).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let n = n_tokens.min(self.max_tokens as u32);
        if n == 0 {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        for (bg, gx, gy) in &self.dispatches {
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(*gx, *gy, n.div_ceil(TILE_TOKENS));
        }
    }
}

impl RoutedExperts {
    /// Records gate, up (+ SwiGLU and routing weight), down per weight chunk,
    /// then the sum over slots.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.encode_rows(pass, n_tokens);
        self.encode_sum(pass, n_tokens);
    }

    /// Gate, up, down for the selected entries (entries whose expert id is
    /// outside the tensor, −1 included, are skipped and keep their
    /// contributions: a streamed pass runs these in rounds).
    pub fn encode_rows(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let n = n_tokens.min(self.max_tokens as u32);
        if n == 0 {
            return;
        }
        let mut mid_pending = self.mid_round.as_ref();
        for (which, bg, gx, gy) in &self.chunk_dispatches {
            if *which == 2 {
                if let Some((pipe, mbg, mx, my)) = mid_pending.take() {
                    pass.set_pipeline(pipe);
                    pass.set_bind_group(0, mbg, &[]);
                    pass.dispatch_workgroups(*mx, *my, n * self.k);
                }
            }
            pass.set_pipeline(match which {
                0 => &self.rows_gate,
                1 => &self.rows,
                _ => &self.rows_down,
            });
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(*gx, *gy, n * self.k);
        }
    }

    /// The sum over each token's `k` contributions.
    pub fn encode_sum(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let n = n_tokens.min(self.max_tokens as u32);
        if n == 0 {
            return;
        }
        let (bg, gx, gy) = &self.sum_dispatch;
        pass.set_pipeline(&self.sum);
        pass.set_bind_group(0, bg, &[]);
        pass.dispatch_workgroups(*gx, *gy, n);
    }
}

/// Copies `r` back to the host (tests, benchmarks, dumps): one submit and a
/// wait. Not for the per-step path.
pub fn read_back(gpu: &Gpu, r: &BufRange) -> Result<Vec<u8>, BackendError> {
    let size = r.size.div_ceil(4) * 4;
    let staging = scoped(gpu, "read-back buffer", || {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    })?;
    let mut enc = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("read back"),
        });
    enc.copy_buffer_to_buffer(&r.buffer, r.offset, &staging, 0, size);
    gpu.queue.submit(Some(enc.finish()));
    let slice = staging.slice(..);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |res| {
        let _ = tx.send(res);
    });
    gpu.wait()?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(device_err(gpu, format!("read back: {e}"))),
        Err(_) => return Err(device_err(gpu, "read back: mapping never completed".into())),
    }
    let view = slice
        .get_mapped_range()
        .map_err(|e| device_err(gpu, format!("read back: {e}")))?;
    let out = view[..r.size as usize].to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}
