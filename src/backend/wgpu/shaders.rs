//! WGSL assembly. Each kernel family is one file under `shaders/`; the
//! program hands wgpu the family with its shared helper files prepended (in
//! the order listed), and that exact text is what the naga test validates and
//! `ds4 --dump-shaders` writes.

/// Shared helper files: (name, source), prepended in this order.
const HELPERS: &[(&str, &str)] = &[
    ("common", include_str!("../../../shaders/common.wgsl")),
    ("rowops", include_str!("../../../shaders/rowops.wgsl")),
    // Block decoders and the row-dot core shared by matmul and moe.
    ("quant", include_str!("../../../shaders/quant.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
];

macro_rules! family {
    ($name:literal, $helpers:expr) => {
        (
            $name,
            $helpers,
            include_str!(concat!("../../../shaders/", $name, ".wgsl")),
        )
    };
}

/// Kernel families: (name, helpers it needs, source). A new family is one
/// line here and one file under `shaders/`.
const FAMILIES: &[(&str, &[&str], &str)] = &[
    family!("elementwise", &["common"]),
    family!("embed", &["common"]),
    family!("norm", &["common"]),
    family!("hc_mix", &["common"]),
    family!("hc", &["common"]),
    family!("rope", &["common"]),
    family!("round", &["common", "rowops"]),
    family!("ring", &["common"]),
    family!("attention", &["common"]),
    family!("compress", &["common", "rowops"]),
    family!("indexer", &["common"]),
    family!("router", &["common"]),
    // Matrix products (dense) and routed experts; see src/backend/wgpu/matmul.rs.
    (
        "matmul",
        &["quant"],
        include_str!("../../../shaders/matmul.wgsl"),
    ),
    (
        "moe",
        &["quant", "matmul"],
        include_str!("../../../shaders/moe.wgsl"),
    ),
    // Device read-bandwidth probe (ds4-bench --bandwidth).
    family!("bandwidth", &[]),
];

/// Families that read or write cached KV rows through the type `kvt`:
/// each has an f32 module (`kvt` = f32) and an `<family>_f16` module
/// (`enable f16;`, `kvt` = f16) used where the rows are stored as f16.
const KV_FAMILIES: &[(&str, &str)] = &[
    ("ring", "ring_f16"),
    ("attention", "attention_f16"),
    ("compress", "compress_f16"),
    ("indexer", "indexer_f16"),
];

/// Suffix of the f16-storage variant of a KV family.
pub const F16_SUFFIX: &str = "_f16";

/// Names of every kernel family (the f16-storage variants included).
pub fn families() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = FAMILIES.iter().map(|f| f.0).collect();
    out.extend(KV_FAMILIES.iter().map(|f| f.1));
    out
}

/// `family` without the f16-storage suffix, and whether it had it.
pub fn base_family(family: &str) -> (&str, bool) {
    match family.strip_suffix(F16_SUFFIX) {
        Some(b) if KV_FAMILIES.iter().any(|f| f.0 == b) => (b, true),
        _ => (family, false),
    }
}

/// The complete WGSL module of `family` as handed to wgpu, or `None` for an
/// unknown family.
pub fn try_module_source(family: &str) -> Option<String> {
    let (base, f16) = base_family(family);
    let (_, helpers, src) = FAMILIES.iter().find(|f| f.0 == base)?;
    let kv = KV_FAMILIES.iter().any(|f| f.0 == base);
    let mut out = String::new();
    if f16 {
        // Directives come before any declaration.
        out.push_str("enable f16;\n");
    }
    for (name, text) in HELPERS {
        if helpers.contains(name) {
            out.push_str(&format!("// ---- shaders/{name}.wgsl ----\n"));
            out.push_str(text);
            out.push('\n');
        }
    }
    if kv {
        out.push_str("// Element type of the cached KV rows (storage only; math is f32).\n");
        out.push_str(if f16 {
            "alias kvt = f16;\n"
        } else {
            "alias kvt = f32;\n"
        });
    }
    out.push_str(&format!("// ---- shaders/{base}.wgsl ----\n"));
    out.push_str(src);
    Some(out)
}

/// The complete WGSL module of `family` (panics on a name not in
/// [`families`]: family names are compile-time constants of this crate).
pub fn module_source(family: &str) -> String {
    try_module_source(family).unwrap_or_else(|| panic!("unknown WGSL family {family}"))
}

/// Every assembled module: (family, source).
pub fn all_modules() -> Vec<(&'static str, String)> {
    families()
        .into_iter()
        .map(|f| (f, module_source(f)))
        .collect()
}

/// Writes every module as `DIR/<family>.wgsl` (`ds4 --dump-shaders DIR`).
pub fn dump(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (f, src) in all_modules() {
        let p = dir.join(format!("{f}.wgsl"));
        std::fs::write(&p, src)?;
        written.push(p);
    }
    Ok(written)
}
