//! Every WGSL module, exactly as the program hands it to wgpu, parses and
//! validates under naga; every parameter struct's layout equals its Rust
//! `#[repr(C)]` twin (size and field offsets from naga's layouter).

use ds4::backend::wgpu::{params, shaders};

fn parse(family: &str, src: &str) -> naga::Module {
    naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{family}.wgsl: {}", e.emit_to_string(src)))
}

#[test]
fn every_module_parses_and_validates() {
    let modules = shaders::all_modules();
    assert!(modules.len() >= 12, "only {} modules", modules.len());
    for (family, src) in modules {
        let module = parse(family, &src);
        // The capabilities a device without optional features has: kernels
        // must not need shader-f16 or subgroups. (unpack2x16float, which
        // naga files under SHADER_FLOAT16_IN_FLOAT32, is core WGSL that wgpu
        // allows on every Vulkan, Metal and DX12 device.)
        // The `<family>_f16` modules (cached rows stored as f16) are used
        // only where the device has shader-f16: they get SHADER_FLOAT16,
        // every other module must validate without it.
        let mut caps = naga::valid::Capabilities::default()
            | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        let (_, f16) = shaders::base_family(family);
        if f16 {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16;
            assert!(src.starts_with("enable f16;"), "{family}: no enable f16");
        } else {
            assert!(!src.contains("enable f16"), "{family}: needs shader-f16");
        }
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
        if let Err(e) = v.validate(&module) {
            panic!("{family}.wgsl: {}", e.emit_to_string(&src));
        }
        assert!(
            !module.entry_points.is_empty(),
            "{family}.wgsl has no entry point"
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
    assert_eq!(written.len(), shaders::families().len());
    for p in &written {
        let text = std::fs::read_to_string(p).unwrap();
        let fam = p.file_stem().unwrap().to_str().unwrap();
        assert_eq!(text, shaders::module_source(fam));
    }
    std::fs::remove_dir_all(&dir).ok();
}
