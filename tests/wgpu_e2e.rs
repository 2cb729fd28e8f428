//! End to end on the wgpu backend: logits equal the CPU backend's at every
//! position on the tiny models (f32, q8, q2, q4; plain and model numerics),
//! through chunked prefill, token-by-token decode and snapshot restore;
//! greedy continuations agree; one long context wraps the window many times
//! and makes the indexer choose among hundreds of rows; on the long-context
//! test model, every position of a 3,072-token prompt (the indexer picks 64
//! of up to 768 rows) and the default 2,048-token prefill steps. In CI these run on
//! lavapipe; with `CI` set and no adapter they fail instead of skipping.
//!
//! Tolerance (stated in docs/VALIDATION.md): max |Δ log-prob| over every
//! position and every vocabulary entry ≤ `MAX_DLOGPROB`. The GPU sums in a
//! different order than the CPU twins (tree reductions, online softmax,
//! fused multiply-adds), so the logits differ in the last bits; they must
//! not differ more.

mod common;
use common::{argmax, max_dlogprob, session_on as session};

use std::sync::Arc;

use common::{long_context_model, tiny_model, tokens};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::graph::ValueName;
use ds4::model::forward::{self, ForwardOptions, Numerics};
use ds4::model::logits::Logits;
use ds4::model::state::KvLayout;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

/// The bound of src/app/selfcheck/e2e.rs (`ds4-bench --check` uses it too).
use ds4::app::selfcheck::e2e::MAX_DLOGPROB;

/// Whether the GPU half runs (`CI` set and no adapter: panic).
fn have_gpu() -> bool {
    common::have_wgpu()
}

/// Keep-all mode: runs `toks` on the CPU and on wgpu with every value of the
/// graph kept, and names the first value (in tape order) where they differ
/// by more than `tol` relative to the value's scale.
fn first_divergence(
    v: Variant,
    a: (BackendKind, Numerics),
    b: (BackendKind, Numerics),
    toks: &[u32],
    tol: f32,
) -> Option<String> {
    let numerics = a.1;
    let model = tiny_model(v);
    let kv = KvLayout::new(&model.config, &model.weights, 256);
    let g = forward::record(
        &model.config,
        &model.weights,
        &kv,
        toks.len(),
        &ForwardOptions {
            numerics,
            logits: Logits::Last,
            keep: vec![],
        },
    );
    let mut names: Vec<ValueName> = Vec::new();
    for d in &g.values {
        if !names.contains(&d.name) {
            names.push(d.name.clone());
        }
    }
    let open = |(k, numerics): (BackendKind, Numerics)| {
        let opts = SessionOptions {
            ctx: 256,
            prefill_chunk: toks.len(),
            numerics,
            backend: k,
            backend_options: BackendOptions::from_env(),
            dump: names.clone(),
            ..Default::default()
        };
        let mut s = Session::new(model.clone(), opts).unwrap();
        s.sync(toks, &mut |_, _| {}).unwrap();
        s
    };
    let (a, b) = (open(a), open(b));
    for n in &names {
        let (x, y) = (a.dump(n).ok()?, b.dump(n).ok()?);
        let scale = x.iter().map(|v| v.abs()).fold(1e-6f32, f32::max);
        let d = x
            .iter()
            .zip(&y)
            .map(|(p, q)| {
                if p.is_nan() != q.is_nan() {
                    f32::INFINITY
                } else {
                    (p - q).abs()
                }
            })
            .fold(0.0, f32::max);
        if d > tol * scale {
            return Some(format!("{n}: max |Δ| {d:e} (scale {scale:e})"));
        }
    }
    None
}

#[test]
fn keep_all_mode_names_the_first_diverging_value() {
    let toks = tokens(9, 4);
    let cpu = |n| (BackendKind::CpuRef, n);
    assert_eq!(
        first_divergence(
            Variant::F32,
            cpu(Numerics::Model),
            cpu(Numerics::Model),
            &toks,
            0.0
        ),
        None,
        "the CPU must agree with itself bit for bit"
    );
    // Plain and model numerics first differ where layer 0 rounds its KV
    // rows: the detector must stop there, not at a later value.
    let d = first_divergence(
        Variant::F32,
        cpu(Numerics::Plain),
        cpu(Numerics::Model),
        &toks,
        0.0,
    )
    .expect("plain and model numerics differ");
    eprintln!("plain vs model numerics: first divergence {d}");
    assert!(d.contains("@0"), "{d}");
    if have_gpu() {
        let wg = (BackendKind::Wgpu, Numerics::Model);
        if let Some(d) = first_divergence(Variant::Q8, cpu(Numerics::Model), wg, &toks, 1e-3) {
            panic!("wgpu diverges from the CPU first at {d}");
        }
    }
}

/// Chunked prefill scoring every position (the output head runs once per
/// position, the costly part on a CPU emulator).
fn check_scored(v: Variant, numerics: Numerics, n: usize, chunk: usize) -> f32 {
    let toks = tokens(n, 21);
    let mut c = session(v, numerics, BackendKind::CpuRef, 512, chunk);
    let mut g = session(v, numerics, BackendKind::Wgpu, 512, chunk);
    let want = c.score(&toks).unwrap();
    let got = g.score(&toks).unwrap();
    let vocab = c.n_vocab();
    let d = max_dlogprob(&got, &want, vocab);
    eprintln!("{v:?} {numerics:?}: every position of {n} tokens in chunks of {chunk}: max |Δ log-prob| {d:e}");
    if d > MAX_DLOGPROB {
        let first = first_divergence(
            v,
            (BackendKind::CpuRef, numerics),
            (BackendKind::Wgpu, numerics),
            &toks[..16],
            1e-3,
        );
        panic!("{v:?} {numerics:?}: max |Δ log-prob| {d:e} > {MAX_DLOGPROB:e}; first divergence {first:?}");
    }
    d
}

/// Chunked prefill then a few decode steps, comparing the logits after the
/// prefill and after each decoded token.
fn check_prefill_then_decode(v: Variant, numerics: Numerics, n: usize, chunk: usize) -> f32 {
    let toks = tokens(n + 1, 31);
    let mut c = session(v, numerics, BackendKind::CpuRef, 512, chunk);
    let mut g = session(v, numerics, BackendKind::Wgpu, 512, chunk);
    c.sync(&toks[..n], &mut |_, _| {}).unwrap();
    g.sync(&toks[..n], &mut |_, _| {}).unwrap();
    let d = common::decode_max_dlogprob(&mut g, &mut c, &toks[n..]);
    eprintln!(
        "{v:?} {numerics:?}: {n} tokens in chunks of {chunk} + 1 decoded: max |Δ log-prob| {d:e}"
    );
    assert!(
        d <= MAX_DLOGPROB,
        "{v:?} {numerics:?}: max |Δ log-prob| {d:e} > {MAX_DLOGPROB:e}"
    );
    d
}

/// The published q2 mix under the model's numerics (CI's variant; every
/// other is the ignored test below). 40 tokens in chunks of 23: crosses the
/// 32-token window and completes CSA (4) and HCA (16) windows; the
/// long-context tests below make the indexer choose.
#[test]
fn logits_match_the_cpu_on_the_q2_model() {
    if !have_gpu() {
        return;
    }
    check_prefill_then_decode(Variant::Q2, Numerics::Model, 40, 23);
}

/// Every tiny variant under both numerics: `cargo test --release --test
/// wgpu_e2e -- --ignored` (about 10 minutes on lavapipe; each variant's
/// kernels also have their one-op cases in tests/ops_backends.rs, in CI).
#[test]
#[ignore = "every variant: minutes on lavapipe; run on a GPU or before a stop"]
fn logits_match_the_cpu_on_every_tiny_variant() {
    if !have_gpu() {
        return;
    }
    for v in [Variant::F32, Variant::Q8, Variant::Q2, Variant::Q4] {
        for numerics in [Numerics::Plain, Numerics::Model] {
            check_prefill_then_decode(v, numerics, 40, 23);
        }
    }
    check_prefill_then_decode(Variant::Mxfp4, Numerics::Model, 40, 23);
}

#[test]
fn logits_match_the_cpu_at_every_position() {
    if !have_gpu() {
        return;
    }
    // The output head runs at every position here (the slow part on a CPU
    // emulator), so the prompts are short.
    check_scored(Variant::F32, Numerics::Plain, 12, 5);
    check_scored(Variant::Q2, Numerics::Model, 12, 5);
}

#[test]
fn decode_snapshot_and_greedy_continuation_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    for v in [Variant::Q4] {
        let toks = tokens(41, 8);
        let (head, tail) = toks.split_at(38);
        let mut c = session(v, Numerics::Model, BackendKind::CpuRef, 256, 16);
        let mut g = session(v, Numerics::Model, BackendKind::Wgpu, 256, 16);
        c.sync(head, &mut |_, _| {}).unwrap();
        g.sync(head, &mut |_, _| {}).unwrap();
        let snap = g.save_snapshot().unwrap();
        let worst = common::decode_max_dlogprob(&mut g, &mut c, tail);
        eprintln!("{v:?}: token-by-token decode: max |Δ log-prob| {worst:e}");
        assert!(worst <= MAX_DLOGPROB, "{v:?}: decode {worst:e}");
        // Snapshot taken on the GPU, restored on the GPU, continued.
        let mut r = session(v, Numerics::Model, BackendKind::Wgpu, 256, 16);
        r.load_snapshot(&snap).unwrap();
        for &t in tail {
            r.eval(t).unwrap();
        }
        let d = max_dlogprob(r.logits(), c.logits(), c.n_vocab());
        eprintln!("{v:?}: after snapshot restore: max |Δ log-prob| {d:e}");
        assert!(d <= MAX_DLOGPROB, "{v:?}: restored {d:e}");
        // Greedy continuation from the same state.
        let (mut gc, mut gg) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            let (a, b) = (argmax(c.logits()), argmax(g.logits()));
            gc.push(a);
            gg.push(b);
            c.eval(a).unwrap();
            g.eval(b).unwrap();
        }
        assert_eq!(gc, gg, "{v:?}: greedy continuations differ");
    }
}

#[test]
fn long_context_wraps_the_window_and_indexes_many_rows() {
    if !have_gpu() {
        return;
    }
    // 1100 tokens in chunks of 550: the 32-row window wraps 34 times and the
    // CSA indexer picks 16 of up to 275 compressed rows.
    let toks = tokens(1100, 77);
    let mut c = session(Variant::Q8, Numerics::Model, BackendKind::CpuRef, 1152, 550);
    let mut g = session(Variant::Q8, Numerics::Model, BackendKind::Wgpu, 1152, 550);
    c.sync(&toks, &mut |_, _| {}).unwrap();
    g.sync(&toks, &mut |_, _| {}).unwrap();
    let worst = common::decode_max_dlogprob(&mut g, &mut c, &tokens(2, 5));
    eprintln!("long context (1100 + 2 tokens): max |Δ log-prob| {worst:e}");
    assert!(worst <= MAX_DLOGPROB, "long context: {worst:e}");
    let _ = Arc::strong_count(&tiny_model(Variant::Q8));
}

/// A session on the long-context test model.
fn long_session(backend: BackendKind, ctx: usize, chunk: usize) -> Session {
    let opts = SessionOptions {
        ctx,
        prefill_chunk: chunk,
        numerics: Numerics::Plain,
        backend,
        ..Default::default()
    };
    Session::new(long_context_model(), opts).unwrap_or_else(|e| panic!("{backend:?}: {e}"))
}

/// Issue 16, CI's length: on the long-context model (ratios 0,0,4,128,4,128,
/// window 128, the indexer choosing 64 rows with 4 heads), every position
/// of a 1,024-token prompt: the indexer picks 64 of up to 256 rows, the
/// ratio-128 compressors emit 8 rows, the window wraps 8 times.
#[test]
fn long_context_every_position_matches_the_cpu() {
    long_context_every_position(1024);
}

/// Issue 16 at thousands of tokens: every position of a 3,072-token prompt
/// (the indexer picks 64 of up to 768 rows, the ratio-128 compressors emit
/// 24 rows, the window wraps 24 times): `cargo test --release --test
/// wgpu_e2e -- --ignored` before a stop (about 10 minutes on lavapipe).
#[test]
#[ignore = "3,072 tokens: minutes on lavapipe; run on a GPU or before a stop"]
fn long_context_every_position_at_3072_tokens_matches_the_cpu() {
    long_context_every_position(3072);
}

/// Every position of an `n`-token prompt on the long-context model, scored
/// 256 positions a step (a step's logits for every position must fit one
/// binding on lavapipe).
fn long_context_every_position(n: usize) {
    if !have_gpu() {
        return;
    }
    let step = 256;
    let toks = tokens(n, 16);
    let mut c = long_session(BackendKind::CpuRef, n, step);
    let mut g = long_session(BackendKind::Wgpu, n, step);
    let vocab = c.n_vocab();
    let (mut worst, mut at) = (0f32, 0usize);
    for (i, piece) in toks.chunks(step).enumerate() {
        let want = c.score_more(piece).unwrap();
        let got = g.score_more(piece).unwrap();
        for (j, (x, y)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            let d = max_dlogprob(x, y, vocab);
            if d > worst {
                (worst, at) = (d, i * step + j);
            }
        }
    }
    eprintln!("long-context model, every position of {n} tokens in steps of {step}: max |Δ log-prob| {worst:e} (position {at})");
    assert!(
        worst <= MAX_DLOGPROB,
        "long context: max |Δ log-prob| {worst:e} > {MAX_DLOGPROB:e} at position {at}"
    );
}

/// Issue 16: the same model through the default prefill steps (2,048 tokens,
/// then the remaining 1,024), then two decoded tokens. One step of 2,048
/// tokens makes each compressor emit up to 512 rows in one dispatch list;
/// before the compressor ran in blocks, llvmpipe stopped it after about 490
/// and the step's last rows were never written (docs/VALIDATION.md). Not in
/// CI (minutes on lavapipe; the compressor's 3,100-token one-op cases in
/// tests/ops_backends.rs guard the long steps there): run with `--ignored`.
#[test]
#[ignore]
fn long_context_default_prefill_steps_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    let n = 3072;
    let toks = tokens(n + 2, 17);
    let mut c = long_session(BackendKind::CpuRef, n + 2, 2048);
    let mut g = long_session(BackendKind::Wgpu, n + 2, 2048);
    c.sync(&toks[..n], &mut |_, _| {}).unwrap();
    g.sync(&toks[..n], &mut |_, _| {}).unwrap();
    let worst = common::decode_max_dlogprob(&mut g, &mut c, &toks[n..]);
    eprintln!(
        "long-context model, {n} tokens in steps of 2048 + 2 decoded: max |Δ log-prob| {worst:e}"
    );
    assert!(
        worst <= MAX_DLOGPROB,
        "long context, prefill steps of 2048: max |Δ log-prob| {worst:e} > {MAX_DLOGPROB:e}"
    );
}
