//! Kernel families compiled (or read from the PTX cache) for the opened
//! device and loaded as driver modules: what the backend and the bandwidth
//! benchmark launch.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::sys::{self, CUfunction};

use super::device::{device_err, unavailable, Device};
use super::kernels::{self, Kernel};
use super::mem::checked;
use super::nvrtc;
use crate::backend::kernels::Family;
use crate::backend::BackendError;

/// Loaded modules and their entry points, unloaded on drop (the device's
/// context must outlive them).
pub struct Modules {
    modules: Vec<sys::CUmodule>,
    pub funcs: HashMap<&'static str, CUfunction>,
    /// The `compute_XX` the PTX was generated for.
    pub arch: u32,
    /// NVRTC (major, minor).
    pub nvrtc: (i32, i32),
}

impl Modules {
    /// Compiles (or reads from the cache) and loads `families` for `dev`.
    pub fn load(
        dev: &Device,
        families: &[Family],
        opts: &crate::backend::BackendOptions,
    ) -> Result<Modules, BackendError> {
        let nv = nvrtc::Nvrtc::load(opts.nvrtc.as_deref()).map_err(unavailable)?;
        let cc = dev.info.cc_number();
        let arch = nv.arch_for(cc).ok_or_else(|| {
            unavailable(format!(
                "NVRTC {}.{} cannot target sm_{cc} (it knows {:?})",
                nv.version.0, nv.version.1, nv.archs
            ))
        })?;
        let cache = opts.cuda_cache.clone();
        let mut out = Modules {
            modules: Vec::new(),
            funcs: HashMap::new(),
            arch,
            nvrtc: nv.version,
        };
        for &family in families {
            let ptx = kernels::ptx(&nv, family, arch, cache.as_deref())
                .map_err(|e| device_err("NVRTC", e))?;
            let image = std::ffi::CString::new(ptx).map_err(|_| device_err("PTX", "NUL byte"))?;
            let mut m: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: a NUL-terminated PTX image; the module lives in `out`.
            checked("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) })
                .map_err(|e| BackendError::Device {
                    device: "cuda".into(),
                    msg: format!("loading {family} (compute_{arch}, NVRTC {}.{}): {e}; a driver older than the NVRTC rejects its PTX", nv.version.0, nv.version.1),
                })?;
            out.modules.push(m);
            for name in kernels::entry_points(family) {
                let cname = std::ffi::CString::new(name).expect("kernel names have no NUL");
                let mut f: CUfunction = std::ptr::null_mut();
                // SAFETY: `m` is a loaded module.
                checked("cuModuleGetFunction", unsafe {
                    sys::cuModuleGetFunction(&mut f, m, cname.as_ptr())
                })?;
                out.funcs.insert(name, f);
            }
        }
        Ok(out)
    }

    /// The loaded function of kernel `k`.
    pub fn func(&self, k: impl Into<Kernel>) -> Result<CUfunction, BackendError> {
        let name = k.into().name().map_err(|e| device_err("kernel", e))?;
        self.funcs
            .get(name)
            .copied()
            .ok_or_else(|| device_err("kernel", format!("{name} is not loaded")))
    }
}

impl Drop for Modules {
    fn drop(&mut self) {
        for m in self.modules.drain(..) {
            // SAFETY: loaded in `load`, unloaded once.
            unsafe {
                let _ = sys::cuModuleUnload(m);
            }
        }
    }
}
