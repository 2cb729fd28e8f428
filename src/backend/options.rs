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
    /// Where compiled PTX is cached (`DS4_CUDA_CACHE`; default
    /// `ds4/cuda` under [`user_cache_dir`]; `None`: no cache).
    pub cuda_cache: Option<PathBuf>,
    /// Routed experts streamed from the GGUF into a bounded cache
    /// (`--ssd-streaming`; docs/SSD_STREAMING.md). `None`: every weight is
    /// read through the mapping, as always.
    pub ssd_streaming: Option<StreamingOptions>,
}

/// How big the routed-expert cache is (`--ssd-streaming-cache-experts`):
/// a count of expert slots per streamed layer, or a byte budget that is
/// turned into slots per layer at start (ds4's two spellings, `N` and
/// `NGB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheBudget {
    /// Expert slices each streamed layer keeps.
    Experts(usize),
    /// Bytes for all streamed layers together.
    Bytes(u64),
}

impl CacheBudget {
    /// `N` (experts per layer) or `N GB`/`NGB`/`NGiB` (gibibytes, as ds4
    /// reads `GB`), `N MB`/`NMiB` (tests and the benchmark's small budgets).
    pub fn parse(s: &str) -> Result<CacheBudget, String> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        let (num, unit) = match lower.find(|c: char| !c.is_ascii_digit() && c != '.') {
            Some(i) => (lower[..i].trim(), lower[i..].trim()),
            None => (lower.as_str(), ""),
        };
        let bad = || {
            format!("--ssd-streaming-cache-experts {t:?}: a positive count or a size such as 32GB")
        };
        let shift = match unit {
            "" => {
                let n: usize = num.parse().map_err(|_| bad())?;
                return if n == 0 {
                    Err(bad())
                } else {
                    Ok(CacheBudget::Experts(n))
                };
            }
            "gb" | "g" | "gib" => 30,
            "mb" | "m" | "mib" => 20,
            _ => return Err(bad()),
        };
        let v: f64 = num.parse().map_err(|_| bad())?;
        let bytes = v * (1u64 << shift) as f64;
        if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
            return Err(bad());
        }
        Ok(CacheBudget::Bytes(bytes as u64))
    }
}

/// Which cached expert a full layer gives up (measured in
/// docs/SSD_STREAMING.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently used, per layer.
    #[default]
    Lru,
    /// Fewest uses (ties: least recently used), per layer.
    Lfu,
}

impl EvictionPolicy {
    pub fn parse(s: &str) -> Result<EvictionPolicy, String> {
        match s.trim() {
            "lru" => Ok(EvictionPolicy::Lru),
            "lfu" => Ok(EvictionPolicy::Lfu),
            o => Err(format!("eviction policy {o:?}: lru or lfu")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
        }
    }
}

/// The `--ssd-streaming*` flags, with ds4's meanings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamingOptions {
    /// The cache size (default 32 GiB, as ds4's documentation suggests).
    pub budget: CacheBudget,
    /// The first N routed layers stay fully resident (read through the
    /// mapping as without streaming; `--ssd-streaming-full-layers`).
    pub full_layers: usize,
    /// Start with an empty cache (`--ssd-streaming-cold`); otherwise every
    /// streamed layer is filled at start, most popular experts first.
    pub cold: bool,
    /// Preload at most this many experts per layer
    /// (`--ssd-streaming-preload-experts`; default: the whole cache).
    pub preload_experts: Option<usize>,
    pub policy: EvictionPolicy,
    /// Threads that read slices (a pass's misses and the read-ahead):
    /// reads wait on the disk, not the CPU, so more than the cores.
    pub read_threads: usize,
    /// Read the hash layers' experts ahead from the token ids.
    pub prefetch: bool,
    /// Ask for O_DIRECT (F_NOCACHE on macOS), so the page cache neither
    /// helps nor double-counts; falls back to buffered reads where the
    /// filesystem refuses it.
    pub direct_io: bool,
    /// The expert popularity profile the cache records and preloads from.
    pub profile: ProfileFile,
}

/// Where the expert popularity profile lives (docs/SSD_STREAMING.md
/// § Preload profile).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProfileFile {
    /// None recorded or read (the library's default: tests and embedders
    /// write nothing next to the model unless asked).
    #[default]
    Off,
    /// `<model>.experts-profile` (what the binaries use).
    NextToModel,
    At(std::path::PathBuf),
}

impl Default for StreamingOptions {
    fn default() -> Self {
        StreamingOptions {
            budget: CacheBudget::Bytes(32 << 30),
            full_layers: 0,
            cold: false,
            preload_experts: None,
            policy: EvictionPolicy::Lru,
            read_threads: 8,
            prefetch: true,
            direct_io: true,
            profile: ProfileFile::Off,
        }
    }
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            cpu_isa: None,
            cpu_profile: false,
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
            cuda_cache: default_cuda_cache(),
            ssd_streaming: None,
        }
    }
}

/// The user's cache folder: `$XDG_CACHE_HOME`, else `~/.cache`; the one
/// place it is resolved (the PTX cache here, the demo model in `app`).
pub fn user_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
}

fn default_cuda_cache() -> Option<PathBuf> {
    user_cache_dir().map(|d| d.join("ds4").join("cuda"))
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
            cuda_cache: path("DS4_CUDA_CACHE").or_else(default_cuda_cache),
            ssd_streaming: None,
        }
    }
}
