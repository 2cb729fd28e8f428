//! WGSL assembly. Each kernel family is one file under `shaders/`; the
//! program hands wgpu the family with its shared helper files prepended (in
//! the order listed), and that exact text is what the naga test validates and
//! `ds4 --dump-shaders` writes.
//!
//! The families, their helpers and their sources are listed once in
//! src/backend/kernels.rs.
//!
//! One source per family serves every device: lines between `//#if
//! subgroups`, `//#else` and `//#endif` (whole lines, nestable) are kept or
//! dropped for the module's [`Variant`]. The directives are needed because a
//! module that so much as names a subgroup builtin fails validation on a
//! device without `Features::SUBGROUP`, so an override constant cannot choose
//! between the two paths.
//!
//! A state that grows with the context is bound as up to
//! [`MAX_STATE_CHUNKS`] chunks of whole rows (docs/ARCHITECTURE.md, "Chunked
//! state bindings"). The family declares chunk 0 among its bindings and
//! writes `//#chunks NAME BINDING ACCESS TYPE` for the rest: the line
//! becomes the bindings `NAME1..` (from `BINDING` on, `read` or
//! `read_write`, elements of `TYPE`) and the function that picks a chunk,
//! `NAME_load(c, o) -> f32` to read or `NAME_store(c, o, v)` to write value
//! `o` of chunk `c`.

use super::MAX_STATE_CHUNKS;
use crate::backend::kernels::Family;

/// Shared helper files: (name, source), prepended in this order where a
/// family lists them (`Family::wgsl_helpers`, src/backend/kernels.rs).
const HELPERS: &[(&str, &str)] = &[
    ("common", include_str!("../../../shaders/common.wgsl")),
    ("rowops", include_str!("../../../shaders/rowops.wgsl")),
    // Workgroup sum / max: subgroup operations or a workgroup-memory tree.
    ("reduce", include_str!("../../../shaders/reduce.wgsl")),
    // Top-k selection over order-preserving keys (indexer, V4.1's select).
    ("select", include_str!("../../../shaders/select.wgsl")),
    // RoPE angles from the host's split frequencies (rope, compressors).
    (
        "rope_angle",
        include_str!("../../../shaders/rope_angle.wgsl"),
    ),
    // Block decoders and the row-dot core shared by matmul and moe.
    ("quant", include_str!("../../../shaders/quant.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
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
        } else if let Some(args) = t.strip_prefix("//#chunks ") {
            if keep_outer {
                out.push_str(
                    &chunks(args).unwrap_or_else(|e| {
                        panic!("{family}.wgsl:{}: //#chunks {args}: {e}", n + 1)
                    }),
                );
            }
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

/// What `//#chunks NAME BINDING ACCESS TYPE` stands for (see the module
/// docs): chunks 1.. of `NAME` bound from `BINDING` on, and the function
/// that reads (`read`) or writes (`read_write`) value `o` of chunk `c`.
fn chunks(args: &str) -> Result<String, String> {
    let a: Vec<&str> = args.split_whitespace().collect();
    let [name, first, access, ty] = a[..] else {
        return Err("want NAME BINDING ACCESS TYPE".into());
    };
    let first: usize = first.parse().map_err(|_| format!("binding {first}"))?;
    let last = MAX_STATE_CHUNKS - 1;
    let mut out = String::new();
    for c in 1..=last {
        out.push_str(&format!(
            "@group(0) @binding({}) var<storage, {access}> {name}{c}: array<{ty}>;\n",
            first + c - 1
        ));
    }
    let (head, case) = match access {
        "read" => (
            format!("fn {name}_load(c: u32, o: u32) -> f32 {{"),
            "return f32({name}{c}[o]);",
        ),
        "read_write" => (
            format!("fn {name}_store(c: u32, o: u32, v: f32) {{"),
            "{name}{c}[o] = {ty}(v);",
        ),
        _ => return Err(format!("access {access}")),
    };
    let arm = |c: usize| {
        case.replace("{name}", name)
            .replace("{c}", &c.to_string())
            .replace("{ty}", ty)
    };
    out.push_str(&format!(
        "// Value `o` of chunk `c` of the chunked {name}.\n{head}\n    switch c {{\n"
    ));
    for c in 1..=last {
        out.push_str(&format!("        case {c}u: {{ {} }}\n", arm(c)));
    }
    out.push_str(&format!("        default: {{ {} }}\n    }}\n}}\n", arm(0)));
    Ok(out)
}

/// One WGSL module: a family, its cached KV rows (if it reads or writes
/// any) stored as f32 or as f16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Module {
    pub family: Family,
    /// The `<stem>_f16` module (`enable f16;`, `kvt` = f16), used where the
    /// rows are stored as f16; only for [`Module::stores_kv`] families.
    pub f16: bool,
}

/// Families that read or write cached KV rows through the type `kvt`, and
/// the name of their f16-storage module.
const KV_FAMILIES: &[(Family, &str)] = &[
    (Family::Ring, "ring_f16"),
    (Family::Attention, "attention_f16"),
    (Family::Compress, "compress_f16"),
    (Family::Indexer, "indexer_f16"),
];

impl Module {
    /// The module of `family` (f32 rows).
    pub const fn of(family: Family) -> Module {
        Module { family, f16: false }
    }

    /// Whether the family reads or writes cached KV rows (`kvt`).
    pub fn stores_kv(family: Family) -> bool {
        KV_FAMILIES.iter().any(|f| f.0 == family)
    }

    /// `<stem>`, or `<stem>_f16` for the f16-storage module.
    pub fn name(self) -> &'static str {
        match KV_FAMILIES.iter().find(|f| f.0 == self.family) {
            Some((_, n)) if self.f16 => n,
            _ => self.family.stem(),
        }
    }

    /// The module named `name` (see [`Module::name`]).
    pub fn from_name(name: &str) -> Option<Module> {
        if let Some((f, _)) = KV_FAMILIES.iter().find(|f| f.1 == name) {
            return Some(Module {
                family: *f,
                f16: true,
            });
        }
        Family::from_stem(name).map(Module::of)
    }

    /// Every module: each family, then the f16-storage ones.
    pub fn all() -> Vec<Module> {
        let mut out: Vec<Module> = Family::ALL.iter().map(|&f| Module::of(f)).collect();
        out.extend(KV_FAMILIES.iter().map(|f| Module {
            family: f.0,
            f16: true,
        }));
        out
    }

    /// The complete WGSL text handed to wgpu for `variant`: the family's
    /// helpers in [`HELPERS`] order, the `kvt` alias of a KV family, then
    /// the family's own file.
    pub fn source(self, variant: Variant) -> String {
        let family = self.family;
        let stem = family.stem();
        let helpers = family.wgsl_helpers();
        let mut out = String::new();
        if self.f16 {
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
        if Module::stores_kv(family) {
            out.push_str("// Element type of the cached KV rows (storage only; math is f32).\n");
            out.push_str(if self.f16 {
                "alias kvt = f16;\n"
            } else {
                "alias kvt = f32;\n"
            });
        }
        out.push_str(&format!("// ---- shaders/{stem}.wgsl ----\n"));
        out.push_str(&preprocess(stem, family.wgsl_source(), variant));
        out
    }
}

/// Names of every module (the f16-storage variants included).
pub fn families() -> Vec<&'static str> {
    Module::all().into_iter().map(Module::name).collect()
}

/// `family` without the f16-storage suffix, and whether it had it.
pub fn base_family(family: &str) -> (&str, bool) {
    match Module::from_name(family) {
        Some(m) if m.f16 => (m.family.stem(), true),
        _ => (family, false),
    }
}

/// The complete WGSL module named `family` for `variant` as handed to
/// wgpu, or `None` for an unknown name. `<family>_f16` names the
/// f16-storage variant of a KV family.
pub fn try_module_source_for(family: &str, variant: Variant) -> Option<String> {
    Some(Module::from_name(family)?.source(variant))
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
