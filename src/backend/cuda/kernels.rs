//! CUDA C++ kernel sources and their PTX. Each family is one file under
//! `cuda/` (the same families and stems as `shaders/`); the program hands
//! NVRTC the family with its shared helper headers prepended (in the order
//! listed), and that exact text is what the CI compile test checks. PTX is
//! cached on disk by source hash + architecture + NVRTC version.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::nvrtc::Nvrtc;

/// Shared helper headers: (name, source), prepended in this order.
const HELPERS: &[(&str, &str)] = &[
    ("common", include_str!("../../../cuda/common.cuh")),
    ("iq2xxs_grid", include_str!("../../../cuda/iq2xxs_grid.inc")),
    ("quant", include_str!("../../../cuda/quant.cuh")),
];

macro_rules! family {
    ($name:literal, $helpers:expr) => {
        (
            $name,
            $helpers,
            include_str!(concat!("../../../cuda/", $name, ".cu")),
        )
    };
}

/// Kernel families: (name, helpers it needs, source).
const FAMILIES: &[(&str, &[&str], &str)] = &[
    family!("elementwise", &["common"]),
    family!("embed", &["common", "iq2xxs_grid", "quant"]),
    family!("norm", &["common"]),
    family!("hc_mix", &["common"]),
    family!("hc", &["common"]),
    family!("rope", &["common"]),
    family!("round", &["common"]),
    family!("ring", &["common"]),
    family!("attention", &["common"]),
    family!("compress", &["common"]),
    family!("indexer", &["common"]),
    family!("router", &["common"]),
    family!("gather", &["common"]),
    family!("v41", &["common"]),
    family!("matmul", &["common", "iq2xxs_grid", "quant"]),
    family!("moe", &["common", "iq2xxs_grid", "quant"]),
    family!("bandwidth", &["common"]),
];

/// Names of every kernel family.
pub fn families() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.0).collect()
}

/// The complete source of `family` as handed to NVRTC.
pub fn try_module_source(family: &str) -> Option<String> {
    let (_, helpers, src) = FAMILIES.iter().find(|f| f.0 == family)?;
    let mut out = String::new();
    for (name, text) in HELPERS {
        if helpers.contains(name) {
            out.push_str(&format!("// ---- cuda/{name} ----\n"));
            out.push_str(text);
            out.push('\n');
        }
    }
    out.push_str(&format!("// ---- cuda/{family}.cu ----\n"));
    out.push_str(src);
    Some(out)
}

/// Every assembled module: (family, source).
pub fn all_modules() -> Vec<(&'static str, String)> {
    FAMILIES
        .iter()
        .filter_map(|f| Some((f.0, try_module_source(f.0)?)))
        .collect()
}

/// Where PTX is cached: `dir` (`DS4_CUDA_CACHE`), else
/// `$XDG_CACHE_HOME/ds4/cuda`, else `~/.cache/ds4/cuda`; `None` disables the
/// cache.
pub fn cache_dir(dir: Option<&std::path::Path>) -> Option<PathBuf> {
    if let Some(d) = dir {
        return Some(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("ds4").join("cuda"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("ds4").join("cuda"))
}

/// The cache file name of a module: family, arch, NVRTC version and the
/// first 16 bytes of the SHA-256 of the exact source and options.
pub fn cache_name(family: &str, source: &str, arch: u32, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in super::nvrtc::compile_options(arch) {
        h.update(b"\0");
        h.update(o.as_bytes());
    }
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{family}-compute_{arch}-nvrtc{}.{}-{hex}.ptx",
        nvrtc.0, nvrtc.1
    )
}

/// PTX of `family` for `compute_<arch>`: from the cache when present, else
/// compiled and stored (a cache that cannot be written is only skipped).
pub fn ptx(nvrtc: &Nvrtc, family: &str, arch: u32, cache: Option<&Path>) -> Result<String, String> {
    let src = try_module_source(family).ok_or_else(|| format!("unknown CUDA family {family}"))?;
    let path = cache.map(|d| d.join(cache_name(family, &src, arch, nvrtc.version)));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".version") {
                return Ok(text);
            }
        }
    }
    let c = nvrtc.compile(&format!("{family}.cu"), &src, arch)?;
    if let (Some(p), Some(dir)) = (&path, cache) {
        // Written under a temporary name then renamed, so a concurrent start
        // never reads half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let stored = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &c.ptx))
            .and_then(|_| std::fs::rename(&tmp, p));
        if stored.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(c.ptx)
}

/// Weight-type suffixes of the per-type kernels (`matmul_q4_k`, ...), in
/// the order of `FOR_EACH_WEIGHT_TYPE` in cuda/quant.cuh.
pub const TYPE_SUFFIXES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q2_k", "q4_k", "iq2_xxs", "mxfp4",
];

/// The kernel entry points of a family (what the backend loads).
pub fn entry_points(family: &str) -> Vec<String> {
    let fixed: &[&str] = match family {
        "elementwise" => &["add", "scale", "swiglu_clamped", "take_last"],
        "norm" => &["rms_norm"],
        "hc_mix" => &["hc_mix"],
        "hc" => &["hc_init", "hc_collapse", "hc_expand"],
        "rope" => &["rope"],
        "round" => &["kv_round", "hadamard_fp4"],
        "ring" => &["ring_write"],
        "attention" => &["attention"],
        "compress" => &["compress"],
        "indexer" => &["indexer_topk"],
        "router" => &["router"],
        "gather" => &["gather_last"],
        "v41" => &[
            "hc_one_hot",
            "engram_gate",
            "v41_compress",
            "candidate_blocks",
            "candidate_topk",
        ],
        "moe" => &["expert_swiglu", "expert_sum"],
        "bandwidth" => &["read_all"],
        _ => &[],
    };
    let mut v: Vec<String> = fixed.iter().map(|s| s.to_string()).collect();
    let per_type = match family {
        "embed" => Some("embed_"),
        "matmul" => Some("matmul_"),
        "moe" => Some("expert_rows_"),
        _ => None,
    };
    if let Some(p) = per_type {
        v.extend(TYPE_SUFFIXES.iter().map(|s| format!("{p}{s}")));
    }
    if family == "moe" {
        v.extend(TYPE_SUFFIXES.iter().map(|s| format!("expert_gate_up_{s}")));
    }
    if family == "matmul" {
        v.extend(TYPE_SUFFIXES.iter().map(|s| format!("mma_{s}")));
    }
    v
}

/// Every kernel name of every family, interned once (launch lists hold
/// `&'static str` names).
pub fn static_name(name: &str) -> Option<&'static str> {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| {
            families()
                .into_iter()
                .flat_map(entry_points)
                .map(|n| &*Box::leak(n.into_boxed_str()))
                .collect()
        })
        .iter()
        .copied()
        .find(|n| *n == name)
}
