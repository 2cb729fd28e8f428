//! The cross-backend one-op harness: each op recorded alone in a graph of
//! its own, weights written with the real quantizers into a GGUF in
//! memory, seeded inputs and state, outputs poisoned before the run, and
//! the per-op tolerance of a backend against the CPU twin (`cpu-ref`).
//! The cases themselves are in [`super::cases`]; `ds4-bench --check` and
//! the tests (tests/ops_backends.rs through tests/common/oneop.rs) run the
//! same ones with the same tolerances.

use std::sync::Arc;

use super::rng::Rng;
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError, GraphHandle};
use crate::gguf::{GgufFile, GgufWriter, TensorRef};
use crate::graph::ops::Op;
use crate::graph::{DType, Graph, Recorder, StateId, StateLayout, StepParams, ValueDesc, ValueId};
use crate::quant::{self, GgmlType};

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
    // value to the neighbouring grid point (rare).
    ("kv_round", 1e-6, 1e-5),
    ("hadamard_fp4", 1e-6, 1e-5),
    ("block_round", 1e-6, 1e-5),
    ("attention", 1e-5, 1e-4),
    ("compress", 1e-5, 1e-4),
    ("indexer_topk", 0.0, 0.0),
    ("router", 1e-6, 1e-5),
    // Products sum hundreds of terms of order one: an element near zero by
    // cancellation carries the absolute error of the whole sum (outputs are
    // of order 10 here, so 2e-4 is ~1e-5 of their scale).
    ("matmul", 1e-4, 1e-4),
    ("moe_experts", 2e-4, 1e-4),
    // DeepSeek V4.1 (cases/v41.rs): the gate's three f32 tree sums of `dim`
    // terms and the GPU's sigmoid scale the shared value; the compressor's
    // norms, dot products and RoPE as the V4 compressor.
    ("hc_one_hot", 0.0, 0.0),
    ("engram_gate", 1e-5, 1e-5),
    ("source_compress", 1e-5, 1e-4),
    ("candidate_blocks", 0.0, 0.0),
    ("candidate_topk", 0.0, 0.0),
];

/// The tolerance of `op` ([`TOLERANCE`]); `None` for an op without one.
pub fn tolerance(op: &str) -> Option<(f32, f32)> {
    TOLERANCE.iter().find(|t| t.0 == op).map(|t| (t.1, t.2))
}

/// The tensor-core prefill matmuls (`mma_<type>`, CUDA, opt-in) against the
/// CPU on [`super::cases::prefill_matmul_cases`]: the operands are rounded
/// to f16, so each product carries at most 2^-10 relative error and the
/// outputs sum ≤ 512 products of magnitude ≤ 1; 0.05 absolute (+ 2e-3
/// relative) covers the rounding ~10× while a fragment layout error moves
/// outputs by O(1).
pub const TENSOR_CORE_TOLERANCE: (f32, f32) = (5e-2, 2e-3);

/// Tolerance of the fast CPU backend (`cpu`) against the reference
/// (`cpu-ref`), as max |Δ| / (max |want| + ‖x‖₂) over an output (‖x‖₂ of
/// the activation input stands in for Σ|w·x| when outputs cancel): the
/// matrix products quantise their activations to int8 (the tight
/// per-format bounds, in units of Σ|w·x|, are in tests/cpu_fast.rs);
/// attention sums with FMA in another order; every other op is the same
/// twin and must be bit-identical.
pub const FAST_CPU_TOLERANCE: &[(&str, f32)] =
    &[("matmul", 2e-2), ("moe_experts", 3e-2), ("attention", 1e-5)];

/// Weights of one case, written with the real quantizers into a GGUF in
/// memory.
#[derive(Default)]
pub struct Weights {
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Weights {
    pub fn add(&mut self, name: &str, ne: &[u64], ty: GgmlType, values: &[f32]) {
        let row = ne[0] as usize;
        let rb = ty
            .row_bytes(ne[0])
            .expect("a case's row length fits its type") as usize;
        let mut bytes = vec![0u8; values.len() / row * rb];
        for (src, dst) in values.chunks_exact(row).zip(bytes.chunks_exact_mut(rb)) {
            quant::quantize_row(ty, src, dst, None).expect("a case's row quantizes");
        }
        self.tensors.push((name.into(), ne.to_vec(), ty, bytes));
    }

    /// Adds tensor `name` of shape `ne` (GGML order) with values uniform
    /// in ±`scale`, drawn from `rng`.
    pub fn random(&mut self, rng: &mut Rng, name: &str, ne: &[usize], ty: GgmlType, scale: f32) {
        let n = ne.iter().product();
        let ne: Vec<u64> = ne.iter().map(|&d| d as u64).collect();
        self.add(name, &ne, ty, &rng.scaled(n, scale));
    }

    pub fn add_i32(&mut self, name: &str, ne: &[u64], values: &[i32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.into(), ne.to_vec(), GgmlType::I32, bytes));
    }

    /// A compressor's weights, random from `rng`: `ape` (`ratio` rows of
    /// `width`), then `norm` (`head_dim`).
    pub fn compressor(rng: &mut Rng, ratio: usize, width: usize, head_dim: usize) -> Weights {
        let mut w = Weights::default();
        w.random(rng, "ape", &[width, ratio], GgmlType::F32, 1.0);
        w.random(rng, "norm", &[head_dim], GgmlType::F32, 1.5);
        w
    }

    /// The GGUF in memory and a reference to each tensor, in order.
    pub fn build(self) -> (Arc<GgufFile>, Vec<TensorRef>) {
        let mut w = GgufWriter::new();
        for (n, ne, ty, b) in &self.tensors {
            w.add_tensor(n, ne, *ty, b.clone())
                .expect("a case's tensor is well formed");
        }
        let f = GgufFile::from_vec(w.to_bytes().expect("a case's GGUF serializes"))
            .expect("a case's GGUF parses");
        let refs = self
            .tensors
            .iter()
            .map(|(n, ne, ty, _)| {
                let info = f.tensor_info(n).expect("the tensor just written");
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
    pub graph: Arc<Graph>,
    pub inputs: Vec<(ValueId, Vec<f32>)>,
    pub outputs: Vec<ValueId>,
    pub tokens: Vec<u32>,
    pub pos0: usize,
}

/// Builds a case: the op's values and states are declared on `rec` and
/// `state`, then [`Builder::finish`] records the op.
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
        assert_eq!(init.len(), rows * cols, "state {name}: rows × cols values");
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

/// Runs `case` on `b`: states and inputs written, outputs poisoned (NaN,
/// or −12345 for indices), one step, outputs and states read back.
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
            DType::F32 => f32::NAN,
            DType::I32 => -12345.0,
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
    let outs: Vec<Vec<f32>> = case
        .outputs
        .iter()
        .map(|&v| b.read_value(h, v))
        .collect::<Result<_, _>>()?;
    for (&v, whole) in case.outputs.iter().zip(&outs) {
        check_row_reads(b, h, case.graph.value(v), v, whole)?;
    }
    let states = (0..case.states.len())
        .map(|i| b.read_state(StateId(i as u32)))
        .collect::<Result<_, _>>()?;
    Ok((outs, states))
}

/// Rows read alone ([`Backend::read_value_rows`], what the MTP drafter
/// reads) are the whole read's rows bit for bit: a tail, a middle, a range
/// past the live rows (clamped) and an empty one.
fn check_row_reads(
    b: &dyn Backend,
    h: GraphHandle,
    d: &ValueDesc,
    v: ValueId,
    whole: &[f32],
) -> Result<(), BackendError> {
    let live = whole.len() / d.cols.max(1);
    for rows in [
        1.min(live)..live,
        live / 3..live / 2,
        live / 2..live + 3,
        live..live,
    ] {
        let got = b.read_value_rows(h, v, rows.clone())?;
        let end = rows.end.min(live);
        let want = &whole[rows.start.min(end) * d.cols..end * d.cols];
        if !got
            .iter()
            .map(|x| x.to_bits())
            .eq(want.iter().map(|x| x.to_bits()))
        {
            return Err(BackendError::Value {
                value: d.name.to_string(),
                msg: format!("rows {rows:?} read alone differ from the whole read"),
            });
        }
    }
    Ok(())
}

/// Largest |got − want| / (abs + rel·|want|) over every element (> 1
/// fails), with the element, got and want there; a length mismatch or a
/// NaN on one side only is infinitely far.
pub fn worst(got: &[f32], want: &[f32], abs: f32, rel: f32) -> (f64, usize, f32, f32) {
    if got.len() != want.len() {
        return (f64::INFINITY, got.len().min(want.len()), f32::NAN, f32::NAN);
    }
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

/// max |got − want| over the elements that are not NaN on both sides
/// (infinite where only one side is NaN).
pub fn max_abs(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| {
            if a.is_nan() != b.is_nan() {
                f32::INFINITY
            } else if a.is_nan() {
                0.0
            } else {
                (a - b).abs()
            }
        })
        .fold(0f32, f32::max)
}

/// How a backend's results are judged against the reference's.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// A GPU backend: the op's [`TOLERANCE`], or the given (abs, rel).
    Gpu(Option<(f32, f32)>),
    /// The fast CPU backend: [`FAST_CPU_TOLERANCE`] relative to the
    /// output's scale, bit-identical for every other op.
    FastCpu,
}

/// One output or final state of a case against the reference.
#[derive(Clone, Debug)]
pub struct OutputDiff {
    /// `output` or `state`.
    pub what: &'static str,
    /// Its index among the outputs, then the states.
    pub index: usize,
    /// The error in units of the tolerance (> 1 fails).
    pub ratio: f64,
    /// max |got − want|.
    pub max_abs: f32,
    /// The element of the largest ratio, with got and want there.
    pub at: usize,
    pub got: f32,
    pub want: f32,
}

impl OutputDiff {
    pub fn failed(&self) -> bool {
        self.ratio > 1.0
    }
}

/// Every output and state of `got` against `want` under `rule`.
pub fn diffs(case: &Case, got: &Results, want: &Results, rule: Rule) -> Vec<OutputDiff> {
    let pairs = got.0.iter().zip(&want.0).map(|(g, w)| ("output", g, w));
    let spairs = got.1.iter().zip(&want.1).map(|(g, w)| ("state", g, w));
    let mut out: Vec<OutputDiff> = pairs
        .chain(spairs)
        .enumerate()
        .map(|(index, (what, g, w))| {
            let m = if g.len() == w.len() {
                max_abs(g, w)
            } else {
                f32::INFINITY
            };
            let (ratio, at, gv, wv) = match rule {
                Rule::Gpu(tol) => {
                    let (abs, rel) = tol
                        .or_else(|| tolerance(case.op_name))
                        .unwrap_or((0.0, 0.0));
                    worst(g, w, abs, rel)
                }
                Rule::FastCpu => fast_cpu_ratio(case, g, w, m),
            };
            OutputDiff {
                what,
                index,
                ratio,
                max_abs: m,
                at,
                got: gv,
                want: wv,
            }
        })
        .collect();
    // An output or state missing on one side.
    let (n_got, n_want) = (got.0.len() + got.1.len(), want.0.len() + want.1.len());
    if n_got != n_want || got.0.len() != want.0.len() {
        out.push(OutputDiff {
            what: "count",
            index: n_got.min(n_want),
            ratio: f64::INFINITY,
            max_abs: f32::INFINITY,
            at: 0,
            got: n_got as f32,
            want: n_want as f32,
        });
    }
    out
}

/// The fast CPU rule for one output: bit-identical where the op has no
/// entry in [`FAST_CPU_TOLERANCE`], else max |Δ| over tol · (max |want| +
/// ‖x‖₂).
fn fast_cpu_ratio(case: &Case, g: &[f32], w: &[f32], max_abs: f32) -> (f64, usize, f32, f32) {
    let tol = FAST_CPU_TOLERANCE
        .iter()
        .find(|t| t.0 == case.op_name)
        .map_or(0.0, |t| t.1);
    let first_diff = g
        .iter()
        .zip(w)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    let at = first_diff.unwrap_or(0);
    let (gv, wv) = (
        g.get(at).copied().unwrap_or(f32::NAN),
        w.get(at).copied().unwrap_or(f32::NAN),
    );
    if g.len() != w.len() {
        return (f64::INFINITY, at, gv, wv);
    }
    if tol == 0.0 {
        let r = if first_diff.is_some() {
            f64::INFINITY
        } else {
            0.0
        };
        return (r, at, gv, wv);
    }
    let x_norm = case
        .inputs
        .first()
        .map_or(0.0, |(_, v)| v.iter().map(|a| a * a).sum::<f32>().sqrt());
    let scale = w
        .iter()
        .filter(|v| !v.is_nan())
        .fold(0f32, |m, v| m.max(v.abs()))
        + x_norm;
    (max_abs as f64 / (tol * scale.max(1e-30)) as f64, at, gv, wv)
}

/// What one case gave on one backend.
pub struct CaseReport {
    pub label: String,
    pub diffs: Vec<OutputDiff>,
    /// The backend (or the reference) could not run it.
    pub error: Option<String>,
}

impl CaseReport {
    /// One line per failure: the output, the element, got and want, and
    /// how far past the tolerance (`who` names the backend).
    pub fn failures(&self, who: &str) -> Vec<String> {
        if let Some(e) = &self.error {
            return vec![format!("{} [{who}]: {e}", self.label)];
        }
        self.diffs
            .iter()
            .filter(|d| d.failed())
            .map(|d| {
                format!(
                    "{} [{who}]: {} #{} element {}: {who} {} vs cpu {} ({:.2}× the tolerance)",
                    self.label, d.what, d.index, d.at, d.got, d.want, d.ratio
                )
            })
            .collect()
    }

    /// The largest ratio and max |Δ| over the case's outputs.
    pub fn worst(&self) -> (f64, f32) {
        if self.error.is_some() {
            return (f64::INFINITY, f32::INFINITY);
        }
        // A loop, not a fold over an (f64, f32) pair: rustc 1.95's LLVM
        // (22.1) crashes in instruction selection on that fold at
        // opt-level 3.
        let (mut ratio, mut max_abs) = (0f64, 0f32);
        for d in &self.diffs {
            ratio = ratio.max(d.ratio);
            max_abs = max_abs.max(d.max_abs);
        }
        (ratio, max_abs)
    }
}

/// Opens the backend under test for one case.
pub type OpenFn<'a> = dyn FnMut(&Case) -> Result<Box<dyn Backend>, BackendError> + 'a;

/// Runs every case on the reference and on the backend `open` makes, and
/// judges each under `rule`.
pub fn run_cases(cases: &[Case], rule: Rule, open: &mut OpenFn<'_>) -> Vec<CaseReport> {
    cases
        .iter()
        .map(|case| {
            let report = |diffs, error| CaseReport {
                label: case.label.clone(),
                diffs,
                error,
            };
            let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
            let want = match run_case(case, &mut cpu) {
                Ok(w) => w,
                Err(e) => return report(Vec::new(), Some(format!("cpu-ref: {e}"))),
            };
            let got = open(case).and_then(|mut b| run_case(case, b.as_mut()));
            match got {
                Ok(got) => report(diffs(case, &got, &want, rule), None),
                Err(e) => report(Vec::new(), Some(e.to_string())),
            }
        })
        .collect()
}

/// The indexer's f64 score of key row `r` for token `t`:
/// Σ_h w[t,h]·relu(q[t,h]·k[r]), with `nh` heads of `hd` (the oracle of
/// V4's indexer top-k and V4.1's candidate selection; exact in f32 for
/// grid values).
pub fn indexer_score(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    t: usize,
    r: usize,
    nh: usize,
    hd: usize,
) -> f64 {
    (0..nh)
        .map(|h| {
            let d: f64 = (0..hd)
                .map(|j| q[(t * nh + h) * hd + j] as f64 * keys[r * hd + j] as f64)
                .sum();
            w[t * nh + h] as f64 * d.max(0.0)
        })
        .sum()
}
