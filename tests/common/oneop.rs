//! The cross-backend one-op harness (tests/ops_backends.rs holds the
//! cases): per-op tolerances, weights written with the real quantizers into
//! a GGUF in memory, a one-op graph builder, and runners that compare a case
//! on the fast CPU backend, on wgpu (with and without subgroups) and on CUDA
//! (the host emulator of tests/cuda_emu when there is no GPU) with the CPU
//! twin. A test binary using it declares `mod cuda_emu` (feature `cuda`).

use std::sync::Arc;

use ds4::backend::cpu::CpuBackend;
use ds4::backend::wgpu::{AdapterChoice, Gpu, WgpuBackend};
use ds4::backend::{Backend, BackendError, BackendOptions};
use ds4::gguf::TensorRef;
use ds4::gguf::{GgufFile, GgufWriter};
use ds4::graph::ops::Op;
use ds4::graph::{Recorder, StateId, StateLayout, StepParams, ValueId};
use ds4::quant::{self, GgmlType};

/// Per-op tolerance of a GPU backend against the CPU twin: |got − want| ≤
/// abs + rel·|want|. Selections (indexer, router indices) must be equal.
/// Why each is not zero: f32 tree reductions instead of the CPU's f64 or
/// 8-lane sums (norm, attention, compressor, indexer scores), the GPU's own
/// exp/log/sin/cos (hc_mix, rope, router, attention), fused multiply-adds.
pub const TOLERANCE: &[(&str, f32, f32)] = &[
    ("embed", 0.0, 0.0),
    ("hc_init", 0.0, 0.0),
    ("add", 0.0, 0.0),
    ("scale", 0.0, 0.0),
    ("take_last", 0.0, 0.0),
    ("gather_last", 0.0, 0.0),
    ("ring_write", 0.0, 0.0),
    ("swiglu", 1e-6, 1e-5),
    ("rms_norm", 1e-6, 1e-5),
    ("hc_mix", 1e-6, 1e-5),
    ("hc_collapse", 1e-6, 1e-6),
    ("hc_expand", 1e-6, 1e-6),
    ("rope", 1e-5, 1e-5),
    // Rounded values: a one-ulp difference before the rounding may move a
    // value to the neighbouring grid point (rare; compared by count below).
    ("kv_round", 1e-6, 1e-5),
    ("hadamard_fp4", 1e-6, 1e-5),
    ("attention", 1e-5, 1e-4),
    ("compress", 1e-5, 1e-4),
    ("indexer_topk", 0.0, 0.0),
    ("router", 1e-6, 1e-5),
    // Products sum hundreds of terms of order one: an element near zero by
    // cancellation carries the absolute error of the whole sum (outputs are
    // of order 10 here, so 2e-4 is ~1e-5 of their scale).
    ("matmul", 1e-4, 1e-4),
    ("moe_experts", 2e-4, 1e-4),
    // DeepSeek V4.1 (tests/v41_ops_backends.rs): the gate's three f32 tree
    // sums of `dim` terms and the GPU's sigmoid scale the shared value;
    // the compressor's norms, dot products and RoPE as the V4 compressor.
    ("v41_hc_one_hot", 0.0, 0.0),
    ("v41_engram_gate", 1e-5, 1e-5),
    ("v41_compress", 1e-5, 1e-4),
    ("v41_candidate_blocks", 0.0, 0.0),
    ("v41_candidate_topk", 0.0, 0.0),
];

pub fn tolerance(op: &str) -> (f32, f32) {
    TOLERANCE
        .iter()
        .find(|t| t.0 == op)
        .map(|t| (t.1, t.2))
        .unwrap_or_else(|| panic!("no tolerance for {op}"))
}

/// Weights of one case, written with the real quantizers into a GGUF in
/// memory.
#[derive(Default)]
pub struct Weights {
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Weights {
    pub fn add(&mut self, name: &str, ne: &[u64], ty: GgmlType, values: &[f32]) {
        let row = ne[0] as usize;
        let rb = ty.row_bytes(ne[0]).unwrap() as usize;
        let mut bytes = vec![0u8; values.len() / row * rb];
        for (src, dst) in values.chunks_exact(row).zip(bytes.chunks_exact_mut(rb)) {
            quant::quantize_row(ty, src, dst, None).unwrap();
        }
        self.tensors.push((name.into(), ne.to_vec(), ty, bytes));
    }

    pub fn add_i32(&mut self, name: &str, ne: &[u64], values: &[i32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.into(), ne.to_vec(), GgmlType::I32, bytes));
    }

    /// A compressor's weights, random from `rng`: `ape` (`ratio` rows of
    /// `width`), then `norm` (`head_dim`).
    pub fn compressor(
        rng: &mut crate::common::rng::Rng,
        ratio: usize,
        width: usize,
        head_dim: usize,
    ) -> Weights {
        let mut w = Weights::default();
        w.add(
            "ape",
            &[width as u64, ratio as u64],
            GgmlType::F32,
            &rng.scaled(ratio * width, 1.0),
        );
        w.add(
            "norm",
            &[head_dim as u64],
            GgmlType::F32,
            &rng.scaled(head_dim, 1.5),
        );
        w
    }

    pub fn build(self) -> (Arc<GgufFile>, Vec<TensorRef>) {
        let mut w = GgufWriter::new();
        for (n, ne, ty, b) in &self.tensors {
            w.add_tensor(n, ne, *ty, b.clone()).unwrap();
        }
        let f = GgufFile::from_vec(w.to_bytes().unwrap()).unwrap();
        let refs = self
            .tensors
            .iter()
            .map(|(n, ne, ty, _)| {
                let info = f.tensor_info(n).unwrap();
                let mut a = [1u64; 4];
                a[..ne.len()].copy_from_slice(ne);
                TensorRef {
                    name: n.clone(),
                    ty: *ty,
                    ne: a,
                    offset: f.data_offset() + info.offset,
                    n_bytes: info.n_bytes,
                }
            })
            .collect();
        (Arc::new(f), refs)
    }
}

/// One op in a graph of its own, with its inputs and starting state.
pub struct Case {
    pub label: String,
    pub op_name: &'static str,
    pub file: Arc<GgufFile>,
    pub layout: StateLayout,
    pub states: Vec<Vec<f32>>,
    pub graph: Arc<ds4::graph::Graph>,
    pub inputs: Vec<(ValueId, Vec<f32>)>,
    pub outputs: Vec<ValueId>,
    pub tokens: Vec<u32>,
    pub pos0: usize,
}

/// Builds a case: `make` records the op (given the weight refs) and returns
/// (op, inputs, outputs).
pub struct Builder {
    pub rec: Recorder,
    pub layout: StateLayout,
    pub states: Vec<Vec<f32>>,
    pub tokens: ValueId,
    pub n: usize,
}

impl Builder {
    pub fn new(max_tokens: usize, n: usize) -> Builder {
        let mut rec = Recorder::new(max_tokens);
        let tokens = rec.tokens_i32("tokens", 1);
        Builder {
            rec,
            layout: StateLayout::default(),
            states: Vec::new(),
            tokens,
            n,
        }
    }

    pub fn state(&mut self, name: &str, rows: usize, cols: usize, init: Vec<f32>) -> StateId {
        assert_eq!(init.len(), rows * cols);
        self.states.push(init);
        self.layout.add(name, None, rows, cols, 0.0)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        mut self,
        label: String,
        file: Arc<GgufFile>,
        op: Op,
        inputs: Vec<(ValueId, Vec<f32>)>,
        tokens: Vec<u32>,
        pos0: usize,
    ) -> Case {
        let op_name = op.name();
        let outputs = op.outputs();
        self.rec.op(op);
        let logits = outputs.first().copied().unwrap_or(self.tokens);
        let graph = Arc::new(self.rec.finish(self.tokens, logits, outputs.clone()));
        let tokens = if tokens.is_empty() {
            vec![0; self.n]
        } else {
            tokens
        };
        Case {
            label,
            op_name,
            file,
            layout: self.layout,
            states: self.states,
            graph,
            inputs,
            outputs,
            tokens,
            pos0,
        }
    }
}

/// Outputs (live rows) and final states of one case on one backend.
pub type Results = (Vec<Vec<f32>>, Vec<Vec<f32>>);

pub fn run_case(case: &Case, b: &mut dyn Backend) -> Result<Results, BackendError> {
    let h = b.load_graph(case.graph.clone())?;
    for (i, s) in case.states.iter().enumerate() {
        b.write_state(StateId(i as u32), s)?;
    }
    for (v, data) in &case.inputs {
        b.write_value(h, *v, data)?;
    }
    for &v in &case.outputs {
        let d = case.graph.value(v);
        let poison = match d.dtype {
            ds4::graph::DType::F32 => f32::NAN,
            ds4::graph::DType::I32 => -12345.0,
        };
        b.write_value(h, v, &vec![poison; d.len()])?;
    }
    let n = case.tokens.len();
    b.run(
        h,
        &case.tokens,
        StepParams {
            pos0: case.pos0,
            n_tokens: n,
        },
    )?;
    let outs = case
        .outputs
        .iter()
        .map(|&v| b.read_value(h, v))
        .collect::<Result<_, _>>()?;
    let states = (0..case.states.len())
        .map(|i| b.read_state(StateId(i as u32)))
        .collect::<Result<_, _>>()?;
    Ok((outs, states))
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

/// Largest |got − want| / (abs + rel·|want|) over every element; > 1 fails.
pub fn worst(got: &[f32], want: &[f32], abs: f32, rel: f32) -> (f64, usize, f32, f32) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let mut w = (0f64, 0usize, 0f32, 0f32);
    for (i, (&g, &x)) in got.iter().zip(want).enumerate() {
        let err = (g - x).abs() as f64;
        let bound = abs as f64 + rel as f64 * x.abs() as f64;
        let r = if g.is_nan() != x.is_nan() {
            f64::INFINITY
        } else if g.is_nan() || err == 0.0 {
            0.0
        } else if bound == 0.0 {
            f64::INFINITY
        } else {
            err / bound
        };
        if r > w.0 {
            w = (r, i, g, x);
        }
    }
    w
}

pub fn check_on_gpu(gpu: &Arc<Gpu>, cases: &[Case]) {
    let mut failures = Vec::new();
    let variant = gpu.shader_variant().name();
    for case in cases {
        let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
        let want = run_case(case, &mut cpu).unwrap_or_else(|e| panic!("{}: cpu: {e}", case.label));
        let mut wg = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let got = match run_case(case, &mut wg) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{} [{variant}]: {e}", case.label));
                continue;
            }
        };
        let (abs, rel) = tolerance(case.op_name);
        let pairs = got.0.iter().zip(&want.0).map(|(g, w)| ("output", g, w));
        let spairs = got.1.iter().zip(&want.1).map(|(g, w)| ("state", g, w));
        for (i, (what, g, w)) in pairs.chain(spairs).enumerate() {
            let (r, at, gv, wv) = worst(g, w, abs, rel);
            if r > 1.0 {
                failures.push(format!(
                    "{} [{variant}]: {what} #{i} element {at}: wgpu {gv} vs cpu {wv} ({r:.2}× the tolerance)",
                    case.label
                ));
            }
            let err = g
                .iter()
                .zip(w.iter())
                .filter(|(a, b)| !a.is_nan() || !b.is_nan())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!(
                "{:<60} [{variant}] {what} #{i}: max |Δ| {err:e}",
                case.label
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

/// Tolerance of the fast CPU backend (`cpu`) against the reference
/// (`cpu-ref`), as max |Δ| / (max |want| + ‖x‖₂) over an output (‖x‖₂ of
/// the activation input stands in for Σ|w·x| when outputs cancel): the matrix products
/// quantise their activations to int8 (the tight per-format bounds, in units
/// of Σ|w·x|, are in tests/cpu_fast.rs); attention sums with FMA in another
/// order; the indexer must choose the same rows; every other op is the same
/// twin and must be bit-identical.
pub const FAST_CPU_TOLERANCE: &[(&str, f32)] =
    &[("matmul", 2e-2), ("moe_experts", 3e-2), ("attention", 1e-5)];

/// Runs every case on the fast CPU backend on each kernel path this machine
/// has (the portable one included) and compares with the reference.
pub fn check_fast_cpu(cases: &[Case]) {
    use ds4::backend::cpu::fast::{Isa, Kernels};
    for case in cases {
        let want = run_case(
            case,
            &mut CpuBackend::new(case.file.clone(), case.layout.clone()),
        )
        .unwrap();
        let x_norm = case
            .inputs
            .first()
            .map_or(0.0, |(_, v)| v.iter().map(|a| a * a).sum::<f32>().sqrt());
        let tol = FAST_CPU_TOLERANCE
            .iter()
            .find(|t| t.0 == case.op_name)
            .map_or(0.0, |t| t.1);
        for isa in Isa::available() {
            let k = Kernels::new(isa).unwrap();
            let got = run_case(
                case,
                &mut CpuBackend::fast(case.file.clone(), case.layout.clone(), k),
            )
            .unwrap_or_else(|e| panic!("{}: fast cpu {}: {e}", case.label, isa.name()));
            let pairs = got.0.iter().zip(&want.0).chain(got.1.iter().zip(&want.1));
            for (i, (g, w)) in pairs.enumerate() {
                let scale = w
                    .iter()
                    .filter(|v| !v.is_nan())
                    .fold(0f32, |m, v| m.max(v.abs()))
                    + x_norm;
                let err = g
                    .iter()
                    .zip(w.iter())
                    .map(|(a, b)| {
                        if a.is_nan() != b.is_nan() {
                            f32::INFINITY
                        } else if a.is_nan() {
                            0.0
                        } else {
                            (a - b).abs()
                        }
                    })
                    .fold(0f32, f32::max);
                if tol == 0.0 {
                    assert!(
                        g.iter()
                            .map(|v| v.to_bits())
                            .eq(w.iter().map(|v| v.to_bits())),
                        "{}: fast cpu {} #{i} differs from the reference (max |Δ| {err:e})",
                        case.label,
                        isa.name()
                    );
                } else {
                    assert!(
                        err <= tol * scale.max(1e-30),
                        "{}: fast cpu {} #{i}: max |Δ| {err:e} > {tol:e} · {scale:e}",
                        case.label,
                        isa.name()
                    );
                    eprintln!(
                        "{:<60} fast cpu {:<8} #{i}: max |Δ|/scale {:.2e}",
                        case.label,
                        isa.name(),
                        err / scale.max(1e-30)
                    );
                }
            }
        }
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
    use ds4::backend::cuda::CudaBackend;

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
        match ds4::backend::cuda::list_devices() {
            Ok(d) => eprintln!("cuda device: {}", d[0].line()),
            Err(e) => {
                eprintln!("skipping the cuda half: {e}");
                return;
            }
        }
        let mut failures = Vec::new();
        for case in cases {
            let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
            let want =
                run_case(case, &mut cpu).unwrap_or_else(|e| panic!("{}: cpu: {e}", case.label));
            let mut cb = CudaBackend::open(
                case.file.clone(),
                case.layout.clone(),
                &BackendOptions::from_env(),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
            if tensor_cores && !cb.set_tensor_cores(true) {
                eprintln!("skipping tensor cores: the device is below sm_80");
                return;
            }
            let got = match run_case(case, &mut cb) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{}: {e}", case.label));
                    continue;
                }
            };
            let (abs, rel) = tol.unwrap_or_else(|| tolerance(case.op_name));
            let pairs = got.0.iter().zip(&want.0).map(|(g, w)| ("output", g, w));
            let spairs = got.1.iter().zip(&want.1).map(|(g, w)| ("state", g, w));
            for (i, (what, g, w)) in pairs.chain(spairs).enumerate() {
                let (r, at, gv, wv) = worst(g, w, abs, rel);
                if r > 1.0 {
                    failures.push(format!(
                        "{}: {what} #{i} element {at}: cuda {gv} vs cpu {wv} ({r:.2}× the tolerance)",
                        case.label
                    ));
                }
                eprintln!(
                    "cuda {:<55} {what} #{i}: worst {r:.3} of the tolerance",
                    case.label
                );
            }
        }
        assert!(
            failures.is_empty(),
            "{} cuda failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
