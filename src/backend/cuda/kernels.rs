//! CUDA C++ kernel sources and their PTX. Each family is one file under
//! `cuda/` (the same families and stems as `shaders/`, listed once in
//! src/backend/kernels.rs); the program hands NVRTC the family with its
//! shared helper headers prepended (in the order listed), and that exact
//! text is what the CI compile test checks. PTX is cached on disk by source
//! hash + architecture + NVRTC version.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::nvrtc::Nvrtc;
use crate::backend::kernels::{Entry, Family, Lang};
use crate::quant::GgmlType;

/// Shared helper headers: (name, source), prepended in this order where a
/// family lists them (`Family::cuda_helpers`, src/backend/kernels.rs).
const HELPERS: &[(&str, &str)] = &[
    ("common", include_str!("../../../cuda/common.cuh")),
    ("iq2xxs_grid", include_str!("../../../cuda/iq2xxs_grid.inc")),
    ("quant", include_str!("../../../cuda/quant.cuh")),
    // Block counts and scans of the top-k kernels.
    ("select", include_str!("../../../cuda/select.cuh")),
];

/// Every helper header in order: (name, source) (the emulator of the tests
/// prepends them all once).
pub fn helpers() -> &'static [(&'static str, &'static str)] {
    HELPERS
}

/// The complete source of `family` as handed to NVRTC.
pub fn module_source(family: Family) -> String {
    let helpers = family.cuda_helpers();
    let mut out = String::new();
    for (name, text) in HELPERS {
        if helpers.contains(name) {
            out.push_str(&format!("// ---- cuda/{name} ----\n"));
            out.push_str(text);
            out.push('\n');
        }
    }
    out.push_str(&format!("// ---- cuda/{family}.cu ----\n"));
    out.push_str(family.cuda_source());
    out
}

/// Every assembled module: (family, source).
pub fn all_modules() -> Vec<(Family, String)> {
    Family::ALL.iter().map(|&f| (f, module_source(f))).collect()
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
pub fn ptx(
    nvrtc: &Nvrtc,
    family: Family,
    arch: u32,
    cache: Option<&Path>,
) -> Result<String, String> {
    let src = module_source(family);
    let stem = family.stem();
    let path = cache.map(|d| d.join(cache_name(stem, &src, arch, nvrtc.version)));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".version") {
                return Ok(text);
            }
        }
    }
    let c = nvrtc.compile(&format!("{stem}.cu"), &src, arch)?;
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

/// Suffix of the per-type kernels for a weight type.
pub fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Bf16 => "bf16",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q2K => "q2_k",
        GgmlType::Q4K => "q4_k",
        GgmlType::Iq2Xxs => "iq2_xxs",
        GgmlType::Mxfp4 => "mxfp4",
        _ => return None,
    })
}

/// One CUDA kernel: an entry, with its weight type where CUDA compiles the
/// entry once per type ([`crate::backend::kernels::Langs::typed_in_cuda`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub entry: Entry,
    pub ty: Option<GgmlType>,
}

impl From<Entry> for Kernel {
    fn from(entry: Entry) -> Kernel {
        Kernel { entry, ty: None }
    }
}

impl Kernel {
    /// The per-type kernel of `entry` for weights of type `ty`.
    pub fn typed(entry: Entry, ty: GgmlType) -> Kernel {
        Kernel {
            entry,
            ty: Some(ty),
        }
    }

    /// Its name in the PTX: `<entry>`, or `<entry>_<type>` for a per-type
    /// entry; an error for a type or entry CUDA has no kernel for.
    pub fn name(self) -> Result<&'static str, String> {
        let e = self.entry;
        if !e.langs().has(Lang::Cuda) {
            return Err(format!("kernel {e} (no CUDA kernel)"));
        }
        match (e.langs().typed_in_cuda(), self.ty) {
            (false, None) => Ok(e.name()),
            (true, Some(ty)) => {
                let s =
                    type_suffix(ty).ok_or_else(|| format!("{e} over weights of type {ty:?}"))?;
                typed_names()
                    .iter()
                    .find(|(k, suffix, _)| *k == e && *suffix == s)
                    .map(|(_, _, n)| *n)
                    .ok_or_else(|| format!("kernel {e}_{s}"))
            }
            (true, None) => Err(format!("kernel {e} without its weight type")),
            (false, Some(ty)) => Err(format!("kernel {e} is not per type ({ty:?})")),
        }
    }
}

/// Every per-type kernel: (entry, type suffix, name), the names interned
/// once (launch lists hold `&'static str` names).
fn typed_names() -> &'static [(Entry, &'static str, &'static str)] {
    type Names = Vec<(Entry, &'static str, &'static str)>;
    static NAMES: std::sync::OnceLock<Names> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v = Vec::new();
        for &e in Entry::ALL {
            if e.langs().typed_in_cuda() {
                for s in TYPE_SUFFIXES {
                    let n: &'static str = Box::leak(format!("{}_{s}", e.name()).into_boxed_str());
                    v.push((e, *s, n));
                }
            }
        }
        v
    })
}

/// The kernel entry points of a family (what the backend loads).
pub fn entry_points(family: Family) -> Vec<&'static str> {
    let mut v = Vec::new();
    for e in family.entries_in(Lang::Cuda) {
        if e.langs().typed_in_cuda() {
            v.extend(typed_names().iter().filter(|k| k.0 == e).map(|k| k.2));
        } else {
            v.push(e.name());
        }
    }
    v
}
