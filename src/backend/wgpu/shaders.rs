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

/// Names of every kernel family.
pub fn families() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.0).collect()
}

/// The complete WGSL module of `family` as handed to wgpu, or `None` for an
/// unknown family.
pub fn try_module_source(family: &str) -> Option<String> {
    let (_, helpers, src) = FAMILIES.iter().find(|f| f.0 == family)?;
    let mut out = String::new();
    for (name, text) in HELPERS {
        if helpers.contains(name) {
            out.push_str(&format!("// ---- shaders/{name}.wgsl ----\n"));
            out.push_str(text);
            out.push('\n');
        }
    }
    out.push_str(&format!("// ---- shaders/{family}.wgsl ----\n"));
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
