//! Batch invariance on the GPU backends (issue 18): wgpu (lavapipe in CI)
//! and, under the `cuda` feature, CUDA (the host emulator of tests/cuda_emu
//! in CI). 1, 2, 4 and 8 sessions of different prompts, lengths and start
//! steps share steps (prefill pieces beside decode rows at other
//! positions); each session's logits after every piece, and every row's
//! where a piece asks for them, must equal its serial run (a one-slot
//! batch, the same pieces) bit for bit on the same backend.
//!
//! The serial runs are made once per session on one reused one-slot batch
//! (reset between sessions), so the cost is five batches per backend.

mod common;
// The CUDA emulator (tests/cuda_emu) under the `cuda` feature.
#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

use std::sync::Arc;

use common::{tiny_model, tokens};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::session::{Batch, SessionOptions, SlotWork};
use ds4::testmodel::Variant;

/// One session of a schedule: its tokens, the step it starts at, and its
/// pieces (a prefill cut into quanta, then one token per step).
struct Plan {
    tokens: Vec<u32>,
    start: usize,
    pieces: Vec<(usize, usize)>,
    /// Pieces that ask for every row's logits.
    all_logits: Vec<bool>,
}

fn plan(seed: u64, prompt: usize, decode: usize, start: usize, quantum: usize) -> Plan {
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
    // The second piece of every session keeps all its rows' logits.
    let all_logits = (0..pieces.len()).map(|i| i == 1).collect();
    Plan {
        tokens,
        start,
        pieces,
        all_logits,
    }
}

/// The eight sessions: prompts of 3 to 94 tokens (the longest reach
/// position 96, where the indexer selects 16 of 24 compressed rows), 2 or
/// 3 decode steps, starts 0 to 2, quanta of 17 to 20 tokens.
fn plans() -> Vec<Plan> {
    (0..8)
        .map(|i| plan(11 + i as u64, 3 + 13 * i, 2 + i % 2, i % 3, 17 + i % 4))
        .collect()
}

/// What a session saw: after each piece, its last-row logits and (when
/// asked) every row's.
type Trace = Vec<(Vec<f32>, Vec<f32>)>;

fn options(backend: BackendKind) -> SessionOptions {
    SessionOptions {
        ctx: 128,
        prefill_chunk: 64,
        numerics: Numerics::Model,
        backend,
        backend_options: BackendOptions::default(),
        ..Default::default()
    }
}

/// Runs `plans` on slots `0..plans.len()` of `b`, piece `k` of a session
/// at step `start + k` (so steps mix prefill pieces and decode rows).
fn run(b: &mut Batch, plans: &[&Plan]) -> Vec<Trace> {
    let mut traces: Vec<Trace> = vec![Vec::new(); plans.len()];
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
                    all_logits: p.all_logits[next[i]],
                }
            })
            .collect();
        if !work.is_empty() {
            b.step(&work).unwrap();
            for w in &work {
                traces[w.slot].push((b.logits(w.slot).to_vec(), b.piece_logits(w.slot).to_vec()));
                next[w.slot] += 1;
            }
        }
        step += 1;
    }
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(b.tokens(i), &p.tokens[..], "slot {i} holds its tokens");
    }
    traces
}

fn same(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits())
}

/// The CUDA emulator's schedule (CI): four sessions, prompts of 3 to 39
/// tokens (the longest crosses the 32-token window), 2 or 3 decode steps,
/// starts 0 to 2, quanta of 9 to 12 tokens, so steps still mix prefill
/// pieces of different lengths with decode rows at other positions.
fn small_plans() -> Vec<Plan> {
    (0..4)
        .map(|i| plan(11 + i as u64, 3 + 12 * i, 2 + i % 2, i % 3, 9 + i % 4))
        .collect()
}

/// Every session's serial run, then the first `n` of them together for
/// each `n` of `batches`, on `backend`.
fn check_backend(model: Arc<ModelFile>, backend: BackendKind, plans: &[Plan], batches: &[usize]) {
    let opts = options(backend);
    let mut one = Batch::new(model.clone(), opts.clone(), 1).unwrap();
    let serial: Vec<Trace> = plans
        .iter()
        .map(|p| {
            one.reset(0);
            run(&mut one, &[p]).remove(0)
        })
        .collect();
    for &n in batches {
        let mut b = Batch::new(model.clone(), opts.clone(), n).unwrap();
        // A state set per slot: one pass for all slots, not one per slot.
        assert!(
            b.backend_notice().ends_with("batched steps)"),
            "{}",
            b.backend_notice()
        );
        let mine: Vec<&Plan> = plans[..n].iter().collect();
        let together = run(&mut b, &mine);
        for (i, p) in mine.iter().enumerate() {
            assert_eq!(together[i].len(), serial[i].len());
            for (k, (a, s)) in together[i].iter().zip(&serial[i]).enumerate() {
                assert!(!a.0.is_empty(), "slot {i} piece {k} has logits");
                assert!(
                    a.0.iter().all(|x| x.is_finite()),
                    "slot {i} piece {k} finite"
                );
                assert!(
                    same(&a.0, &s.0),
                    "{backend:?}: slot {i} of {n}, piece {k}: logits differ from the serial run \
                     (max |d| {})",
                    common::max_abs_diff(&a.0, &s.0)
                );
                assert!(
                    same(&a.1, &s.1),
                    "{backend:?}: slot {i} of {n}, piece {k}: per-row logits differ from the \
                     serial run"
                );
                if p.all_logits[k] {
                    let rows = p.pieces[k].1 - p.pieces[k].0;
                    let v = model.config.n_vocab;
                    assert_eq!(a.1.len(), rows * v);
                    assert!(
                        same(&a.1[(rows - 1) * v..], &a.0),
                        "last row of the piece = logits"
                    );
                }
            }
        }
    }
}

/// Whether a wgpu adapter opens (lavapipe in CI, where its absence fails).
fn wgpu_opens() -> bool {
    match ds4::backend::wgpu::Gpu::shared(&BackendOptions::default(), true) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI: no wgpu adapter: {e}"),
        Err(e) => {
            eprintln!("skipping wgpu: {e}");
            false
        }
    }
}

#[test]
fn wgpu_sessions_are_batch_invariant() {
    if wgpu_opens() {
        check_backend(
            tiny_model(Variant::Q8),
            BackendKind::Wgpu,
            &small_plans(),
            &[1, 2, 4],
        );
    }
}

/// The full schedule on wgpu (8 sessions, prompts up to 94 tokens):
/// `cargo test --release --test batch_gpu -- --ignored`. Ignored by
/// default: about 3 minutes on lavapipe, where CI runs the small schedule
/// above (the same checks, fewer and shorter sessions).
#[test]
#[ignore = "the full schedule: minutes on lavapipe; run on a GPU or before a stop"]
fn wgpu_sessions_are_batch_invariant_full_schedule() {
    if wgpu_opens() {
        check_backend(
            tiny_model(Variant::Q8),
            BackendKind::Wgpu,
            &plans(),
            &[1, 2, 4, 8],
        );
    }
}

/// A row table the backend cannot run (a session's rows not consecutive)
/// is refused before anything runs, on a backend holding state sets.
#[test]
fn wgpu_refuses_bad_row_tables() {
    use ds4::backend::BackendError;
    use ds4::graph::RowRecord;
    if !wgpu_opens() {
        return;
    }
    let model = tiny_model(Variant::Q8);
    let opts = options(BackendKind::Wgpu);
    let kv = ds4::model::state::KvLayout::new(&model.config, &model.weights, opts.ctx);
    let opened = ds4::backend::open(
        BackendKind::Wgpu,
        model.clone(),
        kv.layout.clone(),
        &opts.backend_options,
    )
    .unwrap();
    let mut b = opened.backend;
    b.set_state_sets(2).unwrap();
    assert_eq!(b.state_sets(), 2);
    let fo = ds4::model::forward::ForwardOptions {
        numerics: Numerics::Model,
        logits: ds4::model::logits::Logits::All,
        keep: Vec::new(),
    };
    let g = ds4::model::forward::record(&model.config, &model.weights, &kv, 4, &fo);
    let h = b.load_graph(Arc::new(g)).unwrap();
    let r = |pos: u32, state: u32| RowRecord { pos, state };
    for table in [
        vec![r(0, 0), r(2, 0)],
        vec![r(0, 0), r(0, 1), r(1, 0)],
        vec![r(0, 2)],
    ] {
        let e = b.run_rows(h, &vec![1; table.len()], &table).unwrap_err();
        assert!(matches!(e, BackendError::BadRows(_)), "{table:?}: {e}");
    }
    assert!(b.reset_set(2).is_err());
    assert!(b.read_set_rows(2, ds4::graph::StateId(0), 0..1).is_err());
}

/// Whether the CUDA driver, or else the emulator of tests/cuda_emu, opens
/// (with `CI` set, its absence fails).
#[cfg(feature = "cuda")]
fn cuda_opens() -> bool {
    match cuda_emu::install() {
        Ok(d) => {
            eprintln!("cuda on {d}");
            true
        }
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI: no CUDA driver or emulator: {e}"),
        Err(e) => {
            eprintln!("skipping cuda: {e}");
            false
        }
    }
}

/// The reduced schedule on CUDA (CI, on the emulator): 1, 2 and 4 sessions
/// of `small_plans`, bit for bit against their serial runs.
#[cfg(feature = "cuda")]
#[test]
fn cuda_sessions_are_batch_invariant() {
    if cuda_opens() {
        check_backend(
            tiny_model(Variant::Q8),
            BackendKind::Cuda,
            &small_plans(),
            &[1, 2, 4],
        );
    }
}

/// The full schedule on CUDA (8 sessions, prompts up to 94 tokens):
/// `cargo test --release --features cuda --test batch_gpu -- --ignored`.
/// Ignored by default: about 7 minutes of CPU on the emulator, 4x the
/// reduced schedule (it passed there on 2026-11-27; docs/ARCHITECTURE.md).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "the full schedule: minutes on the CUDA host emulator; run on a GPU or by hand"]
fn cuda_sessions_are_batch_invariant_full_schedule() {
    if cuda_opens() {
        check_backend(
            tiny_model(Variant::Q8),
            BackendKind::Cuda,
            &plans(),
            &[1, 2, 4, 8],
        );
    }
}
