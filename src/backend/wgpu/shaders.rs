//! WGSL assembly. Each kernel family is one file under `shaders/`; the
//! program hands wgpu the family with its shared helper files prepended (in
//! the order listed), and that exact text is what the naga test validates and
//! `ds4 --dump-shaders` writes.
//!
//! One source per family serves every device: lines between `//#if
//! subgroups`, `//#else` and `//#endif` (whole lines, nestable) are kept or
//! dropped for the module's [`Variant`]. The directives are needed because a
//! module that so much as names a subgroup builtin fails validation on a
//! device without `Features::SUBGROUP`, so an override constant cannot choose
//! between the two paths.

/// Shared helper files: (name, source), prepended in this order.
const HELPERS: &[(&str, &str)] = &[
    ("common", include_str!("../../../shaders/common.wgsl")),
    ("rowops", include_str!("../../../shaders/rowops.wgsl")),
    // Workgroup sum / max: subgroup operations or a workgroup-memory tree.
    ("reduce", include_str!("../../../shaders/reduce.wgsl")),
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
    family!("norm", &["common", "reduce"]),
    family!("hc_mix", &["common"]),
    family!("hc", &["common"]),
    family!("rope", &["common"]),
    family!("round", &["common", "rowops"]),
    family!("ring", &["common"]),
    family!("attention", &["common", "reduce"]),
    family!("compress", &["common", "rowops"]),
    family!("indexer", &["common"]),
    family!("router", &["common"]),
    family!("gather", &["common"]),
    // DeepSeek V4.1's own ops (docs/V41.md).
    family!("v41_gate", &["common", "rowops"]),
    family!("v41_compress", &["common", "rowops"]),
    family!("v41_select", &["common"]),
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

/// Which optional device features a module is assembled for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Reductions use subgroup operations (`subgroupAdd`, `subgroupMax`, the
    /// `subgroup_id` / `num_subgroups` builtins) instead of workgroup-memory
    /// trees. Needs `Features::SUBGROUP`; no kernel assumes a subgroup size.
    pub subgroups: bool,
}

impl Variant {
    /// The module every adapter runs: plain f32 and workgroup memory.
    pub const FALLBACK: Variant = Variant { subgroups: false };
    /// Every variant the program can hand to wgpu.
    pub const ALL: [Variant; 2] = [Variant::FALLBACK, Variant { subgroups: true }];

    /// Short name: `plain` or `subgroups` (file suffixes, benchmark rows).
    pub fn name(self) -> &'static str {
        if self.subgroups {
            "subgroups"
        } else {
            "plain"
        }
    }

    fn flag(self, name: &str) -> Option<bool> {
        match name {
            "subgroups" => Some(self.subgroups),
            _ => None,
        }
    }
}

/// Keeps the lines of `src` that `variant` selects (see the module docs).
/// Panics on a malformed directive: the sources are compile-time constants
/// of this crate and tests/wgpu_naga.rs assembles every one of them.
fn preprocess(family: &str, src: &str, variant: Variant) -> String {
    // One entry per open `//#if`: (this branch is kept, the enclosing one is).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut out = String::with_capacity(src.len());
    for (n, line) in src.lines().enumerate() {
        let t = line.trim();
        let keep_outer = stack.last().is_none_or(|&(k, o)| k && o);
        if let Some(name) = t.strip_prefix("//#if ") {
            let on = variant
                .flag(name.trim())
                .unwrap_or_else(|| panic!("{family}.wgsl:{}: unknown flag {name}", n + 1));
            stack.push((on, keep_outer));
        } else if t == "//#else" {
            let top = stack
                .last_mut()
                .unwrap_or_else(|| panic!("{family}.wgsl:{}: #else without #if", n + 1));
            top.0 = !top.0;
        } else if t == "//#endif" {
            stack
                .pop()
                .unwrap_or_else(|| panic!("{family}.wgsl:{}: #endif without #if", n + 1));
        } else if t.starts_with("//#") {
            panic!("{family}.wgsl:{}: unknown directive {t}", n + 1);
        } else if keep_outer {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(stack.is_empty(), "{family}.wgsl: #if without #endif");
    out
}

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

/// The complete WGSL module of `family` for `variant` as handed to wgpu, or
/// `None` for an unknown family. `<family>_f16` names the f16-storage
/// variant of a KV family.
pub fn try_module_source_for(family: &str, variant: Variant) -> Option<String> {
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
            out.push_str(&preprocess(name, text, variant));
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
    out.push_str(&preprocess(base, src, variant));
    Some(out)
}

/// The fallback module of `family` (see [`try_module_source_for`]).
pub fn try_module_source(family: &str) -> Option<String> {
    try_module_source_for(family, Variant::FALLBACK)
}

/// The complete WGSL module of `family` for `variant` (panics on a name not
/// in [`families`]: family names are compile-time constants of this crate).
pub fn module_source_for(family: &str, variant: Variant) -> String {
    try_module_source_for(family, variant).unwrap_or_else(|| panic!("unknown WGSL family {family}"))
}

/// The fallback module of `family`.
pub fn module_source(family: &str) -> String {
    module_source_for(family, Variant::FALLBACK)
}

/// Every assembled fallback module: (family, source).
pub fn all_modules() -> Vec<(&'static str, String)> {
    families()
        .into_iter()
        .map(|f| (f, module_source(f)))
        .collect()
}

/// Every distinct module the program can hand to wgpu: (family, variant,
/// source). A family whose text is the same in every variant appears once,
/// as the fallback.
pub fn all_variants() -> Vec<(&'static str, Variant, String)> {
    let mut out = Vec::new();
    for f in families() {
        let plain = module_source(f);
        for v in Variant::ALL {
            let src = module_source_for(f, v);
            if v == Variant::FALLBACK || src != plain {
                out.push((f, v, src));
            }
        }
    }
    out
}

/// The file name `ds4 --dump-shaders` gives a module: `<family>.wgsl` for
/// the fallback, `<family>.<variant>.wgsl` otherwise.
pub fn dump_name(family: &str, variant: Variant) -> String {
    if variant == Variant::FALLBACK {
        format!("{family}.wgsl")
    } else {
        format!("{family}.{}.wgsl", variant.name())
    }
}

/// Writes every module of [`all_variants`] under `dir` (`ds4 --dump-shaders
/// DIR`), named by [`dump_name`].
pub fn dump(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (f, v, src) in all_variants() {
        let p = dir.join(dump_name(f, v));
        std::fs::write(&p, src)?;
        written.push(p);
    }
    Ok(written)
}
