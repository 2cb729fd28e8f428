//! End to end on the CUDA backend (feature `cuda`, a CUDA device present;
//! skipped with a message otherwise — CI has no NVIDIA GPU): logits equal
//! the CPU backend's at every position on every tiny model, both numerics,
//! through chunked prefill; token-by-token decode (the captured CUDA graph)
//! and the same decode with capture off (`BackendOptions::cuda_graph`) match the CPU.
//! Tolerance as in tests/wgpu_e2e.rs (docs/VALIDATION.md).
#![cfg(feature = "cuda")]

mod common;
use common::{max_dlogprob, session_on as session};

use common::tokens;
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::forward::Numerics;
use ds4::testmodel::Variant;

/// The bound of src/app/selfcheck/e2e.rs (`ds4-bench --check` uses it too).
use ds4::app::selfcheck::e2e::MAX_DLOGPROB;

fn have_cuda() -> bool {
    match ds4::backend::cuda::list_devices() {
        Ok(d) => {
            eprintln!("cuda device: {}", d[0].line());
            true
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            false
        }
    }
}

#[test]
fn prefill_logits_match_the_cpu_on_every_tiny_variant() {
    if !have_cuda() {
        return;
    }
    for v in Variant::ALL {
        for numerics in [Numerics::Plain, Numerics::Model] {
            let toks = tokens(100, 21);
            let mut c = session(v, numerics, BackendKind::CpuRef, 512, 37);
            let mut g = session(v, numerics, BackendKind::Cuda, 512, 37);
            let want = c.score(&toks).unwrap();
            let got = g.score(&toks).unwrap();
            let d = max_dlogprob(&got, &want, c.n_vocab());
            eprintln!("{v:?} {numerics:?}: max |Δ log-prob| {d:e}");
            assert!(d <= MAX_DLOGPROB, "{v:?} {numerics:?}: {d:e}");
        }
    }
}

#[test]
fn decode_with_and_without_the_cuda_graph_matches_the_cpu() {
    if !have_cuda() {
        return;
    }
    for capture in [true, false] {
        let opts = BackendOptions {
            cuda_graph: capture,
            ..BackendOptions::from_env()
        };
        for v in [Variant::F32, Variant::Q2, Variant::Q4] {
            let toks = tokens(60, 8);
            let (head, tail) = toks.split_at(40);
            let mut c = session(v, Numerics::Model, BackendKind::CpuRef, 256, 16);
            let mut g =
                common::session_with(v, Numerics::Model, BackendKind::Cuda, 256, 16, opts.clone());
            c.sync(head, &mut |_, _| {}).unwrap();
            g.sync(head, &mut |_, _| {}).unwrap();
            let worst = common::decode_max_dlogprob(&mut g, &mut c, tail);
            eprintln!("{v:?} graph {capture}: decode max |Δ log-prob| {worst:e}");
            assert!(worst <= MAX_DLOGPROB, "{v:?} graph {capture}: {worst:e}");
        }
    }
}
