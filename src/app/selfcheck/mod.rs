//! The self-check (`ds4-bench --check cuda|wgpu|cpu`): what the test suite
//! checks on a backend, runnable from the shipped binary on a machine with
//! no cargo (a lent GPU, a user's new card). Per backend it runs
//!
//! * every op against its CPU twin on the one-op cases of the suite
//!   ([`cases`], [`oneop`]), on each kernel variant the backend has (wgpu:
//!   subgroup and workgroup-memory reductions; CUDA: the plain kernels and
//!   the tensor-core prefill matmuls);
//! * end-to-end logits against `cpu-ref` at every position ([`e2e`]) on
//!   the tiny V4 models (f32, q8, q2, q4, mxfp4), the tiny V4.1 model and
//!   the long-context model (the indexer selecting), through the scoring,
//!   prefill and decode graphs (CUDA also with graph capture off and with
//!   tensor-core prefill);
//! * batched steps bit-identical to serial ones ([`batch`]);
//! * SSD streaming with a cache of a few slots bit-identical to resident
//!   experts ([`streaming`]).
//!
//! One [`Line`] per check (PASS, FAIL or SKIP, with its max |Δ| and bound),
//! the tolerances the tests use. A backend that does not open is a FAIL
//! line with the reason, not a panic. The models are generated into a work
//! folder ([`models`]). [`Size::Quick`] is the dry run's (CI, CPU
//! emulators): the same checks on shorter sequences and fewer variants.

pub mod batch;
pub mod cases;
pub mod e2e;
pub mod models;
pub mod oneop;
pub mod rng;
pub mod streaming;

use std::path::PathBuf;
use std::time::Instant;

use crate::backend::{BackendKind, BackendOptions};
use crate::model::any_model::AnyModel;
use crate::model::forward::Numerics;
use crate::testmodel::Variant;
use e2e::{Bound, Piece};
use oneop::Rule;

/// How long the sequences are and how many variants run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The dry run's: seconds to minutes on CPU emulators (lavapipe, the
    /// CUDA host emulator); every check, fewer positions.
    Quick,
    /// What the tests check at their largest (a GPU: a minute or two).
    Full,
}

impl Size {
    pub fn parse(s: &str) -> Result<Size, String> {
        match s {
            "quick" => Ok(Size::Quick),
            "full" => Ok(Size::Full),
            o => Err(format!("check size {o:?}: quick or full")),
        }
    }
}

/// The groups of checks, by name (`--check-only`).
pub const CHECKS: &[&str] = &["ops", "e2e", "batch", "ssd"];

/// What to check.
pub struct CheckOptions {
    /// `Cpu`, `Wgpu` or `Cuda`.
    pub backend: BackendKind,
    pub size: Size,
    /// Where the models are generated.
    pub dir: PathBuf,
    /// Only these groups of [`CHECKS`] (`None`: all).
    pub only: Option<Vec<String>>,
    /// The options every target starts from (`BackendOptions::from_env`).
    pub base: BackendOptions,
}

/// One backend configuration under test.
#[derive(Clone, Debug)]
pub struct Target {
    /// `wgpu subgroups`, `cuda graph off`, `cpu avx2`, ...
    pub label: String,
    pub kind: BackendKind,
    pub opts: BackendOptions,
    /// It runs the one-op cases (a kernel variant), not only the models.
    pub kernels: bool,
    /// The tensor-core prefill (CUDA): its own one-op cases and tolerance.
    pub tensor_cores: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Line {
    pub status: Status,
    /// `ops matmul+moe`, `e2e tiny-q2 model`, `batch 8 sessions`, ...
    pub check: String,
    pub target: String,
    /// The figure and its bound, or why it failed or was skipped.
    pub figure: String,
    /// Seconds it took.
    pub secs: f64,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        write!(
            f,
            "{s}  {:<28} [{}]  {}  ({:.1} s)",
            self.check, self.target, self.figure, self.secs
        )
    }
}

/// Collects lines and hands each to the printer as it is made.
struct Sink<'a> {
    lines: Vec<Line>,
    print: &'a mut dyn FnMut(&Line),
    t: Instant,
}

impl Sink<'_> {
    fn push(&mut self, status: Status, check: &str, target: &str, figure: String) {
        let l = Line {
            status,
            check: check.to_string(),
            target: target.to_string(),
            figure,
            secs: self.t.elapsed().as_secs_f64(),
        };
        (self.print)(&l);
        self.lines.push(l);
        self.t = Instant::now();
    }
}

/// Runs the checks `o` asks for; `print` sees each line as it is made.
pub fn run(o: &CheckOptions, print: &mut dyn FnMut(&Line)) -> Vec<Line> {
    let mut sink = Sink {
        lines: Vec::new(),
        print,
        t: Instant::now(),
    };
    let wants = |c: &str| o.only.as_ref().is_none_or(|v| v.iter().any(|x| x == c));
    let targets = match targets(o, &mut sink) {
        Some(t) => t,
        None => return sink.lines,
    };
    let models = models::Models::new(&o.dir);
    if wants("ops") {
        ops(o.size, &targets, &mut sink);
    }
    if wants("e2e") {
        end_to_end(o, &targets, &models, &mut sink);
    }
    let main = &targets[0];
    if wants("batch") {
        batched(o.size, main, &models, &mut sink);
    }
    if wants("ssd") {
        ssd(o.size, main, &models, &mut sink);
    }
    sink.lines
}

/// The configurations of `o.backend`, or a FAIL line saying why it does
/// not open.
fn targets(o: &CheckOptions, sink: &mut Sink<'_>) -> Option<Vec<Target>> {
    let target = |label: String, opts: BackendOptions| Target {
        label,
        kind: o.backend,
        opts,
        kernels: true,
        tensor_cores: false,
    };
    let fail = |sink: &mut Sink<'_>, what: &str, e: String| {
        sink.push(Status::Fail, "open", what, e);
        None
    };
    match o.backend {
        BackendKind::Wgpu => {
            // Every optional feature, then (where that means subgroups) the
            // workgroup-memory fallback, whatever the default policy picks.
            let mut out = Vec::new();
            for set in ["all", "f16,timestamps"] {
                let opts = BackendOptions {
                    wgpu_features: Some(set.into()),
                    ..o.base.clone()
                };
                let gpu = match crate::backend::wgpu::Gpu::shared(&opts, true) {
                    Ok(g) => g,
                    Err(e) => return fail(sink, "wgpu", e.to_string()),
                };
                let v = gpu.shader_variant();
                let label = format!("wgpu {}", v.name());
                if set == "all" {
                    sink.push(Status::Pass, "open", &label, gpu.describe());
                }
                if !out.iter().any(|t: &Target| t.label == label) {
                    out.push(target(label, opts));
                }
            }
            Some(out)
        }
        BackendKind::Cuda => cuda_targets(o, sink, &target),
        BackendKind::Cpu => {
            let isa = match crate::backend::cpu::fast::Isa::choose(o.base.cpu_isa.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(sink, "cpu", e),
            };
            let opts = BackendOptions {
                cpu_isa: Some(isa.name().into()),
                ..o.base.clone()
            };
            Some(vec![target(format!("cpu {}", isa.name()), opts)])
        }
        other => fail(
            sink,
            &format!("{other:?}"),
            "the self-check runs cuda, wgpu or cpu".into(),
        ),
    }
}

#[cfg(feature = "cuda")]
fn cuda_targets(
    o: &CheckOptions,
    sink: &mut Sink<'_>,
    target: &dyn Fn(String, BackendOptions) -> Target,
) -> Option<Vec<Target>> {
    let dev = match crate::backend::cuda::list_devices() {
        Ok(d) => d,
        Err(e) => {
            sink.push(Status::Fail, "open", "cuda", e.to_string());
            return None;
        }
    };
    let i: usize = o
        .base
        .cuda_device
        .as_deref()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let Some(d) = dev.get(i).or(dev.first()) else {
        sink.push(Status::Fail, "open", "cuda", "no CUDA device".into());
        return None;
    };
    sink.push(Status::Pass, "open", "cuda", d.line());
    let base = BackendOptions {
        cuda_graph: true,
        cuda_mma: false,
        ..o.base.clone()
    };
    let mut out = vec![target("cuda".into(), base.clone())];
    let mut off = target(
        "cuda graph off".into(),
        BackendOptions {
            cuda_graph: false,
            ..base.clone()
        },
    );
    off.kernels = false;
    out.push(off);
    if d.cc_number() >= 80 {
        let mut mma = target(
            "cuda tensor cores".into(),
            BackendOptions {
                cuda_mma: true,
                ..base
            },
        );
        mma.kernels = false;
        mma.tensor_cores = true;
        out.push(mma);
    } else {
        sink.push(
            Status::Skip,
            "tensor-core prefill",
            "cuda",
            format!("sm_{} is below sm_80", d.cc_number()),
        );
    }
    Some(out)
}

#[cfg(not(feature = "cuda"))]
fn cuda_targets(
    _o: &CheckOptions,
    sink: &mut Sink<'_>,
    _target: &dyn Fn(String, BackendOptions) -> Target,
) -> Option<Vec<Target>> {
    sink.push(
        Status::Fail,
        "open",
        "cuda",
        "this binary was built without the cuda feature".into(),
    );
    None
}

/// Cases of a group a quick run keeps: at most four, spread over the list
/// (the groups go from small to large shapes and over the weight types).
const QUICK_CASES_PER_GROUP: usize = 4;

/// Every group of one-op cases on every kernel variant; the tensor-core
/// cases on the tensor-core target. Quick: a spread of
/// [`QUICK_CASES_PER_GROUP`] cases of each group.
fn ops(size: Size, targets: &[Target], sink: &mut Sink<'_>) {
    let prefill: &[cases::Group] = &[("tensor-core matmul", cases::prefill_matmul_cases)];
    for &(name, make) in cases::GROUPS.iter().chain(prefill) {
        let tensor = name == "tensor-core matmul";
        let mut cases = make();
        if size == Size::Quick {
            let stride = cases.len().div_ceil(QUICK_CASES_PER_GROUP).max(1);
            cases = cases.into_iter().step_by(stride).collect();
        }
        for t in targets
            .iter()
            .filter(|t| if tensor { t.tensor_cores } else { t.kernels })
        {
            let rule = match t.kind {
                BackendKind::Cpu => Rule::FastCpu,
                _ if tensor => Rule::Gpu(Some(oneop::TENSOR_CORE_TOLERANCE)),
                _ => Rule::Gpu(None),
            };
            let reports = oneop::run_cases(&cases, rule, &mut |case| {
                crate::backend::open(t.kind, case.file.clone(), case.layout.clone(), &t.opts)
                    .map(|o| o.backend)
            });
            let failures: Vec<String> = reports.iter().flat_map(|r| r.failures(&t.label)).collect();
            // A loop, not a fold (see CaseReport::worst).
            let (mut worst, mut max_abs) = (0f64, 0f32);
            for r in &reports {
                let (a, b) = r.worst();
                worst = worst.max(a);
                max_abs = max_abs.max(b);
            }
            let outputs: usize = reports.iter().map(|r| r.diffs.len()).sum();
            let figure = format!(
                "{} cases, {outputs} outputs: max |Δ| {max_abs:.2e}, worst {worst:.3} of the tolerance",
                cases.len()
            );
            if failures.is_empty() {
                sink.push(Status::Pass, &format!("ops {name}"), &t.label, figure);
            } else {
                let first = failures
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ");
                sink.push(
                    Status::Fail,
                    &format!("ops {name}"),
                    &t.label,
                    format!("{figure}; {} failures: {first}", failures.len()),
                );
            }
        }
    }
}

/// The bound of a target on V4 models.
fn v4_bound(t: &Target) -> Bound {
    match t.kind {
        BackendKind::Cpu => Bound::FastCpu,
        _ => Bound::Max(e2e::MAX_DLOGPROB),
    }
}

/// Runs one sequence on every target and pushes a line per target.
fn e2e_lines(
    sink: &mut Sink<'_>,
    check: &str,
    model: Result<AnyModel, String>,
    opts: crate::session::SessionOptions,
    targets: &[Target],
    bound: &dyn Fn(&Target) -> Bound,
    pieces: &[Piece],
) {
    let model = match model {
        Ok(m) => m,
        Err(e) => return sink.push(Status::Fail, check, "model", e),
    };
    let positions: usize = pieces
        .iter()
        .map(|p| match p {
            Piece::Score(t) | Piece::Decode(t) => t.len(),
            Piece::Prefill(_) => 1,
        })
        .sum();
    match e2e::compare(&model, &opts, targets, bound, pieces) {
        Err(e) => sink.push(Status::Fail, check, "cpu-ref", e),
        Ok(outcomes) => {
            for oc in outcomes {
                let s = if oc.passed {
                    Status::Pass
                } else {
                    Status::Fail
                };
                sink.push(
                    s,
                    check,
                    &oc.target,
                    format!("{positions} positions: {}", oc.figure),
                );
            }
        }
    }
}

/// The end-to-end comparisons of `o.size`.
fn end_to_end(o: &CheckOptions, targets: &[Target], models: &models::Models, sink: &mut Sink<'_>) {
    // Full: what tests/cuda_e2e.rs checks (every variant and numerics, 100
    // positions scored in steps of 37, then 40 through the prefill graph
    // and 20 decoded). Quick (the dry run on CPU emulators, where each of
    // the 129k-row output heads costs a second): the mxfp4 mix (its file
    // is made in 2 s, the q2 mix's IQ2_XXS search takes 20), 3 + 2 + 1.
    // The fast CPU always runs the full sequence: its bounds are
    // statistics over positions (greedy agreement ≥ 90 %).
    let quick = o.size == Size::Quick && o.backend != BackendKind::Cpu;
    let (variants, numerics, score, chunk, prefill, decode): (&[Variant], &[Numerics], _, _, _, _) =
        if quick {
            (&[Variant::Mxfp4], &[Numerics::Model], 3, 2, 2, 1)
        } else if o.size == Size::Quick {
            (
                &[Variant::Q2, Variant::Mxfp4],
                &[Numerics::Model],
                100,
                37,
                40,
                20,
            )
        } else {
            (
                &Variant::ALL,
                &[Numerics::Model, Numerics::Plain],
                100,
                37,
                40,
                20,
            )
        };
    for &v in variants {
        for &n in numerics {
            let check = format!("e2e tiny-{} {}", v.name(), numerics_name(n));
            let model = models.tiny(v).map(AnyModel::V4);
            let opts = e2e::options(score + prefill + decode + 8, chunk, n);
            let pieces = e2e::sequence(score, prefill, decode, 21);
            e2e_lines(sink, &check, model, opts, targets, &v4_bound, &pieces);
        }
    }
    // V4.1 and the long context: the GPU bounds (the fast CPU's are
    // measured on the tiny V4 models only).
    let gpus: Vec<Target> = targets
        .iter()
        .filter(|t| t.kind != BackendKind::Cpu)
        .cloned()
        .collect();
    if gpus.is_empty() {
        return;
    }
    let opts = e2e::options(score + prefill + decode + 8, chunk, Numerics::Model);
    let pieces = e2e::sequence(score, prefill, decode, 29);
    e2e_lines(
        sink,
        "e2e tiny-v41",
        models.v41(),
        opts,
        &gpus,
        &|_| Bound::Max(e2e::V41_MAX_DLOGPROB),
        &pieces,
    );
    // The long-context model (ratios 0,0,4,128,4,128, window 128, the
    // indexer choosing 64 rows with 4 heads). Full: every position of
    // 3,072 tokens in steps of 256 (the indexer picks 64 of up to 768
    // rows, the window wraps 24 times), then 2 decoded, as
    // tests/wgpu_e2e.rs. Quick: 136 tokens through the prefill graph (past
    // the window) and 1 decoded, on the first target only.
    let (n, step, pieces, on) = if quick {
        let t = e2e::tokens(137, 16);
        let p = vec![
            Piece::Prefill(t[..136].to_vec()),
            Piece::Decode(t[136..].to_vec()),
        ];
        (136, 68, p, &gpus[..1])
    } else {
        (3072, 256, e2e::sequence(3072, 0, 2, 16), &gpus[..])
    };
    let model = models.long_context(Variant::F32).map(AnyModel::V4);
    let opts = e2e::options(n + 8, step, Numerics::Plain);
    e2e_lines(
        sink,
        &format!("e2e long-context {n}"),
        model,
        opts,
        on,
        &v4_bound,
        &pieces,
    );
}

fn numerics_name(n: Numerics) -> &'static str {
    match n {
        Numerics::Model => "model",
        Numerics::Plain => "plain",
    }
}

/// Batched steps against serial ones on the tiny q8 model.
fn batched(size: Size, t: &Target, models: &models::Models, sink: &mut Sink<'_>) {
    let (plans, batches): (Vec<batch::Plan>, &[usize]) = match size {
        // Two sessions of 3 and 6 tokens, quanta of 3 and 4, 2 decoded
        // each, the second starting a step later.
        Size::Quick => (
            vec![batch::plan(11, 3, 2, 0, 3), batch::plan(12, 6, 2, 1, 4)],
            &[2],
        ),
        Size::Full => (batch::plans(), &[1, 2, 4, 8]),
    };
    let check = format!("batch {} sessions", batches.last().copied().unwrap_or(0));
    let model = match models.tiny(Variant::Q8) {
        Ok(m) => m,
        Err(e) => return sink.push(Status::Fail, &check, &t.label, e),
    };
    let opts = batch::options(t.kind, t.opts.clone());
    match batch::check(model, &opts, &plans, batches) {
        Ok(n) => sink.push(
            Status::Pass,
            &check,
            &t.label,
            format!("{n} pieces in batches of {batches:?}: bit-identical to serial"),
        ),
        Err(e) => sink.push(Status::Fail, &check, &t.label, e),
    }
}

/// SSD streaming with a few slots against resident experts.
fn ssd(size: Size, t: &Target, models: &models::Models, sink: &mut Sink<'_>) {
    // (variant, set-ups of streaming_cases to run, prompt, decode)
    let runs: &[(Variant, usize, usize, usize)] = match size {
        Size::Quick => &[(Variant::Mxfp4, 1, 6, 2)],
        Size::Full => &[(Variant::Q2, 3, 23, 8), (Variant::Mxfp4, 1, 23, 8)],
    };
    for &(v, n_cases, prompt, decode) in runs {
        let check = format!("ssd tiny-{}", v.name());
        let model = match models.tiny(v) {
            Ok(m) => m,
            Err(e) => {
                sink.push(Status::Fail, &check, &t.label, e);
                continue;
            }
        };
        let cases = streaming::streaming_cases(model.config.n_expert_used);
        let opts = streaming::options(t.kind, t.opts.clone());
        let prompt = e2e::tokens(prompt, 11);
        match streaming::check_exact(&model, &opts, &prompt, decode, &cases[..n_cases]) {
            Ok(lines) => sink.push(
                Status::Pass,
                &check,
                &t.label,
                format!(
                    "{} cache set-ups bit-identical to resident ({})",
                    lines.len(),
                    lines.join("; ")
                ),
            ),
            Err(e) => sink.push(Status::Fail, &check, &t.label, e),
        }
    }
}
