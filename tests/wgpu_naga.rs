//! Every WGSL module, exactly as the program hands it to wgpu, parses and
//! validates under naga; every parameter struct's layout equals its Rust
//! `#[repr(C)]` twin (size and field offsets from naga's layouter).

use ds4::backend::wgpu::{params, shaders};

fn parse(family: &str, src: &str) -> naga::Module {
    naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{family}.wgsl: {}", e.emit_to_string(src)))
}

/// A validator with the capabilities a device of `variant` is created with.
/// Fallback: none of the optional features (kernels must not need
/// shader-f16 or subgroups; unpack2x16float, which naga files under
/// SHADER_FLOAT16_IN_FLOAT32, is core WGSL that wgpu allows on every Vulkan,
/// Metal and DX12 device). Subgroup variant: also SUBGROUP in compute with
/// the operation classes wgpu's Features::SUBGROUP guarantees.
fn validator(variant: shaders::Variant) -> naga::valid::Validator {
    validator_with(variant, false)
}

/// [`validator`], plus SHADER_FLOAT16 for the `<family>_f16` modules.
fn validator_with(variant: shaders::Variant, f16: bool) -> naga::valid::Validator {
    use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet};
    let mut caps = Capabilities::default() | Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if f16 {
        caps |= Capabilities::SHADER_FLOAT16;
    }
    if variant.subgroups {
        caps |= Capabilities::SUBGROUP;
    }
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    if variant.subgroups {
        v.subgroup_stages(ShaderStages::COMPUTE);
        v.subgroup_operations(
            SubgroupOperationSet::BASIC
                | SubgroupOperationSet::VOTE
                | SubgroupOperationSet::ARITHMETIC
                | SubgroupOperationSet::BALLOT
                | SubgroupOperationSet::SHUFFLE
                | SubgroupOperationSet::SHUFFLE_RELATIVE,
        );
    }
    v
}

#[test]
fn every_module_parses_and_validates() {
    let modules = shaders::all_variants();
    assert!(modules.len() >= 12, "only {} modules", modules.len());
    for (family, variant, src) in modules {
        let module = parse(family, &src);
        // The `<family>_f16` modules (cached rows stored as f16) are used
        // only where the device has shader-f16: they get SHADER_FLOAT16,
        // every other module must validate without it.
        let (_, f16) = shaders::base_family(family);
        let mut v = validator_with(variant, f16);
        if f16 {
            assert!(src.starts_with("enable f16;"), "{family}: no enable f16");
        } else {
            assert!(!src.contains("enable f16"), "{family}: needs shader-f16");
        }
        if let Err(e) = v.validate(&module) {
            panic!("{family} ({}): {}", variant.name(), e.emit_to_string(&src));
        }
        assert!(
            !module.entry_points.is_empty(),
            "{family}.wgsl has no entry point"
        );
    }
}

/// The subgroup variant exists where the issue asks for it (matrix products,
/// routed experts, RMS norm, attention), and the fallback of every family
/// names no subgroup operation: a device without the feature must accept it.
#[test]
fn subgroup_variants_cover_the_decode_reductions() {
    let variants = shaders::all_variants();
    for family in ["matmul", "moe", "norm", "attention"] {
        let (_, _, src) = variants
            .iter()
            .find(|(f, v, _)| *f == family && v.subgroups)
            .unwrap_or_else(|| panic!("{family} has no subgroup variant"));
        assert!(src.contains("subgroupAdd"), "{family}: no subgroupAdd");
        // The strict validator (no SUBGROUP capability) must reject it, so the
        // test above really checks the capability path.
        let m = parse(family, src);
        assert!(
            validator(shaders::Variant::FALLBACK).validate(&m).is_err(),
            "{family}: subgroup variant validates without the capability"
        );
    }
    for (family, src) in shaders::all_modules() {
        let names_subgroup = src
            .lines()
            .any(|l| l.split("//").next().unwrap_or("").contains("subgroup"));
        assert!(
            !names_subgroup,
            "{family}: the fallback names a subgroup builtin"
        );
    }
}

#[test]
fn parameter_structs_match_their_rust_twins() {
    let modules: Vec<(String, naga::Module)> = shaders::all_modules()
        .into_iter()
        .map(|(f, s)| (f.to_string(), parse(f, &s)))
        .collect();
    let twins = params::twins();
    let mut checked = 0;
    for (name, size, fields) in &twins {
        let mut found = false;
        for (family, m) in &modules {
            for (_, ty) in m.types.iter() {
                if ty.name.as_deref() != Some(name) {
                    continue;
                }
                let naga::TypeInner::Struct { members, span } = &ty.inner else {
                    panic!("{family}: {name} is not a struct");
                };
                found = true;
                assert_eq!(*span as usize, *size, "{family}: size of {name}");
                let got: Vec<(String, usize)> = members
                    .iter()
                    .map(|mm| (mm.name.clone().unwrap_or_default(), mm.offset as usize))
                    .collect();
                let want: Vec<(String, usize)> =
                    fields.iter().map(|(f, o)| (f.to_string(), *o)).collect();
                assert_eq!(got, want, "{family}: fields of {name}");
                checked += 1;
            }
        }
        assert!(found, "no WGSL struct {name}");
    }
    // The matmul family's parameter struct (src/backend/wgpu/matmul.rs).
    {
        use ds4::backend::wgpu::matmul::MatmulParams;
        use std::mem::{offset_of, size_of};
        let src = shaders::module_source("matmul");
        let m = parse("matmul", &src);
        let (_, ty) = m
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some("MatmulParams"))
            .expect("MatmulParams in matmul.wgsl");
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            panic!("MatmulParams is not a struct")
        };
        assert_eq!(*span as usize, size_of::<MatmulParams>());
        let off = |n: &str| {
            members
                .iter()
                .find(|x| x.name.as_deref() == Some(n))
                .unwrap()
                .offset as usize
        };
        assert_eq!(off("n_in"), offset_of!(MatmulParams, n_in));
        assert_eq!(off("grid_x"), offset_of!(MatmulParams, grid_x));
        assert_eq!(off("clamp"), offset_of!(MatmulParams, clamp));
        assert_eq!(off("mode"), offset_of!(MatmulParams, mode));
    }
    // The gpu::StepUniform the backend writes has the checked layout too.
    assert_eq!(
        std::mem::size_of::<ds4::backend::wgpu::StepUniform>(),
        std::mem::size_of::<params::StepUniform>()
    );
    assert!(checked >= twins.len());
}

#[test]
fn dump_writes_every_module() {
    let dir = std::env::temp_dir().join(format!("ds4-shaders-{}", std::process::id()));
    let written = shaders::dump(&dir).unwrap();
    let variants = shaders::all_variants();
    assert_eq!(written.len(), variants.len());
    assert!(
        written.len() > shaders::families().len(),
        "no subgroup variant written"
    );
    for ((f, v, src), p) in variants.iter().zip(&written) {
        assert_eq!(
            p.file_name().unwrap().to_str().unwrap(),
            shaders::dump_name(f, *v)
        );
        assert_eq!(&std::fs::read_to_string(p).unwrap(), src);
        assert_eq!(src, &shaders::module_source_for(f, *v));
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `DS4_WGPU_FEATURES` values: all, none, lists, and a clear error naming
/// the variable and the bad word.
#[test]
fn feature_lists_parse_and_bad_words_are_errors() {
    use ds4::backend::wgpu::gpu::{parse_features, OPTIONAL_FEATURES};
    use wgpu::Features as F;
    assert_eq!(parse_features("all").unwrap(), OPTIONAL_FEATURES);
    assert_eq!(parse_features("none").unwrap(), F::empty());
    assert_eq!(parse_features("").unwrap(), F::empty());
    assert_eq!(
        parse_features(" f16 , Subgroups").unwrap(),
        F::SHADER_F16 | F::SUBGROUP
    );
    assert_eq!(parse_features("timestamps").unwrap(), F::TIMESTAMP_QUERY);
    let e = parse_features("f16,warp-drive").unwrap_err().to_string();
    assert!(
        e.contains("DS4_WGPU_FEATURES") && e.contains("warp-drive"),
        "{e}"
    );
}
