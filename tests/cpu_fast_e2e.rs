//! End to end: the fast CPU backend's logits against the reference
//! backend's on every tiny model, at every position (chunked prefill and
//! token-by-token decode), with and without the official rounding steps, on
//! every kernel path this machine can run (`BackendOptions::cpu_isa`, each
//! in turn). Reports max and median |Δ log-prob| and greedy agreement.
//!
//! Bounds (docs/CPU_FAST.md): the fast path quantises the activations of
//! every matrix product to int8, as llama.cpp's and ds4's CPU paths do, so
//! the logits differ from the f32 reference by much more than between two
//! f32 backends; the bounds are the measured figures with a margin.

mod common;

use common::tokens;
use ds4::backend::cpu::fast::Isa;
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::forward::Numerics;
use ds4::session::Session;
use ds4::testmodel::Variant;

// The bounds of src/app/selfcheck/e2e.rs (`ds4-bench --check cpu` uses
// them too): max and median |Δ log-prob| over every position and
// vocabulary entry, and the share of positions whose argmax agrees.
use ds4::app::selfcheck::e2e::{
    figures as compare, FAST_CPU_MAX_DLOGPROB as MAX_DLOGPROB,
    FAST_CPU_MEDIAN_DLOGPROB as MEDIAN_DLOGPROB,
    FAST_CPU_MIN_GREEDY_AGREEMENT as MIN_GREEDY_AGREEMENT,
};

fn session(v: Variant, numerics: Numerics, backend: BackendKind, chunk: usize) -> Session {
    common::session_on(v, numerics, backend, 256, chunk)
}

/// A fast CPU session on the kernel path `isa`.
fn fast(v: Variant, numerics: Numerics, isa: Isa, chunk: usize) -> Session {
    let opts = BackendOptions {
        cpu_isa: Some(isa.name().to_string()),
        ..BackendOptions::from_env()
    };
    common::session_with(v, numerics, BackendKind::Cpu, 256, chunk, opts)
}

#[test]
fn fast_cpu_logits_follow_the_reference_on_every_tiny_variant_and_path() {
    let toks = tokens(100, 21);
    let decode = tokens(24, 5);
    let mut failures = Vec::new();
    for v in Variant::ALL {
        for numerics in [Numerics::Plain, Numerics::Model] {
            let mut r = session(v, numerics, BackendKind::CpuRef, 37);
            let want = r.score(&toks).unwrap();
            let vocab = r.n_vocab();
            // Token-by-token decode (the one-row kernels) on two variants.
            let decode: &[u32] = if matches!(v, Variant::Q2 | Variant::Mxfp4) {
                &decode
            } else {
                &[]
            };
            let mut rd = session(v, numerics, BackendKind::CpuRef, 37);
            let mut want_dec = Vec::new();
            for &t in decode {
                rd.eval(t).unwrap();
                want_dec.extend_from_slice(rd.logits());
            }
            for isa in Isa::available() {
                let mut f = fast(v, numerics, isa, 37);
                let got = f.score(&toks).unwrap();
                let mut fd = fast(v, numerics, isa, 37);
                let mut got_dec = Vec::new();
                for &t in decode {
                    fd.eval(t).unwrap();
                    got_dec.extend_from_slice(fd.logits());
                }
                for (what, g, w) in [("prefill", &got, &want), ("decode", &got_dec, &want_dec)] {
                    if g.is_empty() {
                        continue;
                    }
                    let (max, med, agree) = compare(g, w, vocab);
                    let line = format!(
                        "{v:?} {numerics:?} {:<8} {what:<7}: max |Δ log-prob| {max:.3e}, median {med:.3e}, greedy agreement {:.1} %",
                        isa.name(),
                        100.0 * agree
                    );
                    eprintln!("{line}");
                    if max > MAX_DLOGPROB || med > MEDIAN_DLOGPROB || agree < MIN_GREEDY_AGREEMENT {
                        failures.push(line);
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "beyond the bounds:\n{}",
        failures.join("\n")
    );
}
