//! Bandwidth of the device through wgpu and of each matvec kernel at the
//! Flash shapes (`ds4-bench --bandwidth`, `cargo bench --bench gpu_bandwidth`).
//!
//! Decode reads every active weight once per token, so a matvec kernel's
//! speed is judged as weight bytes ÷ time, against the device's own read
//! bandwidth measured by a trivial streaming kernel (shaders/bandwidth.wgsl).
//! Times come from timestamp queries at compute-pass boundaries where the
//! adapter has them, else from the wall clock around a submit and a wait
//! (which then includes the submit overhead). Each figure is the best of a
//! few trials, each trial running the kernel enough times to last ~0.2 s.

use std::time::Instant;

use wgpu::util::DeviceExt;

use super::gpu::Gpu;
use super::matmul::{read_back, BufRange, MatmulKernels};
use super::shaders;
use super::weights::GpuTensor;
use super::StepUniform;
use crate::backend::BackendError;
use crate::quant::{self, GgmlType};

/// Parameters of shaders/bandwidth.wgsl (same layout as its `BandwidthParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BandwidthParams {
    /// 16-byte words to read.
    pub n_words: u32,
    /// Invocations in the grid.
    pub n_threads: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// One measured line of the table.
#[derive(Clone, Debug)]
pub struct Measure {
    /// What was measured ("device read", "matvec", ...).
    pub kind: String,
    /// The shape's name at Flash width ("q-lora", "head", ...), empty otherwise.
    pub name: String,
    /// Weight type of a matvec, empty otherwise.
    pub ty: String,
    pub n_in: u64,
    pub n_out: u64,
    /// Bytes read (for a copy: bytes copied) per run.
    pub bytes: u64,
    /// Seconds per run.
    pub seconds: f64,
    /// "timestamp" or "wall".
    pub timer: &'static str,
    /// Matvec: weight rows per workgroup of the kernel (0 otherwise).
    pub rows: u32,
    /// Matvec and decode step: the kernel variant (`plain` or `subgroups`,
    /// see shaders::Variant); empty otherwise.
    pub kernels: String,
}

impl Measure {
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

/// The matvec shapes of DeepSeek V4 Flash the benchmark runs:
/// (name, type, n_in, n_out).
pub const FLASH_MATVECS: &[(&str, GgmlType, u64, u64)] = &[
    ("q-lora (attn_q_a)", GgmlType::Q8_0, 4096, 1024),
    ("q-up (attn_q_b)", GgmlType::Q8_0, 1024, 32768),
    ("expert down", GgmlType::Iq2Xxs, 2048, 4096),
    ("expert down", GgmlType::Q2K, 2048, 4096),
    ("expert down", GgmlType::Q4K, 2048, 4096),
    ("expert down", GgmlType::Mxfp4, 2048, 4096),
    ("expert gate/up", GgmlType::Iq2Xxs, 4096, 2048),
    ("output head", GgmlType::Q8_0, 4096, 129280),
];

fn device_err(gpu: &Gpu, msg: String) -> BackendError {
    BackendError::Device {
        device: gpu.describe(),
        msg,
    }
}

/// Times `record` (which records one run into a compute pass) and returns
/// (seconds per run, timer). `runs` runs are recorded into one pass.
fn time_pass(
    gpu: &Gpu,
    runs: u32,
    record: &dyn Fn(&mut wgpu::ComputePass<'_>),
) -> Result<(f64, &'static str), BackendError> {
    let stamps = gpu.features.contains(wgpu::Features::TIMESTAMP_QUERY);
    let qs = stamps.then(|| {
        gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bandwidth"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let resolve = stamps.then(|| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bandwidth timestamps"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    });
    let mut enc = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bandwidth"),
        });
    {
        let tw = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
            query_set: q,
            beginning_of_pass_write_index: Some(0),
            end_of_pass_write_index: Some(1),
        });
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("bandwidth"),
            timestamp_writes: tw,
        });
        for _ in 0..runs {
            record(&mut pass);
        }
    }
    if let (Some(q), Some(r)) = (&qs, &resolve) {
        enc.resolve_query_set(q, 0..2, r, 0);
    }
    let t = Instant::now();
    gpu.queue.submit(Some(enc.finish()));
    gpu.wait()?;
    let wall = t.elapsed().as_secs_f64();
    if let Some(r) = &resolve {
        let b = read_back(gpu, &BufRange::whole(r))?;
        let t0 = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let t1 = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        let ns = t1.saturating_sub(t0) as f64 * gpu.queue.get_timestamp_period() as f64;
        // Some drivers report zeros (e.g. macOS 26): fall back to the wall clock.
        if ns > 0.0 {
            return Ok((ns / 1e9 / runs as f64, "timestamp"));
        }
    }
    Ok((wall / runs as f64, "wall"))
}

/// Best of `trials`, each trial long enough (~0.2 s) to hide timer noise.
fn best_time(
    gpu: &Gpu,
    trials: usize,
    record: &dyn Fn(&mut wgpu::ComputePass<'_>),
) -> Result<(f64, &'static str), BackendError> {
    // Warm-up run (pipeline compilation, first-touch of the memory).
    let (once, _) = time_pass(gpu, 1, record)?;
    let runs = ((0.2 / once.max(1e-6)) as u32).clamp(1, 200);
    let mut best = (f64::INFINITY, "wall");
    for _ in 0..trials.max(1) {
        let m = time_pass(gpu, runs, record)?;
        if m.0 < best.0 {
            best = m;
        }
    }
    Ok(best)
}

/// Read bandwidth of a streaming kernel over a buffer of up to `bytes`
/// (limited by the storage binding size).
pub fn device_read(gpu: &Gpu, bytes: u64, trials: usize) -> Result<Measure, BackendError> {
    let size = bytes.min(gpu.max_binding()).min(1 << 32) / 256 * 256;
    let src = filled_buffer(gpu, size)?;
    let threads: u32 = 256 * 1024;
    let sink = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bandwidth sink"),
        size: threads as u64 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("bandwidth"),
            source: wgpu::ShaderSource::Wgsl(shaders::module_source("bandwidth").into()),
        });
    // Two access patterns (grid-strided: coalesced on GPUs; contiguous runs
    // per invocation: CPU emulators), each with its own grid; the faster one
    // is the device's read bandwidth.
    let mut best: Option<(f64, &'static str)> = None;
    for (entry, groups) in [("read_all", threads / 256), ("read_blocked", 64u32)] {
        let n_threads = groups * 256;
        let params = BandwidthParams {
            n_words: (size / 16) as u32,
            n_threads,
            ..Default::default()
        };
        let pbuf = gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("bandwidth params"),
                contents: bytemuck::bytes_of(&params),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let pipeline = gpu
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        let bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("bandwidth"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: pbuf.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: sink.as_entire_binding(),
                },
            ],
        });
        gpu.check()?;
        let m = best_time(gpu, trials, &|p| {
            p.set_pipeline(&pipeline);
            p.set_bind_group(0, &bg, &[]);
            p.dispatch_workgroups(groups, 1, 1);
        })?;
        if best.is_none_or(|b| m.0 < b.0) {
            best = Some(m);
        }
    }
    let (seconds, timer) = best.expect("two patterns measured");
    Ok(Measure {
        kind: "device read".into(),
        name: String::new(),
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes: size,
        seconds,
        timer,
        rows: 0,
        kernels: String::new(),
    })
}

/// A buffer of `size` bytes filled with a non-zero pattern in 16 MiB pieces.
fn filled_buffer(gpu: &Gpu, size: u64) -> Result<wgpu::Buffer, BackendError> {
    let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bandwidth source"),
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let piece: Vec<u8> = (0..(16u64 << 20).min(size))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut off = 0;
    while off < size {
        let n = (piece.len() as u64).min(size - off);
        gpu.queue.write_buffer(&buf, off, &piece[..n as usize]);
        off += n;
    }
    gpu.queue.submit(None);
    gpu.wait()?;
    Ok(buf)
}

/// Buffer-to-buffer copy bandwidth (bytes copied per second: each byte is
/// read once and written once), timed by the wall clock around the submit.
pub fn device_copy(gpu: &Gpu, bytes: u64, trials: usize) -> Result<Measure, BackendError> {
    let size = bytes.min(gpu.limits.max_buffer_size) / 256 * 256;
    let src = filled_buffer(gpu, size)?;
    let dst = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bandwidth copy"),
        size,
        usage: wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let copy = |runs: u32| -> Result<f64, BackendError> {
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for _ in 0..runs {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        let t = Instant::now();
        gpu.queue.submit(Some(enc.finish()));
        gpu.wait()?;
        Ok(t.elapsed().as_secs_f64() / runs as f64)
    };
    let once = copy(1)?;
    let runs = ((0.2 / once.max(1e-6)) as u32).clamp(1, 100);
    let mut best = f64::INFINITY;
    for _ in 0..trials.max(1) {
        best = best.min(copy(runs)?);
    }
    Ok(Measure {
        kind: "device copy".into(),
        name: String::new(),
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes: size,
        seconds: best,
        timer: "wall",
        rows: 0,
        kernels: String::new(),
    })
}

/// Weight bytes for a benchmark: a pool of rows made by the real quantizer,
/// repeated (decode speed does not depend on the values, only on them
/// being ordinary numbers).
pub fn bench_weights(ty: GgmlType, n_in: u64, n_out: u64) -> Result<Vec<u8>, String> {
    let rb = ty
        .row_bytes(n_in)
        .ok_or_else(|| format!("{n_in} is not a whole number of {ty} blocks"))?
        as usize;
    let pool_rows = 16usize.min(n_out as usize);
    let mut pool = vec![0u8; rb * pool_rows];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for r in 0..pool_rows {
        let v: Vec<f32> = (0..n_in)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        quant::quantize_row(ty, &v, &mut pool[r * rb..(r + 1) * rb], None)
            .map_err(|e| e.to_string())?;
    }
    let mut out = Vec::with_capacity(rb * n_out as usize);
    for r in 0..n_out as usize {
        let p = (r * 7) % pool_rows;
        out.extend_from_slice(&pool[p * rb..(p + 1) * rb]);
    }
    Ok(out)
}

/// One decode-token matvec (`n_tokens` = 1) of the given shape.
pub fn matvec(
    gpu: &Gpu,
    kernels: &MatmulKernels,
    name: &str,
    ty: GgmlType,
    n_in: u64,
    n_out: u64,
    trials: usize,
) -> Result<Measure, BackendError> {
    let bytes = bench_weights(ty, n_in, n_out).map_err(|e| device_err(gpu, e))?;
    let w = GpuTensor::upload(gpu, name, ty, [n_in, n_out, 1, 1], &bytes, &mut |_| {})?;
    drop(bytes);
    let x: Vec<f32> = (0..n_in).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let xb = gpu
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("bandwidth x"),
            contents: bytemuck::cast_slice(&x),
            usage: wgpu::BufferUsages::STORAGE,
        });
    let out = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bandwidth out"),
        size: n_out * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let step = gpu
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("bandwidth step"),
            contents: bytemuck::bytes_of(&StepUniform {
                pos0: 0,
                n_tokens: 1,
                _pad: [0; 2],
            }),
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let mm = kernels.dense(
        gpu,
        &w,
        1,
        BufRange::whole(&xb),
        BufRange::whole(&out),
        &step,
        1,
    )?;
    let (seconds, timer) = best_time(gpu, trials, &|p| mm.encode(p, 1))?;
    Ok(Measure {
        kind: "matvec".into(),
        name: name.into(),
        ty: ty.name().into(),
        n_in,
        n_out,
        bytes: w.data_bytes(),
        seconds,
        timer,
        rows: kernels.rows(),
        kernels: gpu.shader_variant().name().into(),
    })
}

/// Runs the whole benchmark: device read and copy (on the first device),
/// then every Flash matvec on each device in `gpus` (the same adapter opened
/// with different optional features: subgroup and fallback kernels side by
/// side) with each kernel variant in `rows` (weight rows per workgroup;
/// empty: the backend's default); `each` sees every line as soon as it is
/// measured.
pub fn run(
    gpus: &[&Gpu],
    buffer_bytes: u64,
    trials: usize,
    shapes: &[(&str, GgmlType, u64, u64)],
    rows: &[u32],
    each: &mut dyn FnMut(&Measure),
) -> Result<Vec<Measure>, BackendError> {
    let Some(&first) = gpus.first() else {
        return Ok(Vec::new());
    };
    let mut all = Vec::new();
    let mut push = |m: Measure, all: &mut Vec<Measure>| {
        each(&m);
        all.push(m);
    };
    push(device_read(first, buffer_bytes, trials)?, &mut all);
    push(device_copy(first, buffer_bytes, trials)?, &mut all);
    let mut kernels = Vec::new();
    for &gpu in gpus {
        if rows.is_empty() {
            kernels.push((gpu, MatmulKernels::new(gpu)?));
        } else {
            for &r in rows {
                kernels.push((gpu, MatmulKernels::with_rows(gpu, r)?));
            }
        }
    }
    for &(name, ty, n_in, n_out) in shapes {
        for (gpu, k) in &kernels {
            push(matvec(gpu, k, name, ty, n_in, n_out, trials)?, &mut all);
        }
    }
    Ok(all)
}

/// The host's read bandwidth (src/bandwidth.rs) as a table line: the ceiling
/// of the CPU backend.
pub fn host_read(bytes: u64, reps: usize) -> Measure {
    let bw = crate::bandwidth::read_bandwidth(bytes as usize, reps);
    Measure {
        kind: "host read (CPU)".into(),
        name: String::new(),
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes,
        seconds: bytes as f64 / bw,
        timer: "wall",
        rows: 0,
        kernels: String::new(),
    }
}

/// Header of the terminal table.
pub fn table_header() -> String {
    format!(
        "{:<16} {:<20} {:<8} {:>13} {:>4} {:<9} {:>8} {:>10} {:>8} {:>8}  {}",
        "what",
        "shape",
        "type",
        "in x out",
        "rows",
        "kernels",
        "MiB",
        "ms",
        "GB/s",
        "of read",
        "timer"
    )
}

/// One line of the terminal table; `read_gbps` is the device read bandwidth
/// the fraction is taken of (None for the lines measured before it).
pub fn table_row(m: &Measure, read_gbps: Option<f64>) -> String {
    let dims = if m.n_in > 0 {
        format!("{}x{}", m.n_in, m.n_out)
    } else {
        String::new()
    };
    let frac = match read_gbps {
        Some(r) if m.kind != "host read (CPU)" => format!("{:.1} %", 100.0 * m.gb_per_s() / r),
        _ => String::new(),
    };
    let rows = if m.rows > 0 {
        m.rows.to_string()
    } else {
        String::new()
    };
    format!(
        "{:<16} {:<20} {:<8} {:>13} {:>4} {:<9} {:>8.1} {:>10.3} {:>8.2} {:>8}  {}",
        m.kind,
        m.name,
        m.ty,
        dims,
        rows,
        m.kernels,
        m.bytes as f64 / (1u64 << 20) as f64,
        m.seconds * 1e3,
        m.gb_per_s(),
        frac,
        m.timer
    )
}

pub const CSV_HEADER: &str =
    "device,what,shape,type,n_in,n_out,rows_per_workgroup,bytes,seconds,gb_per_s,fraction_of_device_read,timer,kernels";

pub fn csv_row(device: &str, m: &Measure, read_gbps: Option<f64>) -> String {
    let frac = match read_gbps {
        Some(r) if m.kind != "host read (CPU)" => format!("{:.4}", m.gb_per_s() / r),
        _ => String::new(),
    };
    let q = |s: &str| format!("\"{}\"", s.replace('"', "'"));
    format!(
        "{},{},{},{},{},{},{},{},{:.6e},{:.3},{},{},{}",
        q(device),
        q(&m.kind),
        q(&m.name),
        m.ty,
        m.n_in,
        m.n_out,
        m.rows,
        m.bytes,
        m.seconds,
        m.gb_per_s(),
        frac,
        m.timer,
        m.kernels
    )
}

/// The whole report as `ds4-bench --bandwidth` prints it: the table on
/// stdout line by line, the CSV lines returned. `gpus`: one adapter opened
/// once per kernel variant to compare (see [`run`]).
pub fn report(
    gpus: &[&Gpu],
    buffer_bytes: u64,
    trials: usize,
    rows: &[u32],
) -> Result<Vec<String>, BackendError> {
    report_shapes(gpus, buffer_bytes, trials, rows, FLASH_MATVECS)
}

/// [`report`] over the matvec shapes in `shapes` (a subset of
/// [`FLASH_MATVECS`]).
pub fn report_shapes(
    gpus: &[&Gpu],
    buffer_bytes: u64,
    trials: usize,
    rows: &[u32],
    shapes: &[(&str, GgmlType, u64, u64)],
) -> Result<Vec<String>, BackendError> {
    let Some(first) = gpus.first() else {
        return Ok(Vec::new());
    };
    let device = first.describe();
    println!("device: {device}");
    println!("{}", table_header());
    let host = host_read(buffer_bytes, trials.max(3));
    println!("{}", table_row(&host, None));
    let mut csv = vec![CSV_HEADER.to_string(), csv_row(&device, &host, None)];
    let mut read_gbps: Option<f64> = None;
    run(gpus, buffer_bytes, trials, shapes, rows, &mut |m| {
        if m.kind == "device read" {
            read_gbps = Some(m.gb_per_s());
        }
        println!("{}", table_row(m, read_gbps));
        csv.push(csv_row(&device, m, read_gbps));
    })?;
    Ok(csv)
}
