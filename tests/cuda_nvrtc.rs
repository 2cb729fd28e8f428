//! Every CUDA kernel family compiles to PTX with NVRTC for the target
//! architectures, warnings as errors (issue 9). Needs no GPU: NVRTC comes
//! from `DS4_NVRTC`, the loader path or the PyPI wheel `nvidia-cuda-nvrtc`
//! (installed by .ci/run). Without NVRTC the test fails under CI=true and
//! is skipped with a message elsewhere.
#![cfg(feature = "cuda")]

use ds4::backend::cuda::{kernels, nvrtc::Nvrtc};
use ds4::backend::kernels::Family;
use ds4::backend::BackendOptions;

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load(BackendOptions::from_env().nvrtc.as_deref()) {
        Ok(n) => Some(n),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// sm_80, sm_90 and the newest Blackwell targets the NVRTC knows (120/121).
fn target_archs(n: &Nvrtc) -> Vec<u32> {
    let mut archs = vec![80, 90];
    archs.extend(n.archs.iter().copied().filter(|&a| a >= 120));
    if !archs.iter().any(|&a| a >= 120) {
        archs.extend(n.archs.iter().copied().max());
    }
    archs
}

#[test]
fn every_family_compiles_to_ptx_for_every_target_without_warnings() {
    let Some(n) = nvrtc() else { return };
    eprintln!(
        "NVRTC {}.{} from {}",
        n.version.0,
        n.version.1,
        n.path.display()
    );
    let archs = target_archs(&n);
    assert!(
        archs.contains(&80) && archs.contains(&90),
        "archs {archs:?}"
    );
    // One thread per architecture (NVRTC programs are independent).
    let modules = kernels::all_modules();
    std::thread::scope(|sc| {
        for &arch in &archs {
            let (n, modules) = (&n, &modules);
            sc.spawn(move || {
                for (family, src) in modules {
                    let c = n
                        .compile(&format!("{family}.cu"), src, arch)
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert!(c.log.is_empty(), "{family} compute_{arch}: {}", c.log);
                    assert!(
                        c.ptx.contains(&format!(".target sm_{arch}")),
                        "{family} compute_{arch}"
                    );
                    for name in kernels::entry_points(*family) {
                        assert!(
                            c.ptx.contains(&format!(".entry {name}(")),
                            "{family} compute_{arch}: no kernel {name}"
                        );
                    }
                }
            });
        }
    });
}

#[test]
fn a_broken_kernel_is_reported_with_its_log() {
    let Some(n) = nvrtc() else { return };
    let e = n
        .compile(
            "bad.cu",
            "extern \"C\" __global__ void k(float* x) { int unused; x[0] = 1.0f; }",
            80,
        )
        .err()
        .expect("a warning must fail the compile");
    assert!(e.contains("bad.cu") && e.contains("unused"), "{e}");
}

#[test]
fn the_ptx_cache_is_keyed_by_source_arch_and_nvrtc_version() {
    let a = kernels::cache_name("norm", "x", 80, (13, 0));
    assert_ne!(a, kernels::cache_name("norm", "y", 80, (13, 0)));
    assert_ne!(a, kernels::cache_name("norm", "x", 90, (13, 0)));
    assert_ne!(a, kernels::cache_name("norm", "x", 80, (12, 9)));
    assert_eq!(a, kernels::cache_name("norm", "x", 80, (13, 0)));
    let Some(n) = nvrtc() else { return };
    let dir = std::env::temp_dir().join(format!("ds4-ptx-cache-{}", std::process::id()));
    let first = kernels::ptx(&n, Family::Ring, 80, Some(&dir)).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    // A second request is served from the file (identical text).
    assert_eq!(
        kernels::ptx(&n, Family::Ring, 80, Some(&dir)).unwrap(),
        first
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
