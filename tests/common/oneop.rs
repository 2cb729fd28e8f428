//! The cross-backend one-op harness's test runners. The harness (weights,
//! builder, cases, per-op tolerances, comparison) is the library's
//! (src/app/selfcheck/oneop.rs, cases/), shared with `ds4-bench --check`;
//! here each case runs on the fast CPU backend, on wgpu (with and without
//! subgroups) and on CUDA (the host emulator of tests/cuda_emu when there
//! is no GPU) against the CPU twin, and a failure fails the test. A test
//! binary using it declares `mod cuda_emu` (feature `cuda`).

use std::sync::Arc;

use ds4::backend::cpu::CpuBackend;
use ds4::backend::wgpu::{AdapterChoice, Gpu, WgpuBackend};
use ds4::backend::{Backend, BackendOptions};
use ds4::graph::StateId;

// Not every binary including this file uses each name.
#[allow(unused_imports)]
pub use ds4::app::selfcheck::oneop::{
    run_case, run_cases, worst, Builder, Case, CaseReport, Rule, Weights,
};

/// The op's tolerance (abs, rel); every op with a case has one.
pub fn tolerance(op: &str) -> (f32, f32) {
    ds4::app::selfcheck::oneop::tolerance(op).unwrap_or_else(|| panic!("no tolerance for {op}"))
}

/// The devices the GPU half of the suite runs on: the adapter with every
/// optional feature it has and, when that device uses subgroups, the same
/// adapter without them, so the subgroup kernels and their workgroup-memory
/// fallbacks are both checked in one run (whatever the default policy or
/// `DS4_WGPU_FEATURES` would pick). Empty (skip) outside CI when no adapter
/// opens; in CI that is a failure.
pub fn gpus() -> Vec<Arc<Gpu>> {
    use ds4::backend::wgpu::gpu::OPTIONAL_FEATURES;
    let choice = AdapterChoice::new(&BackendOptions::from_env(), true);
    match Gpu::shared_with(&choice, OPTIONAL_FEATURES) {
        Ok(g) => {
            let mut out = vec![g.clone()];
            if g.shader_variant().subgroups {
                let plain = OPTIONAL_FEATURES - wgpu::Features::SUBGROUP;
                match Gpu::shared_with(&choice, plain) {
                    Ok(p) => out.push(p),
                    Err(e) => panic!("the same adapter without subgroups: {e}"),
                }
            }
            for g in &out {
                eprintln!(
                    "wgpu device: {} ({} kernels)",
                    g.describe(),
                    g.shader_variant().name()
                );
            }
            out
        }
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but no wgpu adapter opened: {e}");
            }
            eprintln!("skipping the wgpu half: {e}");
            Vec::new()
        }
    }
}

/// Prints each output's figure and fails on any case past its tolerance
/// (`who` names the backend in the lines).
fn assert_reports(reports: &[CaseReport], who: &str) {
    let mut failures = Vec::new();
    for r in reports {
        failures.extend(r.failures(who));
        for d in &r.diffs {
            eprintln!(
                "{:<60} [{who}] {} #{}: max |Δ| {:e}, {:.3} of the tolerance",
                r.label, d.what, d.index, d.max_abs, d.ratio
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

pub fn check_on_gpu(gpu: &Arc<Gpu>, cases: &[Case]) {
    let reports = run_cases(cases, Rule::Gpu(None), &mut |case| {
        let b = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone())?;
        Ok(Box::new(b) as Box<dyn Backend>)
    });
    assert_reports(&reports, &format!("wgpu {}", gpu.shader_variant().name()));
}

/// Runs each case on `gpu` twice: with whole state bindings and with every
/// state split into chunks of whole rows of at most `cap` bytes
/// (`BackendOptions::state_chunk_cap`, as tests/wgpu_chunked.rs does). The
/// chunked run must be bit-identical to the whole one (outputs and final
/// states: chunking moves rows, not arithmetic) and within the op's
/// tolerance of the CPU twin. Returns each case's chunks per state, for the
/// caller to check that its states really span several.
// Not every binary including this file uses it (tests/ops_backends.rs).
#[allow(dead_code)]
pub fn check_chunked_on_gpu(gpu: &Arc<Gpu>, cases: &[(Case, u64)]) -> Vec<Vec<usize>> {
    let variant = gpu.shader_variant().name();
    let mut failures = Vec::new();
    let mut chunks = Vec::new();
    for (case, cap) in cases {
        let failed_before = failures.len();
        let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
        let want = run_case(case, &mut cpu).unwrap_or_else(|e| panic!("{}: cpu: {e}", case.label));
        let mut whole = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let opts = BackendOptions {
            state_chunk_cap: Some(*cap),
            ..BackendOptions::default()
        };
        let mut split =
            WgpuBackend::with_options(gpu.clone(), case.file.clone(), case.layout.clone(), &opts)
                .unwrap_or_else(|e| panic!("{} (chunks of {cap} B): {e}", case.label));
        chunks.push(
            (0..case.states.len())
                .map(|i| split.state_chunks(StateId(i as u32)))
                .collect::<Vec<_>>(),
        );
        let (a, b) = match (run_case(case, &mut whole), run_case(case, &mut split)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                failures.push(format!(
                    "{} [{variant}]: whole {:?} / chunked {:?}",
                    case.label,
                    a.err(),
                    b.err()
                ));
                continue;
            }
        };
        let (abs, rel) = tolerance(case.op_name);
        let outs =
            b.0.iter()
                .zip(&a.0)
                .zip(&want.0)
                .map(|(x, w)| ("output", x, w));
        let states =
            b.1.iter()
                .zip(&a.1)
                .zip(&want.1)
                .map(|(x, w)| ("state", x, w));
        for (i, (what, (got, whole), want)) in outs.chain(states).enumerate() {
            let differ = got
                .iter()
                .zip(whole.iter())
                .position(|(x, y)| x.to_bits() != y.to_bits());
            if let Some(at) = differ {
                failures.push(format!(
                    "{} [{variant}]: {what} #{i} element {at}: chunked {} vs whole {}",
                    case.label, got[at], whole[at]
                ));
            }
            let (r, at, gv, wv) = worst(got, want, abs, rel);
            if r > 1.0 {
                failures.push(format!(
                    "{} [{variant}]: {what} #{i} element {at}: chunked wgpu {gv} vs cpu {wv} ({r:.2}× the tolerance)",
                    case.label
                ));
            }
        }
        if failures.len() == failed_before {
            eprintln!(
                "{:<60} [{variant}] chunks of {cap} B per state {:?}: bit-identical to whole bindings",
                case.label,
                chunks.last().unwrap()
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    chunks
}

/// Runs every case on the CPU twice (fresh backends): the harness itself
/// must be deterministic and fill every output.
pub fn check_cpu_self(cases: &[Case]) {
    for case in cases {
        let a = run_case(
            case,
            &mut CpuBackend::new(case.file.clone(), case.layout.clone()),
        )
        .unwrap();
        let b = run_case(
            case,
            &mut CpuBackend::new(case.file.clone(), case.layout.clone()),
        )
        .unwrap();
        for (x, y) in a.0.iter().zip(&b.0) {
            assert!(
                x.iter().all(|v| !v.is_nan()),
                "{}: NaN left in an output",
                case.label
            );
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{}",
                case.label
            );
        }
    }
}

/// Runs every case on the fast CPU backend on each kernel path this machine
/// has (the portable one included) and compares with the reference under
/// the library's `FAST_CPU_TOLERANCE` rule.
pub fn check_fast_cpu(cases: &[Case]) {
    use ds4::backend::cpu::fast::{Isa, Kernels};
    for isa in Isa::available() {
        let reports = run_cases(cases, Rule::FastCpu, &mut |case| {
            let k = Kernels::new(isa).unwrap();
            let b = CpuBackend::fast(case.file.clone(), case.layout.clone(), k);
            Ok(Box::new(b) as Box<dyn Backend>)
        });
        assert_reports(&reports, &format!("fast cpu {}", isa.name()));
    }
}

pub fn check(cases: Vec<Case>) {
    assert!(!cases.is_empty());
    check_cpu_self(&cases);
    check_fast_cpu(&cases);
    for g in gpus() {
        check_on_gpu(&g, &cases);
    }
    #[cfg(feature = "cuda")]
    cuda_half::check_on_cuda(&cases);
}

/// The same cases on the CUDA backend (feature `cuda`): on the GPU when
/// there is one, else on the host emulator of tests/cuda_emu (CI).
#[cfg(feature = "cuda")]
pub mod cuda_half {
    use super::*;

    pub fn check_on_cuda(cases: &[Case]) {
        check_with(cases, false, None)
    }

    /// With the tensor-core prefill matmul (`mma_*`) switched on, compared
    /// with `tol` (abs, rel) instead of the op's tolerance.
    pub fn check_tensor_cores(cases: &[Case], tol: (f32, f32)) {
        check_with(cases, true, Some(tol))
    }

    fn check_with(cases: &[Case], tensor_cores: bool, tol: Option<(f32, f32)>) {
        match crate::cuda_emu::install() {
            Ok(d) => eprintln!("cuda half on {d}"),
            Err(e) if std::env::var_os("CI").is_some() => {
                panic!("CI: no CUDA driver or emulator: {e}")
            }
            Err(e) => eprintln!("no CUDA emulator: {e}"),
        }
        let cc = match ds4::backend::cuda::list_devices() {
            Ok(d) => {
                eprintln!("cuda device: {}", d[0].line());
                d[0].cc_number()
            }
            Err(e) => {
                eprintln!("skipping the cuda half: {e}");
                return;
            }
        };
        if tensor_cores && cc < 80 {
            eprintln!("skipping tensor cores: the device is below sm_80");
            return;
        }
        let opts = BackendOptions {
            cuda_mma: tensor_cores,
            ..BackendOptions::from_env()
        };
        let reports = run_cases(cases, Rule::Gpu(tol), &mut |case| {
            let b = ds4::backend::cuda::CudaBackend::open(
                case.file.clone(),
                case.layout.clone(),
                &opts,
            )?;
            Ok(Box::new(b) as Box<dyn Backend>)
        });
        assert_reports(&reports, if tensor_cores { "cuda mma" } else { "cuda" });
    }
}
