//! Long sessions side by side (issue 18): sessions of thousands of tokens
//! on the long-context test model, where the indexer really selects (top-k
//! 64 of up to ~800 compressed rows) and the raw window wraps many times,
//! run together as the server schedules them — prefill quanta interleaved
//! with other sessions' decode steps, start steps apart — and each must
//! give, after every piece, the logits of a plain `Session` fed the same
//! pieces alone, bit for bit. The fast CPU backend runs the long schedule
//! (three sessions of 3,000+ tokens); the CPU reference a shorter one of
//! the same shape (1,200–1,500 tokens).

mod common;

use std::sync::Arc;

use common::batch::{options, run_plans};
use common::long_context_model;
use ds4::app::selfcheck::batch::{plan, Plan};
use ds4::backend::BackendKind;
use ds4::model::ModelFile;
use ds4::session::{Batch, Session};

/// The bits of a logits row (compared whole; a mismatch reports where).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs the plans together on one batch and checks each slot's logits
/// after every piece against its own serial `Session`.
fn check(model: Arc<ModelFile>, backend: BackendKind, plans: &[Plan], ctx: usize) {
    let opts = options(backend, ctx);
    // The serial runs first: per session, the logits after each piece.
    let serial: Vec<Vec<Vec<u32>>> = plans
        .iter()
        .map(|p| {
            let mut s = Session::new(model.clone(), opts.clone()).unwrap();
            p.pieces
                .iter()
                .map(|&(_, z)| {
                    s.sync(&p.tokens[..z], &mut |_, _| {}).unwrap();
                    bits(s.logits())
                })
                .collect()
        })
        .collect();
    let mut b = Batch::new(model.clone(), opts, plans.len()).unwrap();
    assert!(
        b.backend_notice().ends_with("batched steps)"),
        "{}",
        b.backend_notice()
    );
    let mut mixed = 0;
    run_plans(&mut b, plans, &|_, _| false, &mut |b, work, ks| {
        let sizes: Vec<usize> = work.iter().map(|w| w.tokens.len()).collect();
        if sizes.contains(&1) && sizes.iter().any(|&n| n > 1) {
            mixed += 1;
        }
        for (w, &k) in work.iter().zip(ks) {
            let want = &serial[w.slot][k];
            let got = bits(b.logits(w.slot));
            if let Some(j) = (0..want.len()).find(|&j| got.get(j) != want.get(j)) {
                panic!(
                    "{backend:?}: slot {} piece {k} (position {}): logit {j} is {} batched, {} alone",
                    w.slot,
                    plans[w.slot].pieces[k].1,
                    f32::from_bits(got[j]),
                    f32::from_bits(want[j])
                );
            }
        }
    });
    // Prefill pieces really met other sessions' decode rows.
    assert!(mixed >= 4, "only {mixed} mixed steps");
}

/// Four sessions on the fast CPU backend: three of 3,000+ tokens whose
/// prompts start apart, and one that decodes through their prefill.
#[test]
fn long_sessions_stay_bit_identical_on_the_fast_cpu() {
    let plans = vec![
        plan(21, 3200, 6, 0, 128),
        plan(22, 3000, 8, 5, 128),
        plan(23, 3100, 4, 9, 128),
        plan(24, 40, 60, 2, 16),
    ];
    check(long_context_model(), BackendKind::Cpu, &plans, 3300);
}

/// The same shape on the CPU reference, shorter (the indexer selects from
/// 4 × 64 = 256 tokens on).
#[test]
fn long_sessions_stay_bit_identical_on_the_cpu_reference() {
    let plans = vec![
        plan(31, 1500, 4, 0, 128),
        plan(32, 1200, 6, 3, 128),
        plan(33, 20, 40, 1, 16),
    ];
    check(long_context_model(), BackendKind::CpuRef, &plans, 1600);
}
