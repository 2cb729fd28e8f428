//! The options a backend is opened with besides its kind.
//! [`BackendOptions::from_env`] is the one reader of the `DS4_*` backend
//! variables: the binaries call it once, tests set the fields. (The
//! binaries' `--backend` flags are `app::flags`.)

use std::path::PathBuf;

/// Everything a backend is opened with besides its kind, the weights and the
/// state layout. The defaults are what an empty environment gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendOptions {
    /// The fast CPU kernel path (`portable`, `avx2`, `avx512`, `neon`);
    /// `None` or `auto`: the best this CPU runs (`DS4_CPU_ISA`).
    pub cpu_isa: Option<String>,
    /// Seconds and calls per op, printed when the CPU backend drops
    /// (`DS4_CPU_PROFILE`).
    pub cpu_profile: bool,
    /// The fast CPU products pick their kernels per row by one fixed rule
    /// (dense products on the many-token path, routed experts on the direct
    /// kernels) instead of by piece size: the batched engine
    /// ([`crate::session::Batch`]) sets it, so a session's results never
    /// depend on what else is in a step. Not from the environment.
    pub cpu_wide_rows: bool,
    /// The wgpu adapter: an index into `ds4 --list-devices` or a
    /// case-insensitive substring of its name (`DS4_WGPU_ADAPTER`).
    pub wgpu_adapter: Option<String>,
    /// The optional wgpu features allowed: `all`, `none` or a comma list of
    /// `f16`, `subgroups`, `timestamps`; `None`: the default policy
    /// (`DS4_WGPU_FEATURES`).
    pub wgpu_features: Option<String>,
    /// Caps the bytes of one binding of a wgpu state chunk below the
    /// device's limit (`DS4_WGPU_STATE_CHUNK_BYTES`; tests make the tiny
    /// models' cached rows span several chunks).
    pub state_chunk_cap: Option<u64>,
    /// Stores the wgpu cached rows as f32 even where the adapter has
    /// `shader-f16` (`DS4_WGPU_KV_F32`).
    pub kv_f32: bool,
    /// Runs each wgpu dispatch alone and prints time per op kind
    /// (`DS4_WGPU_PROFILE`).
    pub wgpu_profile: bool,
    /// The CUDA device ordinal, as given (`DS4_CUDA_DEVICE`; default 0).
    pub cuda_device: Option<String>,
    /// CUDA graph capture of decode steps (`DS4_CUDA_GRAPH=0` turns it off).
    pub cuda_graph: bool,
    /// Prefill matmuls on tensor cores, opt-in (`DS4_CUDA_MMA=1`).
    pub cuda_mma: bool,
    /// `upload` or `register` forces how CUDA gets the weights
    /// (`DS4_CUDA_WEIGHTS`; default: register on unified memory).
    pub cuda_weights: Option<String>,
    /// The NVRTC library to load (`DS4_NVRTC`).
    pub nvrtc: Option<PathBuf>,
    /// Where compiled PTX is cached (`DS4_CUDA_CACHE`; default under
    /// `$XDG_CACHE_HOME` or `~/.cache`).
    pub cuda_cache: Option<PathBuf>,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            cpu_isa: None,
            cpu_profile: false,
            cpu_wide_rows: false,
            wgpu_adapter: None,
            wgpu_features: None,
            state_chunk_cap: None,
            kv_f32: false,
            wgpu_profile: false,
            cuda_device: None,
            cuda_graph: true,
            cuda_mma: false,
            cuda_weights: None,
            nvrtc: None,
            cuda_cache: None,
        }
    }
}

impl BackendOptions {
    /// The options the `DS4_*` environment variables give: the only place
    /// they are read. Values are checked when the backend that uses them
    /// opens, so a bad value for another backend is not an error.
    pub fn from_env() -> BackendOptions {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        let path = |name: &str| std::env::var_os(name).map(PathBuf::from);
        BackendOptions {
            cpu_isa: var("DS4_CPU_ISA"),
            cpu_profile: std::env::var_os("DS4_CPU_PROFILE").is_some(),
            cpu_wide_rows: false,
            wgpu_adapter: var("DS4_WGPU_ADAPTER"),
            wgpu_features: var("DS4_WGPU_FEATURES"),
            state_chunk_cap: var("DS4_WGPU_STATE_CHUNK_BYTES")
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|&b| b > 0),
            kv_f32: matches!(
                var("DS4_WGPU_KV_F32").as_deref(),
                Some("1" | "true" | "yes")
            ),
            wgpu_profile: std::env::var_os("DS4_WGPU_PROFILE").is_some(),
            cuda_device: std::env::var("DS4_CUDA_DEVICE").ok(),
            cuda_graph: !std::env::var("DS4_CUDA_GRAPH").is_ok_and(|v| v == "0"),
            cuda_mma: std::env::var("DS4_CUDA_MMA").is_ok_and(|v| v == "1"),
            cuda_weights: std::env::var("DS4_CUDA_WEIGHTS").ok(),
            nvrtc: path("DS4_NVRTC"),
            cuda_cache: path("DS4_CUDA_CACHE"),
        }
    }
}
