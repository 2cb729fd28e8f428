//! End-to-end logits against `cpu-ref`: the same token sequence runs on
//! the reference and on every target in lock step (one piece at a time, so
//! even 3,000 positions of logits are never all held), and each target's
//! logits are judged at every position under its [`Bound`]. The bounds are
//! the tests' (tests/wgpu_e2e.rs, cuda_e2e.rs, v41_gpu_fidelity.rs,
//! cpu_fast_e2e.rs; stated in docs/VALIDATION.md).

use super::Target;
use crate::model::any_model::AnyModel;
use crate::model::forward::Numerics;
use crate::session::{Session, SessionOptions};

/// Max |Δ log-prob| of a GPU backend against `cpu-ref` over every position
/// and vocabulary entry on the V4 models: the GPU sums in a different order
/// than the CPU twins (tree reductions, online softmax, fused
/// multiply-adds), so the logits differ in the last bits; they must not
/// differ more.
pub const MAX_DLOGPROB: f32 = 2e-3;

/// The V4.1 bound (tests/v41_gpu_fidelity.rs, there against the float64
/// goldens, which `cpu-ref` follows within 5e-7): f32 GPU sums and
/// transcendental functions add a few 1e-6 at most on the tiny model.
pub const V41_MAX_DLOGPROB: f32 = 1e-4;

/// The fast CPU backend against `cpu-ref` (tests/cpu_fast_e2e.rs): it
/// quantises the activations of every matrix product to int8, as
/// llama.cpp's and ds4's CPU paths do, so the logits differ by much more
/// than between two f32 backends; measured figures with a margin.
pub const FAST_CPU_MAX_DLOGPROB: f32 = 0.4;
/// Median |Δ log-prob| of the fast CPU backend.
pub const FAST_CPU_MEDIAN_DLOGPROB: f32 = 0.01;
/// Share of positions whose argmax agrees with `cpu-ref` (fast CPU).
pub const FAST_CPU_MIN_GREEDY_AGREEMENT: f64 = 0.9;

/// Log-probabilities of one row of logits (sums in f64).
pub fn log_softmax(l: &[f32]) -> Vec<f32> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = l.iter().map(|&x| ((x - m) as f64).exp()).sum();
    let ls = s.ln() as f32;
    l.iter().map(|&x| x - m - ls).collect()
}

/// Max |Δ log-prob| between two runs of `vocab`-wide logit rows (infinite
/// when their lengths differ).
pub fn max_dlogprob(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            log_softmax(x)
                .iter()
                .zip(log_softmax(y))
                .map(|(p, q)| {
                    if p.is_nan() || q.is_nan() {
                        f32::INFINITY
                    } else {
                        (p - q).abs()
                    }
                })
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

/// The greedy token of one row of logits (ties to the lower id).
pub fn argmax(l: &[f32]) -> u32 {
    l.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i as u32)
        .unwrap_or(0)
}

/// (max |Δ log-prob|, median |Δ log-prob|, greedy agreement) of `got`
/// against `want` over every row and vocabulary entry.
pub fn figures(got: &[f32], want: &[f32], vocab: usize) -> (f32, f32, f64) {
    let mut acc = Acc::new(true);
    acc.add(got, want, vocab);
    acc.figures()
}

/// How a target's logits are judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// max |Δ log-prob| ≤ the value.
    Max(f32),
    /// The fast CPU backend's three bounds.
    FastCpu,
}

impl Bound {
    fn passes(self, (max, median, agree): (f32, f32, f64)) -> bool {
        match self {
            Bound::Max(b) => max <= b,
            Bound::FastCpu => {
                max <= FAST_CPU_MAX_DLOGPROB
                    && median <= FAST_CPU_MEDIAN_DLOGPROB
                    && agree >= FAST_CPU_MIN_GREEDY_AGREEMENT
            }
        }
    }

    /// `max |Δ log-prob| 1.2e-4 (≤ 2e-3)`, with the median and greedy
    /// agreement for the fast CPU.
    fn describe(self, (max, median, agree): (f32, f32, f64)) -> String {
        match self {
            Bound::Max(b) => format!("max |Δ log-prob| {max:.2e} (bound {b:.0e})"),
            Bound::FastCpu => format!(
                "max |Δ log-prob| {max:.2e} (bound {FAST_CPU_MAX_DLOGPROB}), median {median:.2e} (bound {FAST_CPU_MEDIAN_DLOGPROB}), greedy agreement {:.1} % (bound {:.0} %)",
                100.0 * agree,
                100.0 * FAST_CPU_MIN_GREEDY_AGREEMENT
            ),
        }
    }
}

/// The running figures of one target.
struct Acc {
    max: f32,
    /// Every |Δ log-prob| (kept only where a median is asked for).
    all: Option<Vec<f32>>,
    rows: usize,
    agree: usize,
}

impl Acc {
    fn new(median: bool) -> Acc {
        Acc {
            max: 0.0,
            all: median.then(Vec::new),
            rows: 0,
            agree: 0,
        }
    }

    fn add(&mut self, got: &[f32], want: &[f32], vocab: usize) {
        if got.len() != want.len() || vocab == 0 {
            self.max = f32::INFINITY;
            return;
        }
        for (g, w) in got.chunks(vocab).zip(want.chunks(vocab)) {
            if !g.iter().all(|x| x.is_finite()) {
                self.max = f32::INFINITY;
            }
            for (p, q) in log_softmax(g).iter().zip(log_softmax(w)) {
                let d = if p.is_nan() || q.is_nan() {
                    f32::INFINITY
                } else {
                    (p - q).abs()
                };
                self.max = self.max.max(d);
                if let Some(all) = &mut self.all {
                    all.push(d);
                }
            }
            self.rows += 1;
            self.agree += (argmax(g) == argmax(w)) as usize;
        }
    }

    fn figures(&mut self) -> (f32, f32, f64) {
        let median = match &mut self.all {
            Some(all) if !all.is_empty() => {
                all.sort_by(f32::total_cmp);
                all[all.len() / 2]
            }
            _ => 0.0,
        };
        (
            self.max,
            median,
            self.agree as f64 / self.rows.max(1) as f64,
        )
    }
}

/// One piece of a sequence.
#[derive(Clone, Debug)]
pub enum Piece {
    /// The logits at every one of these positions (the scoring graph, in
    /// prefill steps), after what the session holds.
    Score(Vec<u32>),
    /// These tokens through the prefill graph (chunked, the last row's
    /// logits compared).
    Prefill(Vec<u32>),
    /// These tokens one by one through the decode graph (a CUDA graph
    /// where captured), the logits compared after each.
    Decode(Vec<u32>),
}

impl Piece {
    fn tokens(&self) -> &[u32] {
        match self {
            Piece::Score(t) | Piece::Prefill(t) | Piece::Decode(t) => t,
        }
    }
}

/// The logits `piece` gives on `s`, in order (for Prefill: the last row).
fn step(s: &mut Session, held: &[u32], piece: &Piece) -> Result<Vec<f32>, String> {
    let e = |e: crate::session::SessionError| e.to_string();
    match piece {
        Piece::Score(t) => s.score_more(t).map_err(e),
        Piece::Prefill(t) => {
            let mut all = held.to_vec();
            all.extend_from_slice(t);
            s.sync(&all, &mut |_, _| {}).map_err(e)?;
            Ok(s.logits().to_vec())
        }
        Piece::Decode(t) => {
            let mut out = Vec::new();
            for &tok in t {
                s.eval(tok).map_err(e)?;
                out.extend_from_slice(s.logits());
            }
            Ok(out)
        }
    }
}

/// The outcome of one target on one sequence: its figure line, or why it
/// could not run.
pub struct Outcome {
    pub target: String,
    pub passed: bool,
    pub figure: String,
}

/// Runs `pieces` on `cpu-ref` and on each target (sessions of `opts` with
/// the target's backend) in lock step and judges each target under
/// `bound(target)`. A target that fails to open or to run a piece fails
/// with the reason; the others go on.
pub fn compare(
    model: &AnyModel,
    opts: &SessionOptions,
    targets: &[Target],
    bound: &dyn Fn(&Target) -> Bound,
    pieces: &[Piece],
) -> Result<Vec<Outcome>, String> {
    let open = |t: Option<&Target>| -> Result<Session, String> {
        let o = match t {
            Some(t) => SessionOptions {
                backend: t.kind,
                backend_options: t.opts.clone(),
                ..opts.clone()
            },
            None => SessionOptions {
                backend: crate::backend::BackendKind::CpuRef,
                ..opts.clone()
            },
        };
        Session::open_any(model, o).map_err(|e| e.to_string())
    };
    let mut reference = open(None).map_err(|e| format!("cpu-ref: {e}"))?;
    let vocab = reference.n_vocab();
    struct Lane {
        session: Result<Session, String>,
        acc: Acc,
        bound: Bound,
    }
    let mut lanes: Vec<Lane> = targets
        .iter()
        .map(|t| {
            let b = bound(t);
            Lane {
                session: open(Some(t)),
                acc: Acc::new(b == Bound::FastCpu),
                bound: b,
            }
        })
        .collect();
    let mut held: Vec<u32> = Vec::new();
    for piece in pieces {
        let want = step(&mut reference, &held, piece).map_err(|e| format!("cpu-ref: {e}"))?;
        for lane in &mut lanes {
            let Ok(s) = &mut lane.session else { continue };
            match step(s, &held, piece) {
                Ok(got) => lane.acc.add(&got, &want, vocab),
                Err(e) => lane.session = Err(e),
            }
        }
        held.extend_from_slice(piece.tokens());
    }
    Ok(targets
        .iter()
        .zip(lanes)
        .map(|(t, mut lane)| match lane.session {
            Err(e) => Outcome {
                target: t.label.clone(),
                passed: false,
                figure: e,
            },
            Ok(_) => {
                let f = lane.acc.figures();
                Outcome {
                    target: t.label.clone(),
                    passed: lane.bound.passes(f),
                    figure: lane.bound.describe(f),
                }
            }
        })
        .collect())
}

/// Deterministic pseudo-random token ids below 128,000 (below the
/// added-token range, so the hash layers see ordinary ids too).
pub fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 128_000) as u32
        })
        .collect()
}

/// A sequence of `score` tokens scored at every position, `prefill` more
/// through the prefill graph and `decode` more one by one.
pub fn sequence(score: usize, prefill: usize, decode: usize, seed: u64) -> Vec<Piece> {
    let t = tokens(score + prefill + decode, seed);
    let mut v = vec![Piece::Score(t[..score].to_vec())];
    if prefill > 0 {
        v.push(Piece::Prefill(t[score..score + prefill].to_vec()));
    }
    if decode > 0 {
        v.push(Piece::Decode(t[score + prefill..].to_vec()));
    }
    v
}

/// Session options of an end-to-end run: context for the whole sequence,
/// prefill steps of `chunk`.
pub fn options(ctx: usize, chunk: usize, numerics: Numerics) -> SessionOptions {
    SessionOptions {
        ctx,
        prefill_chunk: chunk,
        numerics,
        ..SessionOptions::default()
    }
}
