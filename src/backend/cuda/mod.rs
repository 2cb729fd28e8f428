//! The CUDA backend (feature `cuda`): kernels in `cuda/*.cu` compiled to
//! PTX by NVRTC for the device at start-up (cached on disk), the driver
//! loaded at run time by cudarc. See docs/CUDA.md.

pub mod device;
pub mod kernels;
pub mod nvrtc;
