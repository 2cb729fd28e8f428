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
use super::matmul::{read_back, BufRange, DenseShape, MatmulKernels};
use super::shaders;
use super::weights::GpuTensor;
use super::StepUniform;
use crate::backend::kernels::{Entry, Family};
use crate::backend::BackendError;
use crate::quant::GgmlType;

pub use crate::backend::bandwidth::{
    bench_weights, csv_row, host_read, table_header, table_row, Measure, CSV_HEADER, FLASH_MATVECS,
};

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
            source: wgpu::ShaderSource::Wgsl(
                shaders::Module::of(Family::Bandwidth)
                    .source(shaders::Variant::FALLBACK)
                    .into(),
            ),
        });
    // Two access patterns (grid-strided: coalesced on GPUs; contiguous runs
    // per invocation: CPU emulators), each with its own grid; the faster one
    // is the device's read bandwidth.
    let mut best: Option<(f64, &'static str)> = None;
    for (entry, groups) in [(Entry::ReadAll, threads / 256), (Entry::ReadBlocked, 64u32)] {
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
                label: Some(entry.name()),
                layout: None,
                module: &module,
                entry_point: Some(entry.name()),
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
                ..Default::default()
            }),
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let shape = DenseShape {
        n_in: n_in as usize,
        n_out: n_out as usize,
        groups: 1,
    };
    let mm = kernels.dense(
        gpu,
        &w,
        shape,
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

/// The whole report as `ds4-bench --bandwidth` prints it: the table on
/// stdout line by line, the CSV lines returned. `gpus`: one adapter opened
/// once per kernel variant to compare (see [`run`]).
pub fn report(
    gpus: &[&Gpu],
    buffer_bytes: u64,
    trials: usize,
    rows: &[u32],
) -> Result<Vec<String>, BackendError> {
    let Some(first) = gpus.first() else {
        return Ok(Vec::new());
    };
    crate::backend::bandwidth::print_report(&first.describe(), buffer_bytes, trials, |each| {
        run(gpus, buffer_bytes, trials, FLASH_MATVECS, rows, each).map(|_| ())
    })
}
