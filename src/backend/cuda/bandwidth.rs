//! Bandwidth of the CUDA device and of each matvec kernel at the Flash
//! shapes (`ds4-bench --bandwidth --backend cuda`, `ds4 --info --backend
//! cuda`): the CUDA twin of backend/wgpu/bandwidth.rs, printing the same
//! table and CSV (src/bandwidth.rs).
//!
//! Decode reads every active weight once per token, so a matvec kernel is
//! judged as weight bytes ÷ time against the device's own read bandwidth,
//! measured by a streaming kernel (cuda/bandwidth.cu `read_all`). Copies use
//! `cuMemcpyDtoDAsync`. Times come from CUDA events recorded on the stream
//! around `runs` back-to-back launches; each figure is the best of a few
//! trials, each trial long enough (~0.2 s) to hide the event resolution.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUfunction};

use super::device::{self, device_err, Device};
use super::kernels::Kernel;
use super::launch::Arg;
use super::mem::{checked, DevBuf};
use super::modules::Modules;
use super::StepDev;
use crate::backend::bandwidth::{bench_weights, Measure};
use crate::backend::kernels::{Entry, Family};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Weight rows per block of `matmul_*` and `expert_*` (MM_ROWS, EX_ROWS).
const ROWS_PER_BLOCK: u32 = 8;

/// An opened device with the kernels the benchmark launches.
pub struct Bench {
    // Dropped before the device (field order).
    step: DevBuf,
    modules: Modules,
    dev: Device,
}

impl Bench {
    /// Opens device `opts.cuda_device` (default 0) and loads the bandwidth,
    /// matmul and moe kernels; errors say plainly why CUDA is not usable.
    pub fn open(opts: &crate::backend::BackendOptions) -> Result<Bench, BackendError> {
        let dev = Device::open(device::chosen_ordinal(opts)?)?;
        let modules = Modules::load(
            &dev,
            &[Family::Bandwidth, Family::Matmul, Family::Moe],
            opts,
        )?;
        let step = DevBuf::from_bytes(bytemuck::bytes_of(&StepDev {
            pos0: 0,
            n_tokens: 1,
            ..Default::default()
        }))?;
        Ok(Bench { step, modules, dev })
    }

    /// The device as the table's first line names it.
    pub fn describe(&self) -> String {
        let i = &self.dev.info;
        format!(
            "{} (cuda, sm_{}{}, {:.1} GiB{}, PTX compute_{} by NVRTC {}.{})",
            i.name,
            i.cc.0,
            i.cc.1,
            i.total_mem as f64 / (1u64 << 30) as f64,
            if i.integrated { ", unified memory" } else { "" },
            self.modules.arch,
            self.modules.nvrtc.0,
            self.modules.nvrtc.1
        )
    }

    fn launch(
        &self,
        f: CUfunction,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        let mut storage: Vec<u64> = args.iter().map(|a| a.bits()).collect();
        let mut params: Vec<*mut c_void> = storage
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the kernel's parameters are `args` in order, each in its
        // own 8-byte cell; the pointers are live allocations of the caller.
        checked("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                0,
                self.dev.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Seconds per run of `enqueue` (which enqueues one run on the stream),
    /// timed by two events around `runs` runs.
    fn time(
        &self,
        runs: u32,
        enqueue: &dyn Fn() -> Result<(), BackendError>,
    ) -> Result<f64, BackendError> {
        let mut ev: [sys::CUevent; 2] = [std::ptr::null_mut(); 2];
        for e in &mut ev {
            // SAFETY: out-pointer to a local; destroyed below.
            checked("cuEventCreate", unsafe { sys::cuEventCreate(e, 0) })?;
        }
        let r = (|| {
            // SAFETY: events created above, our stream.
            checked("cuEventRecord", unsafe {
                sys::cuEventRecord(ev[0], self.dev.stream)
            })?;
            for _ in 0..runs {
                enqueue()?;
            }
            // SAFETY: as above.
            checked("cuEventRecord", unsafe {
                sys::cuEventRecord(ev[1], self.dev.stream)
            })?;
            // SAFETY: a recorded event.
            checked("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(ev[1])
            })?;
            let mut ms = 0f32;
            // SAFETY: both events recorded and complete.
            checked("cuEventElapsedTime", unsafe {
                sys::cuEventElapsedTime(&mut ms, ev[0], ev[1])
            })?;
            Ok(ms as f64 / 1e3 / runs as f64)
        })();
        for e in ev {
            // SAFETY: created above, destroyed once.
            unsafe {
                let _ = sys::cuEventDestroy_v2(e);
            }
        }
        r
    }

    /// Best of `trials`, each long enough (~0.2 s) to hide timer noise,
    /// after one warm-up run (module load, first touch of the memory).
    fn best_time(
        &self,
        trials: usize,
        enqueue: &dyn Fn() -> Result<(), BackendError>,
    ) -> Result<f64, BackendError> {
        let once = self.time(1, enqueue)?;
        let runs = ((0.2 / once.max(1e-6)) as u32).clamp(1, 200);
        let mut best = f64::INFINITY;
        for _ in 0..trials.max(1) {
            best = best.min(self.time(runs, enqueue)?);
        }
        // A zero (a timer coarser than the run) would print infinite GB/s.
        Ok(best.max(1e-9))
    }

    /// A device buffer of `size` bytes filled with a non-zero pattern.
    fn filled(&self, size: usize) -> Result<DevBuf, BackendError> {
        let buf = DevBuf::alloc(size)?;
        let piece: Vec<u8> = (0..(16usize << 20).min(size))
            .map(|i| ((i as u64).wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut off = 0;
        while off < size {
            let n = piece.len().min(size - off);
            super::mem::upload(buf.ptr + off as u64, &piece[..n])?;
            off += n;
        }
        Ok(buf)
    }

    /// Read bandwidth of `read_all` over a buffer of `bytes`.
    pub fn device_read(&self, bytes: u64, trials: usize) -> Result<Measure, BackendError> {
        let size = (bytes / 256 * 256).max(256) as usize;
        let src = self.filled(size)?;
        let words = (size / 16) as u64;
        let blocks = (self.dev.info.sms.max(1) * 32).min(words.div_ceil(256) as u32);
        let sink = DevBuf::alloc(blocks as usize * 256 * 4)?;
        let f = self.modules.func(Entry::ReadAll)?;
        let args = [Arg::Ptr(src.ptr), Arg::U64(words), Arg::Ptr(sink.ptr)];
        let seconds = self.best_time(trials, &|| self.launch(f, (blocks, 1), 256, &args))?;
        Ok(line("device read", "", "", 0, 0, size as u64, seconds, 0))
    }

    /// Device-to-device copy bandwidth (bytes copied per second: each byte
    /// is read once and written once).
    pub fn device_copy(&self, bytes: u64, trials: usize) -> Result<Measure, BackendError> {
        let size = (bytes / 256 * 256).max(256) as usize;
        let src = self.filled(size)?;
        let dst = DevBuf::alloc(size)?;
        let copy = || {
            // SAFETY: two live allocations of `size` bytes; our stream.
            checked("cuMemcpyDtoDAsync", unsafe {
                sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, size, self.dev.stream)
            })
        };
        let seconds = self.best_time(trials, &copy)?;
        Ok(line("device copy", "", "", 0, 0, size as u64, seconds, 0))
    }

    /// One decode-token matvec (`matmul_<type>`, one token) of the shape.
    pub fn matvec(
        &self,
        name: &str,
        ty: GgmlType,
        n_in: u64,
        n_out: u64,
        trials: usize,
    ) -> Result<Measure, BackendError> {
        let f = self.modules.func(Kernel::typed(Entry::MatMul, ty))?;
        let w = weights(ty, n_in, n_out)?;
        let row_bytes = w.bytes as u64 / n_out;
        let x = DevBuf::from_f32(&activations(n_in))?;
        let out = DevBuf::alloc(n_out as usize * 4)?;
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U32(row_bytes as u32),
            Arg::U32(n_in as u32),
            Arg::U32(n_out as u32),
            Arg::U32(1),
            Arg::Ptr(x.ptr),
            Arg::Ptr(out.ptr),
            Arg::U32(0),
            Arg::Ptr(self.step.ptr),
        ];
        let grid = ((n_out as u32).div_ceil(ROWS_PER_BLOCK), 1);
        let seconds = self.best_time(trials, &|| self.launch(f, grid, 256, &args))?;
        Ok(line(
            "matvec",
            name,
            ty.name(),
            n_in,
            n_out,
            w.bytes as u64,
            seconds,
            ROWS_PER_BLOCK,
        ))
    }

    /// The fused routed-expert gate+up kernel (`expert_gate_up_<type>`) for
    /// one token and one selected expert: both `n_in × ff` matrices are
    /// read, so the bytes are twice one matrix.
    pub fn fused_gate_up(
        &self,
        ty: GgmlType,
        n_in: u64,
        ff: u64,
        trials: usize,
    ) -> Result<Measure, BackendError> {
        let f = self.modules.func(Kernel::typed(Entry::ExpertGateUp, ty))?;
        let gate = weights(ty, n_in, ff)?;
        let up = weights(ty, n_in, ff)?;
        let row_bytes = gate.bytes as u64 / ff;
        let x = DevBuf::from_f32(&activations(n_in))?;
        let sel = DevBuf::from_bytes(bytemuck::bytes_of(&0i32))?;
        let wts = DevBuf::from_f32(&[1.0])?;
        let h = DevBuf::alloc(ff as usize * 4)?;
        let args = [
            Arg::Ptr(gate.ptr),
            Arg::Ptr(up.ptr),
            Arg::U32(row_bytes as u32),
            Arg::U64(gate.bytes as u64),
            Arg::U32(1),
            Arg::U32(n_in as u32),
            Arg::U32(ff as u32),
            Arg::Ptr(x.ptr),
            Arg::Ptr(sel.ptr),
            Arg::Ptr(wts.ptr),
            Arg::U32(1),
            Arg::F32(10.0),
            Arg::Ptr(h.ptr),
            Arg::Ptr(self.step.ptr),
        ];
        let grid = ((ff as u32).div_ceil(ROWS_PER_BLOCK), 1);
        let seconds = self.best_time(trials, &|| self.launch(f, grid, 256, &args))?;
        Ok(line(
            "fused gate+up",
            "expert gate+up",
            ty.name(),
            n_in,
            ff,
            2 * gate.bytes as u64,
            seconds,
            ROWS_PER_BLOCK,
        ))
    }
}

/// Benchmark weights (src/bandwidth.rs `bench_weights`) on the device.
fn weights(ty: GgmlType, n_in: u64, n_out: u64) -> Result<DevBuf, BackendError> {
    let bytes = bench_weights(ty, n_in, n_out).map_err(|e| device_err("weights", e))?;
    DevBuf::from_bytes(&bytes)
}

fn activations(n: u64) -> Vec<f32> {
    (0..n).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect()
}

#[allow(clippy::too_many_arguments)]
fn line(
    kind: &str,
    name: &str,
    ty: &str,
    n_in: u64,
    n_out: u64,
    bytes: u64,
    seconds: f64,
    rows: u32,
) -> Measure {
    Measure {
        kind: kind.into(),
        name: name.into(),
        ty: ty.into(),
        n_in,
        n_out,
        bytes,
        seconds,
        timer: "event",
        rows,
        kernels: String::new(),
    }
}

/// Runs the whole benchmark: device read and copy, every matvec of
/// `shapes` (name, type, n_in, n_out), then the fused gate+up kernel at
/// the routed-expert shape of `shapes` (IQ2_XXS, as Flash stores them);
/// `each` sees every line as soon as it is measured.
pub fn run(
    bench: &Bench,
    buffer_bytes: u64,
    trials: usize,
    shapes: &[(&str, GgmlType, u64, u64)],
    each: &mut dyn FnMut(&Measure),
) -> Result<(), BackendError> {
    each(&bench.device_read(buffer_bytes, trials)?);
    each(&bench.device_copy(buffer_bytes, trials)?);
    for &(name, ty, n_in, n_out) in shapes {
        each(&bench.matvec(name, ty, n_in, n_out, trials)?);
    }
    for &(name, ty, n_in, n_out) in shapes {
        if name == "expert gate/up" {
            each(&bench.fused_gate_up(ty, n_in, n_out, trials)?);
        }
    }
    Ok(())
}
