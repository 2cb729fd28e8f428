//! Batch invariance (issue 18): sessions of different prompts, lengths and
//! start steps share steps (prefill pieces beside decode rows at other
//! positions); each session's logits after every piece, and every row's
//! where a piece asks for them, must equal its serial run (a one-slot
//! batch, the same pieces) bit for bit on the same backend. The serial runs
//! are made once per session on one reused one-slot batch (reset between
//! sessions). tests/batch_gpu.rs and `ds4-bench --check` run these.

use std::sync::Arc;

use super::e2e::tokens;
use crate::backend::{BackendKind, BackendOptions};
use crate::model::forward::Numerics;
use crate::model::ModelFile;
use crate::session::{Batch, SessionOptions, SlotWork};

/// One session of a schedule: its tokens, the step it starts at, and its
/// pieces (a prefill cut into quanta, then one token per step).
pub struct Plan {
    pub tokens: Vec<u32>,
    pub start: usize,
    pub pieces: Vec<(usize, usize)>,
    /// Pieces that ask for every row's logits.
    pub all_logits: Vec<bool>,
}

/// A session of `prompt` tokens (seeded by `seed`) prefilled in quanta of
/// `quantum`, then `decode` tokens, starting at step `start`; its second
/// piece keeps every row's logits.
pub fn plan(seed: u64, prompt: usize, decode: usize, start: usize, quantum: usize) -> Plan {
    let tokens = tokens(prompt + decode, seed);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < prompt {
        let n = quantum.min(prompt - at);
        pieces.push((at, at + n));
        at += n;
    }
    for _ in 0..decode {
        pieces.push((at, at + 1));
        at += 1;
    }
    let all_logits = (0..pieces.len()).map(|i| i == 1).collect();
    Plan {
        tokens,
        start,
        pieces,
        all_logits,
    }
}

/// The eight sessions of the full schedule: prompts of 3 to 94 tokens (the
/// longest reach position 96, where the indexer selects 16 of 24 compressed
/// rows), 2 or 3 decode steps, starts 0 to 2, quanta of 17 to 20 tokens.
pub fn plans() -> Vec<Plan> {
    (0..8)
        .map(|i| plan(11 + i as u64, 3 + 13 * i, 2 + i % 2, i % 3, 17 + i % 4))
        .collect()
}

/// The reduced schedule (CUDA on the host emulator): `n` sessions, prompts
/// of 3 to 39 tokens (four of them cross the 32-token window), 2 or 3
/// decode steps, starts 0 to 2, quanta of 9 to 12 tokens, so steps still
/// mix prefill pieces of different lengths with decode rows at other
/// positions.
pub fn small_plans(n: usize) -> Vec<Plan> {
    (0..n)
        .map(|i| plan(11 + i as u64, 3 + 12 * i, 2 + i % 2, i % 3, 9 + i % 4))
        .collect()
}

/// Session options of the batch runs on `backend`.
pub fn options(backend: BackendKind, backend_options: BackendOptions) -> SessionOptions {
    SessionOptions {
        ctx: 128,
        prefill_chunk: 64,
        numerics: Numerics::Model,
        backend,
        backend_options,
        ..Default::default()
    }
}

/// What a session saw: after each piece, its last-row logits and (when
/// asked) every row's.
type Trace = Vec<(Vec<f32>, Vec<f32>)>;

/// What [`run_plans`] calls after each step: the batch, the work stepped
/// and the index of each slot's piece.
pub type StepSeen<'a> = dyn FnMut(&Batch, &[SlotWork], &[usize]) + 'a;

/// Runs `plans` together on `b`, plan `i` on slot `i`, as the server
/// schedules sessions: from its start step on, every step takes each
/// plan's next piece (`all_logits(plan, k)`: whether piece `k` keeps every
/// row's logits), so steps mix prefill pieces and decode rows. After each
/// step `seen(b, work, ks)` gets the work stepped and the index of each
/// slot's piece. An error names the step that failed, or a slot that does
/// not end holding its plan's tokens.
pub fn run_plans<P: std::borrow::Borrow<Plan>>(
    b: &mut Batch,
    plans: &[P],
    all_logits: &dyn Fn(&Plan, usize) -> bool,
    seen: &mut StepSeen<'_>,
) -> Result<(), String> {
    let plans: Vec<&Plan> = plans.iter().map(|p| p.borrow()).collect();
    let mut next = vec![0usize; plans.len()];
    let mut step = 0;
    while plans.iter().zip(&next).any(|(p, &n)| n < p.pieces.len()) {
        let work: Vec<SlotWork> = plans
            .iter()
            .enumerate()
            .filter(|(i, p)| step >= p.start && next[*i] < p.pieces.len())
            .map(|(i, p)| {
                let (a, z) = p.pieces[next[i]];
                SlotWork {
                    slot: i,
                    tokens: &p.tokens[a..z],
                    all_logits: all_logits(p, next[i]),
                }
            })
            .collect();
        if !work.is_empty() {
            b.step(&work).map_err(|e| format!("step {step}: {e}"))?;
            let ks: Vec<usize> = work.iter().map(|w| next[w.slot]).collect();
            seen(b, &work, &ks);
            for w in &work {
                next[w.slot] += 1;
            }
        }
        step += 1;
    }
    for (i, p) in plans.iter().enumerate() {
        if b.tokens(i) != &p.tokens[..] {
            return Err(format!("slot {i} does not hold its tokens"));
        }
    }
    Ok(())
}

/// Runs `plans` on slots `0..plans.len()` of `b` ([`run_plans`]), keeping
/// what each session saw.
fn run(b: &mut Batch, plans: &[&Plan]) -> Result<Vec<Trace>, String> {
    let mut traces: Vec<Trace> = vec![Vec::new(); plans.len()];
    run_plans(b, plans, &|p, k| p.all_logits[k], &mut |b, work, _| {
        for w in work {
            traces[w.slot].push((b.logits(w.slot).to_vec(), b.piece_logits(w.slot).to_vec()));
        }
    })?;
    Ok(traces)
}

fn same(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits())
}

/// Every session's serial run, then the first `n` of them together for
/// each `n` of `batches`, with `opts`. The number of steps compared, or
/// the first difference.
pub fn check(
    model: Arc<ModelFile>,
    opts: &SessionOptions,
    plans: &[Plan],
    batches: &[usize],
) -> Result<usize, String> {
    let backend = opts.backend;
    let mut one = Batch::new(model.clone(), opts.clone(), 1).map_err(|e| e.to_string())?;
    let serial: Vec<Trace> = plans
        .iter()
        .map(|p| {
            one.reset(0);
            run(&mut one, &[p]).map(|mut t| t.remove(0))
        })
        .collect::<Result<_, _>>()?;
    let mut compared = 0;
    for &n in batches.iter().filter(|&&n| n <= plans.len()) {
        let mut b = Batch::new(model.clone(), opts.clone(), n).map_err(|e| e.to_string())?;
        // A state set per slot: one pass for all slots, not one per slot.
        if !b.backend_notice().ends_with("batched steps)") {
            return Err(format!("{n} slots: not batched: {}", b.backend_notice()));
        }
        let mine: Vec<&Plan> = plans[..n].iter().collect();
        let together = run(&mut b, &mine)?;
        for (i, p) in mine.iter().enumerate() {
            if together[i].len() != serial[i].len() {
                return Err(format!(
                    "slot {i} of {n}: {} pieces, serial {}",
                    together[i].len(),
                    serial[i].len()
                ));
            }
            for (k, (a, s)) in together[i].iter().zip(&serial[i]).enumerate() {
                let at = format!("{backend:?}: slot {i} of {n}, piece {k}");
                if a.0.is_empty() || !a.0.iter().all(|x| x.is_finite()) {
                    return Err(format!("{at}: logits missing or not finite"));
                }
                if !same(&a.0, &s.0) {
                    let d =
                        a.0.iter()
                            .zip(&s.0)
                            .map(|(x, y)| (x - y).abs())
                            .fold(0.0, f32::max);
                    return Err(format!(
                        "{at}: logits differ from the serial run (max |d| {d:e})"
                    ));
                }
                if !same(&a.1, &s.1) {
                    return Err(format!("{at}: per-row logits differ from the serial run"));
                }
                if p.all_logits[k] {
                    let rows = p.pieces[k].1 - p.pieces[k].0;
                    let v = model.config.n_vocab;
                    if a.1.len() != rows * v || !same(&a.1[(rows - 1) * v..], &a.0) {
                        return Err(format!(
                            "{at}: every row's logits: not {rows} rows ending with the last row's"
                        ));
                    }
                }
                compared += 1;
            }
        }
    }
    Ok(compared)
}
