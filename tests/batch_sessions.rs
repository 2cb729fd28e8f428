//! Batch invariance (issue 18): several sessions' rows through one step give
//! each session the logits of its serial run (`slots = 1`, the same piece
//! sizes), bit for bit. Sessions differ in prompt, length and start step, so
//! one step mixes prefill pieces and decode rows of different positions.

mod common;

use std::sync::Arc;

use common::batch::{options, run_plans};
use common::{long_context_model, tiny_model, tokens};
use ds4::app::selfcheck::batch::{plan, Plan};
use ds4::backend::BackendKind;
use ds4::model::ModelFile;
use ds4::session::{Batch, SessionError, SessionOptions, SlotWork};
use ds4::testmodel::Variant;

/// What a session saw: after each piece, its last-row logits and (when
/// asked) every row's.
type Trace = Vec<(Vec<f32>, Vec<f32>)>;

/// Runs the plans together on one batch of `plans.len()` slots.
fn run_together(model: &Arc<ModelFile>, opts: &SessionOptions, plans: &[Plan]) -> Vec<Trace> {
    let mut b = Batch::new(model.clone(), opts.clone(), plans.len()).unwrap();
    // The CPU backends hold a state set per slot: one pass for all slots.
    assert!(
        b.backend_notice().ends_with("batched steps)"),
        "{}",
        b.backend_notice()
    );
    let mut traces: Vec<Trace> = vec![Vec::new(); plans.len()];
    run_plans(&mut b, plans, &|p, k| p.all_logits[k], &mut |b, work, _| {
        for w in work {
            traces[w.slot].push((b.logits(w.slot).to_vec(), b.piece_logits(w.slot).to_vec()));
        }
    });
    traces
}

fn check_invariance(model: Arc<ModelFile>, backend: BackendKind, plans: &[Plan], ctx: usize) {
    let opts = options(backend, ctx);
    let together = run_together(&model, &opts, plans);
    for (i, p) in plans.iter().enumerate() {
        let alone = Plan {
            tokens: p.tokens.clone(),
            start: 0,
            pieces: p.pieces.clone(),
            all_logits: p.all_logits.clone(),
        };
        let serial = run_together(&model, &opts, std::slice::from_ref(&alone));
        assert_eq!(together[i].len(), serial[0].len());
        for (k, (a, b)) in together[i].iter().zip(&serial[0]).enumerate() {
            assert!(!a.0.is_empty(), "slot {i} piece {k} has logits");
            assert!(
                a.0.iter().all(|x| x.is_finite()),
                "slot {i} piece {k} finite"
            );
            let same = |x: &[f32], y: &[f32]| {
                x.len() == y.len() && x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits())
            };
            assert!(
                same(&a.0, &b.0),
                "{backend:?}: slot {i} of {}, piece {k}: logits differ from the serial run (max |d| {})",
                plans.len(),
                common::max_abs_diff(&a.0, &b.0)
            );
            assert!(
                same(&a.1, &b.1),
                "{backend:?}: slot {i} of {}, piece {k}: per-row logits differ from the serial run",
                plans.len()
            );
            if p.all_logits[k] {
                let rows = p.pieces[k].1 - p.pieces[k].0;
                assert_eq!(a.1.len(), rows * model.config.n_vocab);
                let v = model.config.n_vocab;
                assert!(
                    same(&a.1[(rows - 1) * v..], &a.0),
                    "last row of the piece = logits"
                );
            }
        }
    }
}

/// 1, 2, 4 and 8 sessions of different prompts, lengths and start steps on
/// the tiny model (the indexer selects from position 68 on).
fn tiny_schedules(backend: BackendKind, variant: Variant) {
    let model = tiny_model(variant);
    for n in [1usize, 2, 4, 8] {
        let plans: Vec<Plan> = (0..n)
            .map(|i| plan(11 + i as u64, 3 + 13 * i, 4 + i % 3, i % 3, 9 + i % 4))
            .collect();
        check_invariance(model.clone(), backend, &plans, 256);
    }
}

/// `tokens` for `slot`, keeping only the last row's logits.
fn last_row(slot: usize, tokens: &[u32]) -> SlotWork<'_> {
    SlotWork {
        slot,
        tokens,
        all_logits: false,
    }
}

#[test]
fn cpu_ref_sessions_are_batch_invariant() {
    tiny_schedules(BackendKind::CpuRef, Variant::Q8);
}

#[test]
fn cpu_fast_sessions_are_batch_invariant() {
    // q2: the routed experts' kernels differ between few and many rows
    // (Q8_K against Q8x32 activations), so the per-piece choice matters.
    tiny_schedules(BackendKind::Cpu, Variant::Q2);
}

/// The long-context model, where the indexer really selects (top-k 64 of
/// more than 64 compressed rows) and the raw window wraps: one long session
/// beside short ones.
#[test]
fn long_context_sessions_are_batch_invariant() {
    let plans = vec![
        plan(5, 290, 3, 0, 64),
        plan(6, 7, 5, 1, 4),
        plan(7, 40, 2, 3, 16),
    ];
    for backend in [BackendKind::CpuRef, BackendKind::Cpu] {
        check_invariance(long_context_model(), backend, &plans, 512);
    }
}

#[test]
fn bad_steps_are_refused_before_anything_runs() {
    let model = tiny_model(Variant::Q8);
    let mut b = Batch::new(model.clone(), options(BackendKind::CpuRef, 16), 2).unwrap();
    let t = tokens(4, 3);
    b.step(&[last_row(0, &t)]).unwrap();
    let before = b.logits(0).to_vec();
    let vocab = model.config.n_vocab as u32;
    let bad = [vocab];
    let long = tokens(13, 4);
    for work in [
        vec![last_row(2, &t)],
        vec![last_row(1, &t), last_row(1, &t)],
        vec![last_row(1, &t), last_row(0, &bad)],
        vec![last_row(1, &t), last_row(0, &long)],
        vec![last_row(1, &[])],
    ] {
        let e = b.step(&work).unwrap_err();
        assert!(
            matches!(
                e,
                SessionError::Batch(_)
                    | SessionError::BadToken { .. }
                    | SessionError::ContextFull { .. }
                    | SessionError::Empty
            ),
            "{e}"
        );
        assert_eq!(b.tokens(0), &t[..], "slot 0 untouched");
        assert!(b.tokens(1).is_empty(), "slot 1 untouched");
        assert_eq!(b.logits(0), &before[..]);
    }
}

/// A slot saved and loaded into another slot continues exactly as the
/// original does.
#[test]
fn snapshots_move_between_slots() {
    let model = tiny_model(Variant::Q8);
    let mut b = Batch::new(model, options(BackendKind::CpuRef, 128), 3).unwrap();
    let t = tokens(30, 9);
    let other = tokens(11, 10);
    b.step(&[last_row(0, &t[..20]), last_row(2, &other)])
        .unwrap();
    let snap = b.save_snapshot(0).unwrap();
    b.load_snapshot(1, &snap).unwrap();
    assert_eq!(b.tokens(1), &t[..20]);
    b.step(&[last_row(0, &t[20..]), last_row(1, &t[20..])])
        .unwrap();
    let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(b.logits(0)), bits(b.logits(1)));
    b.reset(0);
    assert!(b.tokens(0).is_empty() && b.logits(0).is_empty());
    assert_eq!(b.tokens(2), &other[..]);
}
