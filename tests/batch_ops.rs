//! One-op tests of the position- and state-dependent twins over batched
//! row tables (issue 18): RoPE, the ring write, attention (window,
//! compressed rows, the indexer's selection), the compressor and the
//! indexer run on a step holding the rows of three sessions at unrelated
//! positions, each with its own state set, and must give every session's
//! rows and state exactly what a step of that session alone gives. Outputs
//! start poisoned (NaN, or −12345 for indices), so a row a twin skips fails.
//! On the reference and the fast CPU backend, wgpu (lavapipe in CI: one
//! bind group per state set, dispatched per session) and, under the `cuda`
//! feature, CUDA (the host emulator in CI).
//! Plus the output head's gather of each session's last row.

mod common;
#[allow(dead_code)]
#[path = "common/oneop.rs"]
mod oneop;
// oneop's CUDA runners need the emulator under the `cuda` feature.
#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

use std::sync::Arc;

use common::rng::Rng;
use oneop::{Builder, Weights};

use ds4::backend::cpu::{fast, CpuBackend};
use ds4::backend::wgpu::WgpuBackend;
use ds4::backend::{Backend, BackendError};
use ds4::gguf::GgufFile;
use ds4::graph::ops::rope::{RopeConfig, Yarn};
use ds4::graph::ops::{attention, compress, gather, indexer, rope, Op};
use ds4::graph::{DType, Graph, RowRecord, StateId, StateLayout, StepParams, ValueId};
use ds4::quant::GgmlType;

/// A one-op graph and, per session, its starting states, its position and
/// its input rows.
struct BatchCase {
    label: String,
    file: Arc<GgufFile>,
    layout: StateLayout,
    graph: Arc<Graph>,
    outputs: Vec<ValueId>,
    sessions: Vec<SessionCase>,
}

struct SessionCase {
    pos0: usize,
    n: usize,
    states: Vec<Vec<f32>>,
    /// (value, this session's rows of it).
    inputs: Vec<(ValueId, Vec<f32>)>,
}

fn backends(file: &Arc<GgufFile>, layout: &StateLayout) -> Vec<(String, Box<dyn Backend>)> {
    let mut v: Vec<(String, Box<dyn Backend>)> = vec![(
        "cpu-ref".into(),
        Box::new(CpuBackend::new(file.clone(), layout.clone())),
    )];
    let isa = fast::Isa::detect();
    if let Some(k) = fast::Kernels::new(isa) {
        v.push((
            format!("cpu {}", isa.name()),
            Box::new(CpuBackend::fast(file.clone(), layout.clone(), k)),
        ));
    }
    for gpu in oneop::gpus() {
        let b = WgpuBackend::new(gpu.clone(), file.clone(), layout.clone()).unwrap();
        v.push((format!("wgpu {}", gpu.shader_variant().name()), Box::new(b)));
    }
    #[cfg(feature = "cuda")]
    if cuda_emu::install().is_ok() {
        let opts = ds4::backend::BackendOptions::default();
        let b = ds4::backend::cuda::CudaBackend::open(file.clone(), layout.clone(), &opts).unwrap();
        v.push(("cuda".into(), Box::new(b)));
    }
    v
}

fn poison(b: &mut dyn Backend, g: &Graph, h: ds4::backend::GraphHandle, outs: &[ValueId]) {
    for &v in outs {
        let d = g.value(v);
        let p = match d.dtype {
            DType::F32 => f32::NAN,
            DType::I32 => -12345.0,
        };
        b.write_value(h, v, &vec![p; d.len()]).unwrap();
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `case` batched (sessions' blocks in `order`) and each session
/// alone; compares rows and states bit for bit.
fn check(case: &BatchCase, order: &[usize]) {
    for (name, mut b) in backends(&case.file, &case.layout) {
        let s_n = case.sessions.len();
        b.set_state_sets(s_n).unwrap();
        assert_eq!(b.state_sets(), s_n);
        let h = b.load_graph(case.graph.clone()).unwrap();
        for (set, s) in case.sessions.iter().enumerate() {
            for (i, st) in s.states.iter().enumerate() {
                b.write_set_rows(set, StateId(i as u32), 0, st).unwrap();
            }
        }
        // Row table and stacked inputs in `order`.
        let mut table = Vec::new();
        let mut row0 = vec![0usize; s_n];
        for &si in order {
            let s = &case.sessions[si];
            row0[si] = table.len();
            table.extend((0..s.n).map(|t| RowRecord {
                pos: (s.pos0 + t) as u32,
                state: si as u32,
            }));
        }
        let n_inputs = case.sessions[0].inputs.len();
        for k in 0..n_inputs {
            let v = case.sessions[0].inputs[k].0;
            let mut data = Vec::new();
            for &si in order {
                data.extend_from_slice(&case.sessions[si].inputs[k].1);
            }
            b.write_value(h, v, &data).unwrap();
        }
        poison(b.as_mut(), &case.graph, h, &case.outputs);
        let tokens = vec![0u32; table.len()];
        b.run_rows(h, &tokens, &table).unwrap();
        let batched: Vec<Vec<f32>> = case
            .outputs
            .iter()
            .map(|&v| b.read_value(h, v).unwrap())
            .collect();
        for (si, s) in case.sessions.iter().enumerate() {
            let mut alone = backends(&case.file, &case.layout)
                .into_iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1;
            let ha = alone.load_graph(case.graph.clone()).unwrap();
            for (i, st) in s.states.iter().enumerate() {
                alone.write_state(StateId(i as u32), st).unwrap();
            }
            for (v, data) in &s.inputs {
                alone.write_value(ha, *v, data).unwrap();
            }
            poison(alone.as_mut(), &case.graph, ha, &case.outputs);
            alone
                .run(
                    ha,
                    &vec![0; s.n],
                    StepParams {
                        pos0: s.pos0,
                        n_tokens: s.n,
                    },
                )
                .unwrap();
            for (k, &v) in case.outputs.iter().enumerate() {
                let want = alone.read_value(ha, v).unwrap();
                let cols = case.graph.value(v).cols;
                let got = &batched[k][row0[si] * cols..(row0[si] + s.n) * cols];
                assert!(
                    got.iter().all(|x| x.is_finite() && *x != -12345.0),
                    "{name} {}: session {si} rows not all written",
                    case.label
                );
                assert_eq!(
                    bits(got),
                    bits(&want),
                    "{name} {}: session {si} output differs from its step alone",
                    case.label
                );
            }
            for i in 0..s.states.len() {
                let st = StateId(i as u32);
                let rows = case.layout.get(st).rows;
                let got = b.read_set_rows(si, st, 0..rows).unwrap();
                let want = alone.read_state(st).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{name} {}: session {si} state {i} differs",
                    case.label
                );
            }
        }
    }
}

/// Three sessions: (pos0, rows). Positions far apart, one decode row.
const SESSIONS: [(usize, usize); 3] = [(0, 3), (37, 1), (130, 5)];

/// Checks `graph` (its states laid out as `layout`) with one session per
/// entry of [`SESSIONS`], drawn by `session(pos0, n)`, in [`ORDER`].
fn check_sessions(
    label: String,
    file: Arc<GgufFile>,
    layout: StateLayout,
    graph: Graph,
    outputs: Vec<ValueId>,
    mut session: impl FnMut(usize, usize) -> SessionCase,
) {
    let sessions = SESSIONS.iter().map(|&(pos0, n)| session(pos0, n)).collect();
    check(
        &BatchCase {
            label,
            file,
            layout,
            graph: Arc::new(graph),
            outputs,
            sessions,
        },
        &ORDER,
    );
}
const ORDER: [usize; 3] = [2, 0, 1];

fn rope_config() -> RopeConfig {
    RopeConfig {
        base: 10000.0,
        yarn: Some(Yarn {
            factor: 16.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
        n_rot: 16,
    }
}

fn total() -> usize {
    SESSIONS.iter().map(|s| s.1).sum()
}

#[test]
fn rope_and_ring_write_per_session() {
    let mut rng = Rng(0xB1);
    let (heads, hd, window) = (2usize, 32usize, 8usize);
    let (f, _) = Weights::default().build();
    let mut b = Builder::new(total(), total());
    let x = b.rec.tokens_f32("x", heads * hd);
    let out = b.rec.tokens_f32("out", heads * hd);
    let op = Op::Rope(rope::Rope {
        x,
        out,
        heads,
        head_dim: hd,
        rope: rope_config(),
        inverse: false,
    });
    b.rec.op(op);
    let ring = b.state("ring", window, hd, vec![0.0; window * hd]);
    let kv = b.rec.tokens_f32("kv", hd);
    b.rec.op(Op::RingWrite(attention::RingWrite {
        kv,
        ring,
        window,
        dim: hd,
    }));
    // Inputs kept: two ops in one graph must not share their input slots.
    let graph = b.rec.finish(b.tokens, out, vec![out, x, kv]);
    check_sessions(
        "rope + ring_write".into(),
        f,
        b.layout,
        graph,
        vec![out],
        |pos0, n| SessionCase {
            pos0,
            n,
            states: vec![rng.scaled(window * hd, 1.0)],
            inputs: vec![
                (x, rng.scaled(n * heads * hd, 1.0)),
                (kv, rng.scaled(n * hd, 1.0)),
            ],
        },
    );
}

#[test]
fn attention_per_session() {
    let mut rng = Rng(0xB2);
    let (nh, hd, window, ratio, top_k) = (3usize, 32usize, 8usize, 4usize, 5usize);
    for selected in [false, true] {
        let mut w = Weights::default();
        w.random(&mut rng, "sinks", &[nh], GgmlType::F32, 2.0);
        let (f, r) = w.build();
        let mut b = Builder::new(total(), total());
        let cap = 64;
        let ring = b.state("ring", window, hd, vec![0.0; window * hd]);
        let comp = b.state("comp", cap, hd, vec![0.0; cap * hd]);
        let q = b.rec.tokens_f32("q", nh * hd);
        let kv = b.rec.tokens_f32("kv", hd);
        let out = b.rec.tokens_f32("out", nh * hd);
        let sel = selected.then(|| b.rec.tokens_i32("sel", top_k));
        b.rec.op(Op::Attention(attention::Attention {
            q,
            kv,
            ring,
            window,
            block: false,
            compressed: Some(attention::CompressedRows { rows: comp, ratio }),
            selected: sel,
            top_k,
            sinks: r[0].clone(),
            n_head: nh,
            head_dim: hd,
            out,
        }));
        let graph = b.rec.finish(b.tokens, out, vec![out]);
        check_sessions(
            format!("attention selected {selected}"),
            f,
            b.layout,
            graph,
            vec![out],
            |pos0, n| {
                let mut inputs = vec![
                    (q, rng.scaled(n * nh * hd, 1.0)),
                    (kv, rng.scaled(n * hd, 1.0)),
                ];
                if let Some(s) = sel {
                    let v = rng.selection(n * top_k, cap);
                    inputs.push((s, v));
                }
                SessionCase {
                    pos0,
                    n,
                    states: vec![rng.scaled(window * hd, 1.0), rng.scaled(cap * hd, 1.0)],
                    inputs,
                }
            },
        );
    }
}

#[test]
fn compressor_per_session() {
    let mut rng = Rng(0xB3);
    for (ratio, hd, overlapped, rounding) in [
        (4usize, 32usize, true, compress::RowRounding::Fp8F16),
        (16, 32, false, compress::RowRounding::None),
        (4, 64, true, compress::RowRounding::HadamardFp4F16),
    ] {
        let width = if overlapped { 2 * hd } else { hd };
        let slots = if overlapped { 2 * ratio } else { ratio };
        let (f, r) = Weights::compressor(&mut rng, ratio, width, hd).build();
        let mut b = Builder::new(total(), total());
        let cap = 64;
        let state_kv = b.state("ckv", slots, width, vec![0.0; slots * width]);
        let state_score = b.state("cscore", slots, width, vec![0.0; slots * width]);
        let rows = b.state("crows", cap, hd, vec![0.0; cap * hd]);
        let kv = b.rec.tokens_f32("kv", width);
        let gate = b.rec.tokens_f32("gate", width);
        b.rec.op(Op::Compress(compress::Compress {
            kv,
            gate,
            ape: r[0].clone(),
            norm: r[1].clone(),
            state_kv,
            state_score,
            rows,
            ratio,
            head_dim: hd,
            overlapped,
            rope: rope_config(),
            rounding,
            eps: 1e-6,
        }));
        let graph = b.rec.finish(b.tokens, kv, vec![]);
        check_sessions(
            format!("compress r{ratio} ov {overlapped}"),
            f,
            b.layout,
            graph,
            vec![],
            |pos0, n| {
                let mut score = rng.scaled(slots * width, 2.0);
                for s in score.iter_mut().step_by(3) {
                    *s = compress::EMPTY_SCORE;
                }
                SessionCase {
                    pos0,
                    n,
                    states: vec![
                        rng.scaled(slots * width, 1.0),
                        score,
                        rng.scaled(cap * hd, 1.0),
                    ],
                    inputs: vec![
                        (kv, rng.scaled(n * width, 1.0)),
                        (gate, rng.scaled(n * width, 2.0)),
                    ],
                }
            },
        );
    }
}

#[test]
fn indexer_per_session() {
    let mut rng = Rng(0xB4);
    let (ratio, top_k, nh, hd) = (4usize, 5usize, 3usize, 32usize);
    let (f, _) = Weights::default().build();
    let mut b = Builder::new(total(), total());
    let cap = 64;
    let rows = b.state("krows", cap, hd, vec![0.0; cap * hd]);
    let q = b.rec.tokens_f32("q", nh * hd);
    let wts = b.rec.tokens_f32("w", nh);
    let out = b.rec.tokens_i32("sel", top_k);
    b.rec.op(Op::IndexerTopK(indexer::IndexerTopK {
        q,
        weights: wts,
        rows,
        ratio,
        top_k,
        n_head: nh,
        head_dim: hd,
        out,
    }));
    let graph = b.rec.finish(b.tokens, out, vec![out]);
    check_sessions(
        "indexer".into(),
        f,
        b.layout,
        graph,
        vec![out],
        |pos0, n| SessionCase {
            pos0,
            n,
            states: vec![rng.scaled(cap * hd, 1.0)],
            inputs: vec![
                (q, rng.scaled(n * nh * hd, 1.0)),
                (wts, rng.scaled(n * nh, 1.0)),
            ],
        },
    );
}

/// Row tables a step cannot take are refused before anything runs.
#[test]
fn bad_row_tables_are_refused() {
    let (f, _) = Weights::default().build();
    let mut b = Builder::new(4, 4);
    let ring = b.state("ring", 8, 4, vec![0.0; 32]);
    let kv = b.rec.tokens_f32("kv", 4);
    b.rec.op(Op::RingWrite(attention::RingWrite {
        kv,
        ring,
        window: 8,
        dim: 4,
    }));
    let graph = Arc::new(b.rec.finish(b.tokens, kv, vec![]));
    let r = |pos: u32, state: u32| RowRecord { pos, state };
    for (name, mut be) in backends(&f, &b.layout) {
        be.set_state_sets(2).unwrap();
        let h = be.load_graph(graph.clone()).unwrap();
        for table in [
            vec![r(0, 0), r(2, 0)],          // a gap in one session
            vec![r(3, 0), r(2, 0)],          // out of order
            vec![r(0, 0), r(0, 1), r(1, 0)], // two blocks of one session
            vec![r(0, 2)],                   // no such state set
        ] {
            let e = be
                .run_rows(h, &vec![0; table.len()], &table)
                .expect_err(&format!("{name}: {table:?}"));
            assert!(matches!(e, BackendError::BadRows(_)), "{name}: {e}");
        }
        assert!(matches!(
            be.run_rows(h, &[0; 5], &[r(0, 0); 5]),
            Err(BackendError::BadStep { .. })
        ));
    }
}

/// The output head's gather (`GatherLast`, issue 18): seeded random steps
/// of up to four sessions (random subsets, orders, piece lengths and
/// positions) put each session's last row in its state's row and zeros in
/// the rows of states the step does not hold, bit for bit, on the CPU
/// backends and on every wgpu adapter that holds several state sets.
#[test]
fn gather_last_per_session() {
    let mut rng = Rng(0x6A7);
    let (states, cols) = (4usize, 37usize);
    let (f, _) = Weights::default().build();
    let cap = 4 * 9;
    let mut b = Builder::new(cap, cap);
    let x = b.rec.tokens_f32("x", cols);
    let out = b.rec.fixed_f32("out", states, cols);
    b.rec.op(Op::GatherLast(gather::GatherLast {
        x,
        out,
        cols,
        states,
    }));
    let graph = Arc::new(b.rec.finish(b.tokens, out, vec![x]));
    let mut all = backends(&f, &b.layout);
    for gpu in oneop::gpus() {
        let mut w = WgpuBackend::new(gpu, f.clone(), b.layout.clone()).unwrap();
        if w.set_state_sets(states).is_ok() {
            all.push(("wgpu".into(), Box::new(w)));
        }
    }
    for (name, be) in &mut all {
        be.set_state_sets(states).unwrap();
        let h = be.load_graph(graph.clone()).unwrap();
        for round in 0..40 {
            // A random subset of the states in a random order.
            let mut order: Vec<usize> = (0..states).collect();
            for i in (1..states).rev() {
                order.swap(i, rng.below(i + 1));
            }
            order.truncate(1 + rng.below(states));
            let mut table = Vec::new();
            for &s in &order {
                let pos0 = rng.below(500) as u32;
                let n = 1 + rng.below(9) as u32;
                table.extend((0..n).map(|t| RowRecord {
                    pos: pos0 + t,
                    state: s as u32,
                }));
            }
            let input = rng.scaled(table.len() * cols, 3.0);
            be.write_value(h, x, &input).unwrap();
            be.write_value(h, out, &vec![f32::NAN; states * cols])
                .unwrap();
            be.run_rows(h, &vec![0; table.len()], &table).unwrap();
            let got = be.read_value(h, out).unwrap();
            for s in 0..states {
                let want = match table.iter().rposition(|r| r.state as usize == s) {
                    Some(t) => input[t * cols..(t + 1) * cols].to_vec(),
                    None => vec![0.0; cols],
                };
                assert_eq!(
                    bits(&got[s * cols..(s + 1) * cols]),
                    bits(&want),
                    "{name} round {round}: state {s} of {table:?}"
                );
            }
        }
    }
}
