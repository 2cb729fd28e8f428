//! The cross-backend one-op suite: every op of `Op` is recorded alone
//! through `Recorder`, fed seeded random inputs (weights made with the real
//! quantizers) and random state, its outputs poisoned with NaN, run on every
//! backend present and compared with the CPU twin under the per-op
//! tolerance below. Sizes include 1, odd widths and widths that are not a
//! multiple of the 256-thread workgroup.
//!
//! With `CI` set, a missing wgpu adapter fails the suite instead of
//! skipping it.

use std::sync::Arc;

use ds4::backend::cpu::CpuBackend;
use ds4::backend::wgpu::{AdapterChoice, Gpu, RowRecord, WgpuBackend};
use ds4::backend::{Backend, BackendError};
use ds4::gguf::{GgufFile, GgufWriter};
use ds4::graph::{Recorder, StateId, StateLayout, StepParams, ValueId};
use ds4::model::{RopeConfig, TensorRef, Yarn};
use ds4::ops::{attention, basic, compress, hc, indexer, matmul, moe, norm, rope, round, Op};
use ds4::quant::{self, GgmlType};

/// Per-op tolerance of a GPU backend against the CPU twin: |got − want| ≤
/// abs + rel·|want|. Selections (indexer, router indices) must be equal.
/// Why each is not zero: f32 tree reductions instead of the CPU's f64 or
/// 8-lane sums (norm, attention, compressor, indexer scores), the GPU's own
/// exp/log/sin/cos (hc_mix, rope, router, attention), fused multiply-adds.
const TOLERANCE: &[(&str, f32, f32)] = &[
    ("embed", 0.0, 0.0),
    ("hc_init", 0.0, 0.0),
    ("add", 0.0, 0.0),
    ("scale", 0.0, 0.0),
    ("take_last", 0.0, 0.0),
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
];

fn tolerance(op: &str) -> (f32, f32) {
    TOLERANCE
        .iter()
        .find(|t| t.0 == op)
        .map(|t| (t.1, t.2))
        .unwrap_or_else(|| panic!("no tolerance for {op}"))
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Weights of one case, written with the real quantizers into a GGUF in
/// memory.
#[derive(Default)]
struct Weights {
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Weights {
    fn add(&mut self, name: &str, ne: &[u64], ty: GgmlType, values: &[f32]) {
        let row = ne[0] as usize;
        let rb = ty.row_bytes(ne[0]).unwrap() as usize;
        let mut bytes = vec![0u8; values.len() / row * rb];
        for (src, dst) in values.chunks_exact(row).zip(bytes.chunks_exact_mut(rb)) {
            quant::quantize_row(ty, src, dst, None).unwrap();
        }
        self.tensors.push((name.into(), ne.to_vec(), ty, bytes));
    }

    fn add_i32(&mut self, name: &str, ne: &[u64], values: &[i32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.into(), ne.to_vec(), GgmlType::I32, bytes));
    }

    fn build(self) -> (Arc<GgufFile>, Vec<TensorRef>) {
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
struct Case {
    label: String,
    op_name: &'static str,
    file: Arc<GgufFile>,
    layout: StateLayout,
    states: Vec<Vec<f32>>,
    graph: Arc<ds4::graph::Graph>,
    inputs: Vec<(ValueId, Vec<f32>)>,
    outputs: Vec<ValueId>,
    tokens: Vec<u32>,
    pos0: usize,
}

/// Builds a case: `make` records the op (given the weight refs) and returns
/// (op, inputs, outputs).
struct Builder {
    rec: Recorder,
    layout: StateLayout,
    states: Vec<Vec<f32>>,
    tokens: ValueId,
    n: usize,
}

impl Builder {
    fn new(max_tokens: usize, n: usize) -> Builder {
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

    fn state(&mut self, name: &str, rows: usize, cols: usize, init: Vec<f32>) -> StateId {
        assert_eq!(init.len(), rows * cols);
        self.states.push(init);
        self.layout.add(name, None, rows, cols, 0.0)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
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
type Results = (Vec<Vec<f32>>, Vec<Vec<f32>>);

fn run_case(case: &Case, b: &mut dyn Backend) -> Result<Results, BackendError> {
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
fn gpus() -> Vec<Arc<Gpu>> {
    use ds4::backend::wgpu::gpu::OPTIONAL_FEATURES;
    let choice = AdapterChoice::from_env(true);
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
fn worst(got: &[f32], want: &[f32], abs: f32, rel: f32) -> (f64, usize, f32, f32) {
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

fn check_on_gpu(gpu: &Arc<Gpu>, cases: &[Case]) {
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

/// Runs every case on the CPU twice (fresh backends): the harness itself
/// must be deterministic and fill every output.
fn check_cpu_self(cases: &[Case]) {
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
const FAST_CPU_TOLERANCE: &[(&str, f32)] =
    &[("matmul", 2e-2), ("moe_experts", 3e-2), ("attention", 1e-5)];

/// Runs every case on the fast CPU backend on each kernel path this machine
/// has (the portable one included) and compares with the reference.
fn check_fast_cpu(cases: &[Case]) {
    use ds4::backend::cpu_fast::{Isa, Kernels};
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

fn check(cases: Vec<Case>) {
    assert!(!cases.is_empty());
    check_cpu_self(&cases);
    check_fast_cpu(&cases);
    for g in gpus() {
        check_on_gpu(&g, &cases);
    }
    #[cfg(feature = "cuda")]
    cuda_half::check_on_cuda(&cases);
}

// ---------------------------------------------------------------- cases

fn elementwise_cases() -> Vec<Case> {
    let mut rng = Rng(0xE1E1);
    let mut out = Vec::new();
    for &(cols, n) in &[(1usize, 1usize), (7, 3), (300, 5)] {
        // add
        let mut b = Builder::new(6, n);
        let (x, y, o) = (
            b.rec.tokens_f32("a", cols),
            b.rec.tokens_f32("b", cols),
            b.rec.tokens_f32("out", cols),
        );
        let inputs = vec![(x, rng.vec(n * cols, 3.0)), (y, rng.vec(n * cols, 3.0))];
        let (f, _) = Weights::default().build();
        out.push(b.finish(
            format!("add {cols}×{n}"),
            f,
            Op::Add(basic::Add { a: x, b: y, out: o }),
            inputs,
            vec![],
            0,
        ));
        // scale
        let mut b = Builder::new(6, n);
        let (x, o) = (b.rec.tokens_f32("x", cols), b.rec.tokens_f32("out", cols));
        let inputs = vec![(x, rng.vec(n * cols, 3.0))];
        let (f, _) = Weights::default().build();
        let op = Op::Scale(basic::Scale {
            x,
            out: o,
            factor: 0.37,
        });
        out.push(b.finish(format!("scale {cols}×{n}"), f, op, inputs, vec![], 0));
        // swiglu, with and without the clamp
        for clamp in [0.0f32, 1.5] {
            let mut b = Builder::new(6, n);
            let (g, u, o) = (
                b.rec.tokens_f32("g", cols),
                b.rec.tokens_f32("u", cols),
                b.rec.tokens_f32("out", cols),
            );
            let inputs = vec![(g, rng.vec(n * cols, 4.0)), (u, rng.vec(n * cols, 4.0))];
            let (f, _) = Weights::default().build();
            let op = Op::SwiGlu(moe::SwiGlu {
                gate: g,
                up: u,
                out: o,
                clamp,
            });
            out.push(b.finish(
                format!("swiglu {cols}×{n} clamp {clamp}"),
                f,
                op,
                inputs,
                vec![],
                0,
            ));
        }
        // take_last
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.fixed_f32("out", 1, cols);
        let inputs = vec![(x, rng.vec(n * cols, 1.0))];
        let (f, _) = Weights::default().build();
        let op = Op::TakeLast(basic::TakeLast { x, out: o, cols });
        out.push(b.finish(format!("take_last {cols}×{n}"), f, op, inputs, vec![], 0));
        // hc_init
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.tokens_f32("out", 4 * cols);
        let inputs = vec![(x, rng.vec(n * cols, 1.0))];
        let (f, _) = Weights::default().build();
        let op = Op::HcInit(hc::HcInit {
            x,
            out: o,
            n_hc: 4,
            dim: cols,
        });
        out.push(b.finish(format!("hc_init {cols}×{n}"), f, op, inputs, vec![], 0));
    }
    out
}

#[test]
fn elementwise_ops_match_the_cpu() {
    check(elementwise_cases());
}

#[test]
fn embedding_matches_the_cpu_for_every_table_type() {
    let mut rng = Rng(0xE3B);
    let mut cases = Vec::new();
    for &(ty, dim, vocab, n) in &[
        (GgmlType::F32, 3usize, 11usize, 1usize),
        (GgmlType::F16, 64, 37, 5),
        (GgmlType::Bf16, 300, 9, 4),
        (GgmlType::F16, 258, 5, 3),
    ] {
        let mut w = Weights::default();
        w.add(
            "table",
            &[dim as u64, vocab as u64],
            ty,
            &rng.vec(dim * vocab, 2.0),
        );
        let (f, r) = w.build();
        let mut b = Builder::new(8, n);
        let o = b.rec.tokens_f32("out", dim);
        let toks: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        let op = Op::Embed(basic::Embed {
            table: r[0].clone(),
            tokens: b.tokens,
            out: o,
        });
        let tk = b.tokens;
        let inputs = vec![(tk, toks.iter().map(|&t| t as f32).collect())];
        cases.push(b.finish(
            format!("embed {ty} {dim}×{vocab} n {n}"),
            f,
            op,
            inputs,
            toks,
            0,
        ));
    }
    check(cases);
}

#[test]
fn rms_norm_matches_the_cpu() {
    let mut rng = Rng(0x40F);
    let mut cases = Vec::new();
    for &(dim, heads, n, weighted, fixed) in &[
        (1usize, 1usize, 1usize, true, false),
        (7, 3, 2, false, false),
        (300, 1, 5, true, false),
        (64, 2, 3, true, true),
        (1000, 1, 2, true, false),
    ] {
        let mut w = Weights::default();
        w.add("w", &[dim as u64], GgmlType::F32, &rng.vec(dim, 1.5));
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let (x, o) = if fixed {
            (
                b.rec.fixed_f32("x", 3, dim * heads),
                b.rec.fixed_f32("out", 3, dim * heads),
            )
        } else {
            (
                b.rec.tokens_f32("x", dim * heads),
                b.rec.tokens_f32("out", dim * heads),
            )
        };
        let len = b.rec.value(x).len();
        let inputs = vec![(x, rng.vec(len, 5.0))];
        let op = Op::RmsNorm(norm::RmsNorm {
            x,
            out: o,
            dim,
            weight: weighted.then(|| r[0].clone()),
            eps: 1e-6,
        });
        cases.push(b.finish(
            format!("rms_norm {dim}×{heads} n {n} w {weighted} fixed {fixed}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    check(cases);
}

#[test]
fn hyper_connection_ops_match_the_cpu() {
    let mut rng = Rng(0x4C);
    let mut cases = Vec::new();
    let nh = 4usize;
    for &(dim, n) in &[(5usize, 1usize), (300, 3)] {
        for head in [false, true] {
            let mix = if head { nh } else { (2 + nh) * nh };
            let mut w = Weights::default();
            w.add("scale", &[3], GgmlType::F32, &rng.vec(3, 1.0));
            w.add("base", &[mix as u64], GgmlType::F32, &rng.vec(mix, 1.0));
            let (f, r) = w.build();
            let mut b = Builder::new(4, n);
            let logits = b.rec.tokens_f32("mix", mix);
            let pre = b.rec.tokens_f32("pre", nh);
            let post = (!head).then(|| b.rec.tokens_f32("post", nh));
            let comb = (!head).then(|| b.rec.tokens_f32("comb", nh * nh));
            let inputs = vec![(logits, rng.vec(n * mix, 3.0))];
            let op = Op::HcMix(hc::HcMix {
                logits,
                scale: r[0].clone(),
                base: r[1].clone(),
                pre,
                post,
                comb,
                n_hc: nh,
                sinkhorn_iters: 20,
                eps: 1e-6,
            });
            cases.push(b.finish(
                format!("hc_mix head {head} n {n}"),
                f,
                op,
                inputs,
                vec![],
                0,
            ));
        }
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let state = b.rec.tokens_f32("state", nh * dim);
        let pre = b.rec.tokens_f32("pre", nh);
        let o = b.rec.tokens_f32("out", dim);
        let inputs = vec![
            (state, rng.vec(n * nh * dim, 2.0)),
            (pre, rng.vec(n * nh, 1.0)),
        ];
        let op = Op::HcCollapse(hc::HcCollapse {
            state,
            pre,
            out: o,
            n_hc: nh,
            dim,
        });
        cases.push(b.finish(format!("hc_collapse {dim} n {n}"), f, op, inputs, vec![], 0));
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let state = b.rec.tokens_f32("state", nh * dim);
        let y = b.rec.tokens_f32("y", dim);
        let post = b.rec.tokens_f32("post", nh);
        let comb = b.rec.tokens_f32("comb", nh * nh);
        let o = b.rec.tokens_f32("out", nh * dim);
        let inputs = vec![
            (state, rng.vec(n * nh * dim, 2.0)),
            (y, rng.vec(n * dim, 2.0)),
            (post, rng.vec(n * nh, 1.0)),
            (comb, rng.vec(n * nh * nh, 1.0)),
        ];
        let op = Op::HcExpand(hc::HcExpand {
            state,
            y,
            post,
            comb,
            out: o,
            n_hc: nh,
            dim,
        });
        cases.push(b.finish(format!("hc_expand {dim} n {n}"), f, op, inputs, vec![], 0));
    }
    check(cases);
}

fn rope_config(n_rot: usize, yarn: bool) -> RopeConfig {
    RopeConfig {
        base: 10000.0,
        yarn: yarn.then_some(Yarn {
            factor: 16.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
        n_rot,
    }
}

#[test]
fn rope_matches_the_cpu_at_small_and_large_positions() {
    let mut rng = Rng(0x20BE);
    let mut cases = Vec::new();
    for &(heads, hd, n_rot, n, pos0, yarn, inverse) in &[
        (1usize, 2usize, 2usize, 1usize, 0usize, false, false),
        (3, 16, 8, 5, 7, true, false),
        (2, 64, 64, 3, 100_000, true, true),
        (1, 72, 8, 2, 1_000_003, false, false),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", heads * hd);
        let o = b.rec.tokens_f32("out", heads * hd);
        let inputs = vec![(x, rng.vec(n * heads * hd, 2.0))];
        let op = Op::Rope(rope::Rope {
            x,
            out: o,
            heads,
            head_dim: hd,
            rope: rope_config(n_rot, yarn),
            inverse,
        });
        cases.push(b.finish(
            format!("rope {heads}×{hd} rot {n_rot} pos {pos0} yarn {yarn} inv {inverse}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

/// The row table: one GPU step whose rows carry unrelated positions (as rows
/// of several sessions would) against the CPU twin run once per row at that
/// row's position (the CPU twins take consecutive positions only). RoPE is
/// the op whose rows are independent; the KV ops need per-session state
/// selection first (docs/ARCHITECTURE.md, "Per-row parameters").
#[test]
fn rope_rows_carry_their_own_positions() {
    let mut rng = Rng(0x70E5);
    let positions = [1_000_003u32, 7, 100_000, 0, 65_537];
    let (heads, hd, n_rot) = (2usize, 24usize, 16usize);
    let n = positions.len();
    for (gpu, inverse) in gpus()
        .into_iter()
        .flat_map(|g| [(g.clone(), false), (g, true)])
    {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(n, n);
        let x = b.rec.tokens_f32("x", heads * hd);
        let o = b.rec.tokens_f32("out", heads * hd);
        let input = rng.vec(n * heads * hd, 2.0);
        let op = Op::Rope(rope::Rope {
            x,
            out: o,
            heads,
            head_dim: hd,
            rope: rope_config(n_rot, true),
            inverse,
        });
        let case = b.finish(format!("rope rows inv {inverse}"), f, op, vec![], vec![], 0);
        let mut wg = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone()).unwrap();
        let h = wg.load_graph(case.graph.clone()).unwrap();
        wg.write_value(h, x, &input).unwrap();
        wg.write_value(h, o, &vec![f32::NAN; n * heads * hd])
            .unwrap();
        let rows: Vec<RowRecord> = positions
            .iter()
            .map(|&pos| RowRecord { pos, state: 0 })
            .collect();
        wg.run_rows(h, &vec![0; n], &rows).unwrap();
        let got = wg.read_value(h, o).unwrap();
        let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
        let hc = cpu.load_graph(case.graph.clone()).unwrap();
        let (abs, rel) = tolerance("rope");
        let w = heads * hd;
        for (t, &pos) in positions.iter().enumerate() {
            cpu.write_value(hc, x, &input[t * w..(t + 1) * w]).unwrap();
            let step = StepParams {
                pos0: pos as usize,
                n_tokens: 1,
            };
            cpu.run(hc, &[0], step).unwrap();
            let want = cpu.read_value(hc, o).unwrap();
            for (j, (&g, &e)) in got[t * w..(t + 1) * w].iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= abs + rel * e.abs(),
                    "row {t} at position {pos}, value {j}: wgpu {g} cpu {e} (inverse {inverse})"
                );
            }
        }
    }
}

#[test]
fn rounding_ops_match_the_cpu() {
    let mut rng = Rng(0x80F8);
    let mut cases = Vec::new();
    for &(dim, n_rot, n, fp8, f16) in &[
        (72usize, 8usize, 1usize, true, true),
        (512, 64, 3, true, true),
        (100, 0, 2, false, true),
        (33, 40, 2, true, false),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let x = b.rec.tokens_f32("x", dim);
        let o = b.rec.tokens_f32("out", dim);
        let mut v = rng.vec(n * dim, 1.0);
        // Spread magnitudes over many binades (and f16 overflow).
        for (i, x) in v.iter_mut().enumerate() {
            *x *= 10f32.powi((i % 13) as i32 - 7);
        }
        v[0] = 70000.0;
        let inputs = vec![(x, v)];
        let op = Op::KvRound(round::KvRound {
            x,
            out: o,
            dim,
            n_rot,
            fp8,
            f16,
        });
        cases.push(b.finish(
            format!("kv_round {dim} rot {n_rot} fp8 {fp8} f16 {f16} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    for &(hd, heads, n) in &[(32usize, 2usize, 1usize), (128, 3, 2)] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let x = b.rec.tokens_f32("x", hd * heads);
        let o = b.rec.tokens_f32("out", hd * heads);
        let inputs = vec![(x, rng.vec(n * hd * heads, 3.0))];
        let op = Op::HadamardFp4(round::HadamardFp4 {
            x,
            out: o,
            cols: hd * heads,
            head_dim: hd,
        });
        cases.push(b.finish(
            format!("hadamard_fp4 {hd}×{heads} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    check(cases);
}

#[test]
fn attention_and_ring_writes_match_the_cpu() {
    let mut rng = Rng(0xA77);
    let mut cases = Vec::new();
    for &(nh, hd, n, pos0, ratio, sel, window, top_k) in &[
        (
            1usize, 16usize, 1usize, 0usize, 0usize, false, 8usize, 5usize,
        ),
        (2, 16, 5, 3, 0, false, 8, 5),
        (3, 64, 4, 21, 4, false, 8, 5),
        (2, 32, 3, 40, 4, true, 8, 5),
        (1, 300, 2, 9, 4, false, 8, 5),
        // Decode over 400 compressed rows: the fast twin splits the heads
        // of a lone token across threads.
        (5, 48, 1, 1600, 4, false, 8, 5),
        // Long contexts (issue 16), window 128: every one of 3,100+ rows
        // (13 blocks of 256 candidates), and Flash's 512 chosen among them.
        (4, 80, 3, 3100, 1, false, 128, 5),
        (2, 64, 3, 3300, 1, true, 128, 512),
    ] {
        let mut w = Weights::default();
        w.add("sinks", &[nh as u64], GgmlType::F32, &rng.vec(nh, 2.0));
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let ring = b.state("ring", window, hd, rng.vec(window * hd, 1.0));
        let cap = 32.max((pos0 + n) / ratio.max(1) + 1);
        let compressed = (ratio > 0).then(|| attention::CompressedRows {
            rows: b.state("comp", cap, hd, rng.vec(cap * hd, 1.0)),
            ratio,
        });
        let q = b.rec.tokens_f32("q", nh * hd);
        let kv = b.rec.tokens_f32("kv", hd);
        let o = b.rec.tokens_f32("out", nh * hd);
        let selected = sel.then(|| b.rec.tokens_i32("sel", top_k));
        let mut inputs = vec![(q, rng.vec(n * nh * hd, 1.0)), (kv, rng.vec(n * hd, 1.0))];
        if let Some(s) = selected {
            // Some unused (-1) and some not yet visible entries.
            let v = (0..n * top_k)
                .map(|i| {
                    if i % 4 == 3 {
                        -1.0
                    } else {
                        rng.below(cap) as f32
                    }
                })
                .collect();
            inputs.push((s, v));
        }
        let op = Op::Attention(attention::Attention {
            q,
            kv,
            ring,
            window,
            compressed,
            selected,
            top_k,
            sinks: r[0].clone(),
            n_head: nh,
            head_dim: hd,
            out: o,
        });
        cases.push(b.finish(
            format!("attention {nh}×{hd} n {n} pos {pos0} ratio {ratio} sel {sel}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    let window = 8usize;
    for &(dim, n, pos0) in &[(16usize, 1usize, 0usize), (7, 5, 6), (300, 11, 13)] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(12, n);
        let ring = b.state("ring", window, dim, rng.vec(window * dim, 1.0));
        let kv = b.rec.tokens_f32("kv", dim);
        let inputs = vec![(kv, rng.vec(n * dim, 1.0))];
        let op = Op::RingWrite(attention::RingWrite {
            kv,
            ring,
            window,
            dim,
        });
        cases.push(b.finish(
            format!("ring_write {dim} n {n} pos {pos0}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn compressor_matches_the_cpu() {
    let mut rng = Rng(0xC0C0);
    let mut cases = Vec::new();
    for &(ratio, hd, overlapped, rounding, n, pos0) in &[
        (
            4usize,
            32usize,
            false,
            compress::RowRounding::None,
            1usize,
            3usize,
        ),
        (4, 32, true, compress::RowRounding::Fp8F16, 7, 2),
        (16, 64, false, compress::RowRounding::Fp8F16, 20, 5),
        (4, 128, true, compress::RowRounding::HadamardFp4F16, 9, 0),
        // Long steps (issue 16): one step of 3,100 tokens emits 775 rows
        // of ratio 4 (past llvmpipe's loop cap in one invocation) and 24 of
        // ratio 128; the rows start as random values, so a row the GPU
        // never writes fails. Unrounded rows: among tens of thousands of
        // FP8 roundings a last-bit difference before one moves it a step.
        (4, 80, true, compress::RowRounding::None, 3100, 0),
        (128, 80, false, compress::RowRounding::None, 3100, 0),
        (4, 32, true, compress::RowRounding::None, 3100, 0),
    ] {
        let width = if overlapped { 2 * hd } else { hd };
        let slots = if overlapped { 2 * ratio } else { ratio };
        let mut w = Weights::default();
        w.add(
            "ape",
            &[width as u64, ratio as u64],
            GgmlType::F32,
            &rng.vec(ratio * width, 1.0),
        );
        w.add("norm", &[hd as u64], GgmlType::F32, &rng.vec(hd, 1.5));
        let (f, r) = w.build();
        let mut b = Builder::new(n.max(24), n);
        let cap = ((pos0 + n) / ratio + 1).max(16);
        let mut score = rng.vec(slots * width, 2.0);
        // Empty slots are part of every real state.
        for s in score.iter_mut().step_by(3) {
            *s = compress::EMPTY_SCORE;
        }
        let state_kv = b.state("ckv", slots, width, rng.vec(slots * width, 1.0));
        let state_score = b.state("cscore", slots, width, score);
        let rows = b.state("crows", cap, hd, rng.vec(cap * hd, 1.0));
        let kv = b.rec.tokens_f32("kv", width);
        let gate = b.rec.tokens_f32("gate", width);
        let inputs = vec![
            (kv, rng.vec(n * width, 1.0)),
            (gate, rng.vec(n * width, 2.0)),
        ];
        let op = Op::Compress(compress::Compress {
            kv,
            gate,
            ape: r[0].clone(),
            norm: r[1].clone(),
            state_kv,
            state_score,
            rows,
            ratio,
            head_dim: hd,
            overlapped,
            rope: rope_config(16.min(hd), true),
            rounding,
            eps: 1e-6,
        });
        cases.push(b.finish(
            format!("compress r{ratio} {hd} ov {overlapped} {rounding:?} n {n} pos {pos0}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn indexer_matches_the_cpu() {
    let mut rng = Rng(0x1DE);
    let mut cases = Vec::new();
    // `grid`: q, rows and weights on a coarse grid (q, k in {-1, 0, 1},
    // weights in ±{1/4, 1/2, 1}), so every score is exact in f32 whatever
    // the summation order: exact ties, among them at the k-th score, and
    // near-ties one grid step (1/4) apart, which every backend must break
    // the same way (ties to the lower row).
    for &(ratio, top_k, nh, hd, n, pos0, grid) in &[
        (4usize, 5usize, 2usize, 16usize, 1usize, 3usize, false),
        (4, 5, 2, 16, 6, 30, false),
        (4, 16, 3, 32, 3, 1500, false),
        (16, 1, 1, 8, 2, 600, false),
        // 17 heads: one past the fast CPU twin's 16-head vector chunk.
        (4, 8, 17, 24, 3, 203, false),
        // One token over 750 rows: the fast twin splits a decode token's
        // rows across threads (256 per task, a partial last one).
        (4, 16, 3, 32, 1, 3000, false),
        // Long contexts (issue 16): 3,100+ rows, the long-context test
        // model's 64 of them with 4 heads and Flash's 512 with 8.
        (1, 64, 4, 32, 3, 3100, false),
        (1, 512, 8, 64, 2, 3300, false),
        (1, 64, 4, 32, 4, 3100, true),
        (1, 512, 3, 16, 2, 3300, true),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(8, n);
        let cap = (pos0 + n) / ratio + 1;
        let mut grid_vec = |len: usize, w: bool| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let v = rng.below(3) as f32 - 1.0;
                    if w {
                        let sign = if rng.below(4) == 0 { -1.0 } else { 1.0 };
                        sign * [0.25f32, 0.5, 1.0][rng.below(3)]
                    } else {
                        v
                    }
                })
                .collect()
        };
        let (rows_init, q_in, w_in) = if grid {
            let mut rows = grid_vec(cap * hd, false);
            // Whole duplicated rows too: equal scores in any kernel.
            for r in (5..cap).step_by(7) {
                let src = (r - 5) * hd;
                rows.copy_within(src..src + hd, r * hd);
            }
            let (q, w) = (grid_vec(n * nh * hd, false), grid_vec(n * nh, true));
            // The case must straddle a tie: at the last token the k-th and
            // (k+1)-th best scores are equal (exact here in any order).
            let t = n - 1;
            let visible = (pos0 + t + 1) / ratio;
            let mut sc: Vec<f32> = (0..visible)
                .map(|r| {
                    (0..nh)
                        .map(|h| {
                            let d: f32 = (0..hd)
                                .map(|j| q[(t * nh + h) * hd + j] * rows[r * hd + j])
                                .sum();
                            w[t * nh + h] * d.max(0.0)
                        })
                        .sum()
                })
                .collect();
            sc.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(
                sc[top_k - 1],
                sc[top_k],
                "grid case without a tie at the k-th score"
            );
            (rows, q, w)
        } else {
            (
                rng.vec(cap * hd, 1.0),
                rng.vec(n * nh * hd, 1.0),
                rng.vec(n * nh, 1.0),
            )
        };
        let rows = b.state("irows", cap, hd, rows_init);
        let q = b.rec.tokens_f32("q", nh * hd);
        let wts = b.rec.tokens_f32("w", nh);
        let o = b.rec.tokens_i32("out", top_k);
        let inputs = vec![(q, q_in), (wts, w_in)];
        let op = Op::IndexerTopK(indexer::IndexerTopK {
            q,
            weights: wts,
            rows,
            ratio,
            top_k,
            n_head: nh,
            head_dim: hd,
            out: o,
        });
        let kind = if grid { " grid (ties)" } else { "" };
        cases.push(b.finish(
            format!("indexer r{ratio} k{top_k} {nh}×{hd} n {n} pos {pos0}{kind}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn router_matches_the_cpu() {
    let mut rng = Rng(0x2007);
    let mut cases = Vec::new();
    for &(e, k, n, bias, hash, normalize) in &[
        (8usize, 2usize, 1usize, false, false, true),
        (33, 6, 5, true, false, true),
        (256, 6, 3, true, false, false),
        (16, 4, 4, false, true, true),
    ] {
        let vocab = 11;
        let mut w = Weights::default();
        w.add("bias", &[e as u64], GgmlType::F32, &rng.vec(e, 0.5));
        let table: Vec<i32> = (0..vocab * k)
            .map(|i| ((i * 7 + i / k) % e) as i32)
            .collect();
        w.add_i32("tid2eid", &[k as u64, vocab as u64], &table);
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let logits = b.rec.tokens_f32("logits", e);
        let sel = b.rec.tokens_i32("sel", k);
        let wts = b.rec.tokens_f32("w", k);
        let toks: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        let tk = b.tokens;
        let inputs = vec![
            (logits, rng.vec(n * e, 30.0)),
            (tk, toks.iter().map(|&t| t as f32).collect()),
        ];
        let op = Op::Router(moe::Router {
            logits,
            tokens: tk,
            bias: bias.then(|| r[0].clone()),
            tid2eid: hash.then(|| r[1].clone()),
            selected: sel,
            weights: wts,
            n_expert: e,
            k,
            scale: 1.5,
            normalize,
        });
        cases.push(b.finish(
            format!("router e{e} k{k} n {n} bias {bias} hash {hash}"),
            f,
            op,
            inputs,
            toks,
            0,
        ));
    }
    check(cases);
}

/// One `MatMul` case: an `n_out × n_in` weight of type `ty` made by the
/// real quantizer, `groups` grouped projections, `n` tokens (graph capacity
/// `cap`), seeded inputs.
#[allow(clippy::too_many_arguments)]
fn matmul_case(
    rng: &mut Rng,
    label: &str,
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
    groups: usize,
    n: usize,
    cap: usize,
) -> Case {
    let mut w = Weights::default();
    w.add(
        "w",
        &[n_in as u64, n_out as u64],
        ty,
        &rng.vec(n_in * n_out, 1.0),
    );
    let (f, r) = w.build();
    let mut b = Builder::new(cap, n);
    let x = b.rec.tokens_f32("x", groups * n_in);
    let o = b.rec.tokens_f32("out", n_out);
    let inputs = vec![(x, rng.vec(n * groups * n_in, 1.0))];
    let op = Op::MatMul(matmul::MatMul {
        w: r[0].clone(),
        x,
        out: o,
        groups,
    });
    b.finish(
        format!("{label} {ty} {n_in}→{n_out} g{groups} n {n}"),
        f,
        op,
        inputs,
        vec![],
        0,
    )
}

/// The matrix products (MatMul, MoeExperts) for every weight type.
fn matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x3A7);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 7usize),
        (GgmlType::F16, 33),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(1usize, 1usize, 1usize), (17, 1, 5), (6, 3, 2)] {
            cases.push(matmul_case(
                &mut rng, "matmul", ty, n_in, n_out, groups, n, 6,
            ));
        }
    }
    // Gate and up of one type take the fused gate+up kernel on CUDA; the
    // mixed cases (F16 gate, BF16 up; Q8_0 gate, Q4_K up) the unfused path.
    for &(ty_g, ty_u, ty_d, d, ff, e, k, n) in &[
        (
            GgmlType::F32,
            GgmlType::F32,
            GgmlType::F32,
            16usize,
            8usize,
            4usize,
            2usize,
            1usize,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            64,
            32,
            5,
            2,
            4,
        ),
        (
            GgmlType::Iq2Xxs,
            GgmlType::Iq2Xxs,
            GgmlType::Q2K,
            256,
            256,
            4,
            3,
            3,
        ),
        (
            GgmlType::Q4K,
            GgmlType::Q4K,
            GgmlType::Q4K,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            96,
            64,
            4,
            2,
            3,
        ),
        (
            GgmlType::Q2K,
            GgmlType::Q2K,
            GgmlType::Iq2Xxs,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::F16,
            GgmlType::Bf16,
            GgmlType::F16,
            40,
            24,
            3,
            2,
            3,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q8_0,
            256,
            64,
            3,
            2,
            2,
        ),
    ] {
        let mut w = Weights::default();
        w.add(
            "gate",
            &[d as u64, ff as u64, e as u64],
            ty_g,
            &rng.vec(d * ff * e, 1.0),
        );
        w.add(
            "up",
            &[d as u64, ff as u64, e as u64],
            ty_u,
            &rng.vec(d * ff * e, 1.0),
        );
        w.add(
            "down",
            &[ff as u64, d as u64, e as u64],
            ty_d,
            &rng.vec(d * ff * e, 1.0),
        );
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", d);
        let sel = b.rec.tokens_i32("sel", k);
        let wts = b.rec.tokens_f32("w", k);
        let o = b.rec.tokens_f32("out", d);
        let picks: Vec<f32> = (0..n)
            .flat_map(|t| (0..k).map(move |i| ((t + 2 * i) % e) as f32))
            .collect();
        let inputs = vec![
            (x, rng.vec(n * d, 1.0)),
            (sel, picks),
            (wts, rng.vec(n * k, 1.0)),
        ];
        let op = Op::MoeExperts(moe::MoeExperts {
            x,
            selected: sel,
            weights: wts,
            gate: r[0].clone(),
            up: r[1].clone(),
            down: r[2].clone(),
            clamp: 7.0,
            k,
            out: o,
        });
        cases.push(b.finish(
            format!("moe_experts {ty_g}+{ty_u}/{ty_d} d{d} ff{ff} e{e} k{k} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    cases
}

#[test]
fn matrix_products_match_the_cpu_for_every_weight_type() {
    let cases = matmul_cases();
    check_cpu_self(&cases);
    check_fast_cpu(&cases);
    for g in gpus() {
        check_on_gpu(&g, &cases);
    }
    #[cfg(feature = "cuda")]
    cuda_half::check_on_cuda(&cases);
}

/// Prefill-sized matmuls (≥ 32 tokens, the tensor-core threshold, and one
/// step below it) for every weight type, 64-row tiles that end mid-tile
/// and a grouped product.
#[cfg(feature = "cuda")]
fn prefill_matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x7C0);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 64usize),
        (GgmlType::F16, 96),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 128),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(70usize, 1usize, 33usize), (128, 2, 40), (20, 1, 5)] {
            cases.push(matmul_case(&mut rng, "mma", ty, n_in, n_out, groups, n, 40));
        }
    }
    cases
}

/// The tensor-core prefill kernels (`mma_<type>`, off by default) against
/// the CPU, on the device or on the emulator's software `mma.sync`. The
/// operands are rounded to f16: each product carries at most 2^-10 relative
/// error and the outputs sum ≤ 512 products of magnitude ≤ 1, so 0.05
/// absolute (+ 2e-3 relative) covers the rounding ~10× while a fragment
/// layout error moves outputs by O(1).
#[cfg(feature = "cuda")]
#[test]
fn tensor_core_prefill_matches_the_cpu() {
    cuda_half::check_tensor_cores(&prefill_matmul_cases(), (5e-2, 2e-3));
}

#[cfg(feature = "cuda")]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

/// The same cases on the CUDA backend (feature `cuda`): on the GPU when
/// there is one, else on the host emulator of tests/cuda_emu (CI).
#[cfg(feature = "cuda")]
mod cuda_half {
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
        match super::cuda_emu::install() {
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
            let mut cb = CudaBackend::open(case.file.clone(), case.layout.clone())
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
