//! The CUDA driver, loaded at run time by cudarc: presence check, device
//! listing, and the one device + context + stream the backend runs on.
//! cudarc panics when the driver library is missing, so every entry point
//! checks for it first and runs behind `catch_unwind`.

use cudarc::driver::{result, sys};

use crate::backend::BackendError;

/// One CUDA device as `--list-devices` shows it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    pub total_mem: u64,
    /// Shares memory with the host (GB10, Jetson): weights can stay in the
    /// mmap'd file.
    pub integrated: bool,
    pub can_map_host: bool,
    pub pageable_access: bool,
    pub sms: u32,
}

impl DeviceInfo {
    /// `121` for compute capability 12.1.
    pub fn cc_number(&self) -> u32 {
        self.cc.0 * 10 + self.cc.1
    }

    pub fn line(&self) -> String {
        format!(
            "cuda:{}  {}  sm_{}{}  {:.1} GiB{}  {} SMs",
            self.ordinal,
            self.name,
            self.cc.0,
            self.cc.1,
            self.total_mem as f64 / (1u64 << 30) as f64,
            if self.integrated { " (unified)" } else { "" },
            self.sms
        )
    }
}

pub fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: "cuda".into(),
        reason: reason.into(),
    }
}

pub fn device_err(what: &str, e: impl std::fmt::Debug) -> BackendError {
    BackendError::Device {
        device: "cuda".into(),
        msg: format!("{what}: {e:?}"),
    }
}

/// Runs `f` with cudarc's panics (missing library or symbol) turned into
/// errors.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "driver library failure".into());
            Err(unavailable(msg))
        }
    }
}

/// Loads and initialises the driver; an error says plainly why CUDA cannot
/// be used (no driver library, no device).
pub fn init_driver() -> Result<(), BackendError> {
    // SAFETY: only looks for the library (no symbol is called).
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "no NVIDIA driver found (libcuda.so could not be loaded); use --backend cpu or wgpu",
        ));
    }
    guarded(|| {
        result::init()
            .map_err(|e| unavailable(format!("cuInit failed: {e:?} (no usable NVIDIA GPU?)")))?;
        let n = result::device::get_count().map_err(|e| unavailable(format!("{e:?}")))?;
        if n <= 0 {
            return Err(unavailable("the driver reports no CUDA device"));
        }
        Ok(())
    })
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32, BackendError> {
    // SAFETY: `dev` came from cuDeviceGet.
    unsafe { result::device::get_attribute(dev, a) }
        .map_err(|e| device_err("cuDeviceGetAttribute", e))
}

fn info(ordinal: usize) -> Result<DeviceInfo, BackendError> {
    use sys::CUdevice_attribute::*;
    let dev = result::device::get(ordinal as i32).map_err(|e| device_err("cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| device_err("cuDeviceGetName", e))?;
    // SAFETY: as above.
    let total_mem =
        unsafe { result::device::total_mem(dev) }.map_err(|e| device_err("cuDeviceTotalMem", e))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        cc: (
            attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        ),
        total_mem: total_mem as u64,
        integrated: attr(dev, CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
        can_map_host: attr(dev, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0,
        pageable_access: attr(dev, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0,
        sms: attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
    })
}

/// Every CUDA device (for `ds4 --list-devices`); an error when the driver
/// or devices are missing.
pub fn list_devices() -> Result<Vec<DeviceInfo>, BackendError> {
    init_driver()?;
    guarded(|| {
        let n = result::device::get_count().map_err(|e| device_err("cuDeviceGetCount", e))?;
        (0..n.max(0) as usize).map(info).collect()
    })
}

/// The device the backend runs on: `opts.cuda_device` (an ordinal,
/// `DS4_CUDA_DEVICE`) or 0.
pub fn chosen_ordinal(opts: &crate::backend::BackendOptions) -> Result<usize, BackendError> {
    match &opts.cuda_device {
        Some(s) => s
            .trim()
            .parse()
            .map_err(|_| unavailable(format!("DS4_CUDA_DEVICE={s:?} is not a device number"))),
        None => Ok(0),
    }
}

/// An opened device: its primary context, current on the calling thread,
/// and one stream (blocking, so ordered with synchronous copies).
pub struct Device {
    pub info: DeviceInfo,
    pub ctx: sys::CUcontext,
    pub stream: sys::CUstream,
    dev: sys::CUdevice,
}

// SAFETY: the context is made current on whichever thread uses the backend
// (`bind`) before any driver call; the backend is used by one thread at a time.
unsafe impl Send for Device {}

impl Device {
    pub fn open(ordinal: usize) -> Result<Device, BackendError> {
        init_driver()?;
        guarded(|| {
            let n = result::device::get_count().map_err(|e| device_err("cuDeviceGetCount", e))?;
            if ordinal >= n.max(0) as usize {
                return Err(unavailable(format!(
                    "device {ordinal} requested, {n} present"
                )));
            }
            let info = info(ordinal)?;
            let dev =
                result::device::get(ordinal as i32).map_err(|e| device_err("cuDeviceGet", e))?;
            // SAFETY: retained here, released in Drop.
            let ctx = unsafe { result::primary_ctx::retain(dev) }
                .map_err(|e| device_err("cuDevicePrimaryCtxRetain", e))?;
            // SAFETY: a context retained above.
            unsafe { result::ctx::set_current(ctx) }
                .map_err(|e| device_err("cuCtxSetCurrent", e))?;
            // A blocking stream: the synchronous copies of weights, states and
            // values (legacy stream) stay ordered with the kernels.
            let stream = result::stream::create(result::stream::StreamKind::Default)
                .map_err(|e| device_err("cuStreamCreate", e))?;
            Ok(Device {
                info,
                ctx,
                stream,
                dev,
            })
        })
    }

    /// Makes the context current on the calling thread.
    pub fn bind(&self) -> Result<(), BackendError> {
        // SAFETY: the context lives as long as `self`.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| device_err("cuCtxSetCurrent", e))
    }

    pub fn sync(&self) -> Result<(), BackendError> {
        // SAFETY: our stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| device_err("cuStreamSynchronize", e))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: created/retained in `open`; errors at teardown are moot.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::stream::destroy(self.stream);
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}
