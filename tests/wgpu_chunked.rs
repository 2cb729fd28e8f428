//! State buffers larger than one binding: the wgpu backend splits a state
//! into chunks of whole rows, one binding each (docs/ARCHITECTURE.md,
//! "Chunked state bindings"). Here the chunk size is capped far below the
//! device's limit (`BackendOptions::state_chunk_cap`) so that the tiny models' cached
//! rows span several chunks, and
//! - row-range reads and writes across chunk boundaries round-trip exactly;
//! - logits equal the CPU's after a chunked prefill and at every decoded
//!   position, with compressed and indexer rows in several chunks;
//! - a snapshot saved from chunked state restores on the GPU and on the CPU;
//!
//! each with the cached rows stored as f16 (where the adapter has
//! shader-f16, as lavapipe does) and with f32 storage forced
//! (`BackendOptions::kv_f32`).

mod common;

use common::rng::Rng;
use common::{tiny_model, tokens};

use ds4::backend::wgpu::{Gpu, WgpuBackend};
use ds4::backend::{Backend, BackendKind, BackendOptions, WeightFile};
use ds4::graph::{StateId, StateLayout};
use ds4::model::forward::Numerics;
use ds4::model::state::KvLayout;
use ds4::session::Session;
use ds4::testmodel::Variant;

/// Same bound as tests/wgpu_e2e.rs (docs/VALIDATION.md).
const MAX_DLOGPROB: f32 = 2e-3;

/// Bytes per state chunk: the tiny model's ring (32 rows of 80 f32) still
/// fits one binding, its compressed rows (ctx/4 rows of 80) and indexer
/// rows (of 32) do not.
const CAP: u64 = 32 * 80 * 4;

/// The environment's options with the chunk cap, and the cached rows
/// stored as f16 where the device allows (`f16`) or always as f32.
fn options(f16: bool) -> BackendOptions {
    BackendOptions {
        state_chunk_cap: Some(CAP),
        kv_f32: !f16,
        ..BackendOptions::from_env()
    }
}

fn gpu() -> Option<std::sync::Arc<Gpu>> {
    common::shared_gpu()
}

/// Whether the device can store f16 rows.
fn has_f16(gpu: &Gpu) -> bool {
    gpu.features.contains(wgpu::Features::SHADER_F16)
}

fn session(backend: BackendKind, ctx: usize, chunk: usize, f16: bool) -> Session {
    common::session_with(
        Variant::Q8,
        Numerics::Model,
        backend,
        ctx,
        chunk,
        options(f16),
    )
}

/// Max |Δ log-prob| of one row of logits.
fn max_dlogprob(a: &[f32], b: &[f32]) -> f32 {
    common::max_dlogprob(a, b, a.len())
}

#[test]
fn state_rows_round_trip_across_chunk_boundaries() {
    let Some(gpu) = gpu() else { return };
    for f16 in [false, true] {
        round_trip(gpu.clone(), f16, f16 && has_f16(&gpu));
    }
}

/// Row-range I/O of chunked states; `allow_f16`: f16 storage allowed;
/// `f16`: an f16-valued state is stored as f16.
fn round_trip(gpu: std::sync::Arc<Gpu>, allow_f16: bool, f16: bool) {
    // Rows of 182 f32 values (728 bytes) or 362 f16 values (724 bytes): CAP
    // holds 14 whole rows, so 100 rows span 8 chunks (the most a kernel
    // binds), the last one of 2 rows. Both states hold only f16 values.
    let cols = if f16 { 362 } else { 182 };
    let mut layout = StateLayout::default();
    let wide = layout.add("wide", None, 100, cols, 0.5);
    let narrow = layout.add("narrow", None, 3, 7, -1.0);
    layout.mark_f16_values(wide);
    // Odd rows are not whole u32 words of f16: stored as f32.
    layout.mark_f16_values(narrow);
    let file: WeightFile = tiny_model(Variant::F32);
    let mut b = WgpuBackend::with_options(gpu, file, layout, &options(allow_f16)).unwrap();
    assert_eq!(b.state_is_f16(wide), f16);
    assert!(!b.state_is_f16(narrow));
    assert_eq!(b.state_chunks(wide), 8);
    // Fresh state holds the init value everywhere, across every chunk.
    assert!(b
        .read_state_rows(wide, 0..100)
        .unwrap()
        .iter()
        .all(|&x| x == 0.5));
    assert!(b
        .read_state_rows(narrow, 0..3)
        .unwrap()
        .iter()
        .all(|&x| x == -1.0));
    let mut rng = Rng(7 + f16 as u64);
    let mut want = vec![0.5f32; 100 * cols];
    // Ranges that start, end and lie inside chunks, and span several.
    for (first, n) in [
        (0, 1),
        (13, 2),
        (14, 1),
        (5, 40),
        (27, 29),
        (99, 1),
        (0, 100),
        (41, 3),
    ] {
        // f16-valued states receive f16 values (exact either way).
        let data: Vec<f32> = (0..n * cols)
            .map(|_| half::f16::from_f32(rng.f()).to_f32())
            .collect();
        b.write_state_rows(wide, first, &data).unwrap();
        want[first * cols..(first + n) * cols].copy_from_slice(&data);
        for (r0, r1) in [
            (0, 100),
            (first, first + n),
            (first.saturating_sub(3), (first + n + 2).min(100)),
        ] {
            let got = b.read_state_rows(wide, r0..r1).unwrap();
            assert_eq!(
                got,
                want[r0 * cols..r1 * cols],
                "rows {r0}..{r1} after writing {first}+{n}"
            );
        }
    }
    // Out-of-range requests are errors, not panics.
    assert!(b.read_state_rows(wide, 90..101).is_err());
    assert!(b.write_state_rows(wide, 99, &vec![0.0; 2 * cols]).is_err());
    assert!(b.write_state_rows(wide, 0, &[0.0; 5]).is_err());
    // Reset restores every chunk.
    b.reset_states();
    assert!(b
        .read_state_rows(wide, 0..100)
        .unwrap()
        .iter()
        .all(|&x| x == 0.5));
    // A state that needs more chunks than a kernel binds is refused clearly.
    let mut big = StateLayout::default();
    let _: StateId = big.add("too big", Some(3), 1000, cols, 0.0);
    let err = WgpuBackend::with_options(
        Gpu::shared(&BackendOptions::from_env(), true).unwrap(),
        tiny_model(Variant::F32),
        big,
        &options(allow_f16),
    )
    .err()
    .expect("a state of 72 chunks is refused");
    let msg = err.to_string();
    assert!(msg.contains("too big") && msg.contains("--ctx"), "{msg}");
}

#[test]
fn logits_and_snapshots_match_the_cpu_with_state_in_chunks() {
    chunked_state_matches_the_cpu(&[true]);
}

/// The same with f32 state storage (f16 off): `cargo test --release --test
/// wgpu_chunked -- --ignored` (about a minute and a half on lavapipe; CI
/// runs the f16 storage GPUs use, whose chunk boundaries differ).
#[test]
#[ignore = "the second storage type on lavapipe; run on a GPU or before a stop"]
fn logits_and_snapshots_match_the_cpu_with_f32_state_in_chunks() {
    chunked_state_matches_the_cpu(&[false]);
}

/// Logits after a 540-token prefill and 5 decoded tokens, and snapshots
/// restored on the GPU and the CPU, with the state stored in chunks (f16
/// storage when `storage` holds `true`, f32 when `false`).
fn chunked_state_matches_the_cpu(storage: &[bool]) {
    let Some(gpu) = gpu() else { return };
    // ctx 576: 146 CSA rows of 80 (f32: 32 per chunk, 5 chunks; f16: 64
    // per chunk, 3 chunks), 38 HCA rows (f32: 2 chunks), 146 indexer rows of
    // 32 (f32: 2 chunks). 540 tokens fill 135 CSA rows, 33 HCA rows and 135
    // indexer rows, so with f32 storage every kind is written and read across
    // a chunk boundary, with f16 storage the CSA rows. The indexer's score
    // scratch (146 scores per token) holds 17 tokens under the same cap, so
    // a 200-token chunk runs the indexer in 12 blocks.
    let (ctx, chunk) = (576, 200);
    let model = tiny_model(Variant::Q8);
    let mut kv = KvLayout::new(&model.config, &model.weights, ctx);
    kv.mark_f16_rows();
    for f16 in [true, false] {
        let b =
            WgpuBackend::with_options(gpu.clone(), model.clone(), kv.layout.clone(), &options(f16))
                .unwrap();
        let want_f16 = f16 && has_f16(&gpu);
        for l in &kv.layers {
            assert_eq!(b.state_is_f16(l.ring), want_f16);
            for c in [l.compressor, l.indexer].into_iter().flatten() {
                assert_eq!(b.state_is_f16(c.rows), want_f16);
                assert!(!b.state_is_f16(c.kv) && !b.state_is_f16(c.score));
            }
            if let (Some(c), Some(_)) = (l.compressor, l.indexer) {
                assert!(b.state_chunks(c.rows) >= 3, "CSA rows in too few chunks");
            }
        }
    }

    let toks = tokens(545, 13);
    let (head, tail) = toks.split_at(540);
    // The CPU reference once: logits after the prefill and after each
    // decoded token.
    let mut c = session(BackendKind::CpuRef, ctx, chunk, true);
    c.sync(head, &mut |_, _| {}).unwrap();
    let mut want = vec![c.logits().to_vec()];
    for &t in tail {
        c.eval(t).unwrap();
        want.push(c.logits().to_vec());
    }
    for &f16 in storage {
        let storage = if f16 && has_f16(&gpu) { "f16" } else { "f32" };
        let mut g = session(BackendKind::Wgpu, ctx, chunk, f16);
        g.sync(head, &mut |_, _| {}).unwrap();
        let snap = g.save_snapshot().unwrap();
        let mut worst = max_dlogprob(g.logits(), &want[0]);
        for (&t, w) in tail.iter().zip(&want[1..]) {
            g.eval(t).unwrap();
            worst = worst.max(max_dlogprob(g.logits(), w));
        }
        eprintln!("chunked {storage} state: 540 prefilled + 5 decoded: max |Δ log-prob| {worst:e}");
        assert!(worst <= MAX_DLOGPROB, "chunked {storage} state: {worst:e}");
        // The snapshot of chunked GPU state restores on the GPU and on the
        // CPU (same byte format) and continues like the CPU session did.
        for backend in [BackendKind::Wgpu, BackendKind::CpuRef] {
            let mut r = session(backend, ctx, chunk, f16);
            r.load_snapshot(&snap).unwrap();
            let mut d = 0.0f32;
            for (&t, w) in tail.iter().zip(&want[1..]) {
                r.eval(t).unwrap();
                d = d.max(max_dlogprob(r.logits(), w));
            }
            eprintln!(
                "snapshot of chunked {storage} state restored on {backend:?}: max |Δ log-prob| {d:e}"
            );
            assert!(
                d <= MAX_DLOGPROB,
                "{storage}: restored on {backend:?}: {d:e}"
            );
        }
    }
}
