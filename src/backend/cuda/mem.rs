//! Plain device allocations and copies (raw driver calls: the backend owns
//! its pointers and hands them to kernels and CUDA graphs directly).

use cudarc::driver::sys::{self, CUdeviceptr};

use super::device::device_err;
use crate::backend::BackendError;

fn check(what: &str, r: sys::CUresult) -> Result<(), BackendError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(device_err(what, r))
    }
}

/// One device allocation, freed on drop.
pub struct DevBuf {
    pub ptr: CUdeviceptr,
    pub bytes: usize,
}

impl DevBuf {
    pub fn alloc(bytes: usize) -> Result<DevBuf, BackendError> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; size at least one byte.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes.max(1))
        })
        .map_err(|e| BackendError::Device {
            device: "cuda".into(),
            msg: format!("allocating {bytes} bytes: {e}"),
        })?;
        Ok(DevBuf { ptr, bytes })
    }

    /// An allocation holding `data`.
    pub fn from_bytes(data: &[u8]) -> Result<DevBuf, BackendError> {
        let b = DevBuf::alloc(data.len())?;
        upload(b.ptr, data)?;
        Ok(b)
    }

    pub fn from_f32(data: &[f32]) -> Result<DevBuf, BackendError> {
        DevBuf::from_bytes(bytemuck::cast_slice(data))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in `alloc`, freed once.
        unsafe {
            let _ = sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Synchronous host → device copy.
pub fn upload(dst: CUdeviceptr, data: &[u8]) -> Result<(), BackendError> {
    if data.is_empty() {
        return Ok(());
    }
    // SAFETY: `dst` is a device range of at least `data.len()` bytes (callers
    // check bounds against the allocation).
    check("cuMemcpyHtoD", unsafe {
        sys::cuMemcpyHtoD_v2(dst, data.as_ptr() as *const _, data.len())
    })
}

/// Synchronous device → host copy.
pub fn download(src: CUdeviceptr, out: &mut [u8]) -> Result<(), BackendError> {
    if out.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `upload`, reversed.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut _, src, out.len())
    })
}

/// Asynchronous host → device copy on `stream` (small per-step parameters).
// `stream` is an opaque driver handle that only the driver reads (and
// validates); nothing here dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn upload_async(
    dst: CUdeviceptr,
    data: &[u8],
    stream: sys::CUstream,
) -> Result<(), BackendError> {
    // SAFETY: as in `upload`; pageable source memory makes the copy complete
    // before the call returns, so `data` may go out of scope afterwards.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr() as *const _, data.len(), stream)
    })
}

pub fn checked(what: &str, r: sys::CUresult) -> Result<(), BackendError> {
    check(what, r)
}
