//! Weights on the device. On unified-memory devices (GB10, Jetson) the
//! mmap'd file is registered with the driver and read in place (no second
//! copy); elsewhere, or when registration is refused, each tensor a graph
//! uses is uploaded once, in chunks, with a progress bar for large models.
//! `DS4_CUDA_WEIGHTS=upload|register` forces one way.

use std::collections::HashMap;

use cudarc::driver::sys::{self, CUdeviceptr};

use super::device::DeviceInfo;
use super::mem::{upload, DevBuf};
use crate::backend::BackendError;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;

/// Chunk size of uploads (progress granularity).
const CHUNK: usize = 64 << 20;
/// Models above this size show an upload progress bar.
const PROGRESS_ABOVE: u64 = 1 << 30;

/// The registered mapping: device address of the file's first byte.
struct Registered {
    host: *mut std::ffi::c_void,
    dev_base: CUdeviceptr,
    offset: u64,
}

pub struct Weights {
    registered: Option<Registered>,
    uploaded: HashMap<String, DevBuf>,
    /// Small tensors widened to f32 (norms, sinks, biases, mixers).
    small: HashMap<String, DevBuf>,
    /// How the weights are reached, for the device line.
    pub mode: &'static str,
}

// SAFETY: the raw host pointer is only used to unregister on drop.
unsafe impl Send for Weights {}

impl Weights {
    /// Registers the file's mapping on unified-memory devices when allowed;
    /// `force` (`upload` or `register`, `DS4_CUDA_WEIGHTS`) picks one way.
    pub fn new(file: &GgufFile, info: &DeviceInfo, force: Option<&str>) -> Weights {
        let try_register = match force.unwrap_or_default() {
            "upload" => false,
            "register" => true,
            _ => info.integrated && info.can_map_host,
        };
        let registered = if try_register { register(file) } else { None };
        Weights {
            mode: if registered.is_some() {
                "weights in place (host-registered mmap)"
            } else {
                "weights uploaded"
            },
            registered,
            uploaded: HashMap::new(),
            small: HashMap::new(),
        }
    }

    /// Device address of a tensor's stored bytes (uploading it the first
    /// time when the file is not registered).
    pub fn tensor(
        &mut self,
        file: &GgufFile,
        t: &TensorRef,
        progress: &mut Progress,
    ) -> Result<CUdeviceptr, BackendError> {
        if let Some(r) = &self.registered {
            return Ok(r.dev_base + (t.offset - r.offset));
        }
        if let Some(b) = self.uploaded.get(&t.name) {
            return Ok(b.ptr);
        }
        let bytes = t.bytes(file);
        let buf = DevBuf::alloc(bytes.len())?;
        for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
            upload(buf.ptr + (i * CHUNK) as u64, chunk)?;
            progress.add(chunk.len() as u64);
        }
        let ptr = buf.ptr;
        self.uploaded.insert(t.name.clone(), buf);
        Ok(ptr)
    }

    /// A small tensor widened to f32 (any stored type), uploaded once.
    pub fn small_f32(
        &mut self,
        file: &GgufFile,
        t: &TensorRef,
    ) -> Result<CUdeviceptr, BackendError> {
        if let Some(b) = self.small.get(&t.name) {
            return Ok(b.ptr);
        }
        let b = DevBuf::from_f32(&crate::graph::ops::load_f32(file, t))?;
        let ptr = b.ptr;
        self.small.insert(t.name.clone(), b);
        Ok(ptr)
    }
}

impl Drop for Weights {
    fn drop(&mut self) {
        if let Some(r) = &self.registered {
            // SAFETY: registered in `register`, once.
            unsafe {
                let _ = sys::cuMemHostUnregister(r.host);
            }
        }
    }
}

/// Page-aligned registration of the data section, read-only and mapped into
/// the device address space; `None` when the driver refuses.
fn register(file: &GgufFile) -> Option<Registered> {
    let len = file.file_len();
    let all = file.raw_bytes(0, len);
    let page = 4096u64.max(page_size());
    let start = file.data_offset() / page * page;
    let end = len.div_ceil(page) * page;
    // SAFETY: the mapping outlives the backend (the backend holds the file);
    // the range is inside the mapping's pages; the driver only reads it.
    unsafe {
        let host = all.as_ptr().add(start as usize) as *mut std::ffi::c_void;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        if sys::cuMemHostRegister_v2(host, (end - start) as usize, flags)
            != sys::CUresult::CUDA_SUCCESS
        {
            return None;
        }
        let mut dev: CUdeviceptr = 0;
        if sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) != sys::CUresult::CUDA_SUCCESS {
            let _ = sys::cuMemHostUnregister(host);
            return None;
        }
        Some(Registered {
            host,
            dev_base: dev,
            offset: start,
        })
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Upload progress: a bar on stderr for large models, silent otherwise.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        let bar = (total > PROGRESS_ABOVE).then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "uploading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        Progress { bar }
    }

    pub fn add(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
