//! The cross-backend one-op suite: every op of `Op` is recorded alone
//! through `Recorder`, fed seeded random inputs (weights made with the real
//! quantizers) and random state, its outputs poisoned with NaN, run on every
//! backend present and compared with the CPU twin under the per-op
//! tolerance of the harness (tests/common/oneop.rs). Sizes include 1, odd widths and widths that are not a
//! multiple of the 256-thread workgroup.
//!
//! With `CI` set, a missing wgpu adapter fails the suite instead of
//! skipping it.

mod common;
#[path = "common/oneop.rs"]
mod oneop;

use common::rng::Rng;
use oneop::*;

use ds4::backend::cpu::CpuBackend;
use ds4::backend::wgpu::{RowRecord, WgpuBackend};
use ds4::backend::Backend;
use ds4::graph::ops::rope::{RopeConfig, Yarn};
use ds4::graph::ops::{
    attention, basic, compress, gather, hc, indexer, matmul, moe, norm, rope, round, Op,
};
use ds4::graph::StepParams;
use ds4::quant::GgmlType;

// ---------------------------------------------------------------- cases

fn elementwise_cases() -> Vec<Case> {
    let mut rng = Rng(0xE1E1);
    let mut out = Vec::new();
    for &(cols, n) in &[(1usize, 1usize), (7, 3), (300, 5)] {
        // add
        let mut b = Builder::new(6, n);
        let (x, y, o) = (
            b.rec.tokens_f32("a", cols),
            b.rec.tokens_f32("b", cols),
            b.rec.tokens_f32("out", cols),
        );
        let inputs = vec![
            (x, rng.scaled(n * cols, 3.0)),
            (y, rng.scaled(n * cols, 3.0)),
        ];
        let (f, _) = Weights::default().build();
        out.push(b.finish(
            format!("add {cols}×{n}"),
            f,
            Op::Add(basic::Add {
                a: x,
                b: y,
                out: o,
                cols,
            }),
            inputs,
            vec![],
            0,
        ));
        // scale
        let mut b = Builder::new(6, n);
        let (x, o) = (b.rec.tokens_f32("x", cols), b.rec.tokens_f32("out", cols));
        let inputs = vec![(x, rng.scaled(n * cols, 3.0))];
        let (f, _) = Weights::default().build();
        let op = Op::Scale(basic::Scale {
            x,
            out: o,
            factor: 0.37,
            cols,
        });
        out.push(b.finish(format!("scale {cols}×{n}"), f, op, inputs, vec![], 0));
        // swiglu, with and without the clamp
        for clamp in [0.0f32, 1.5] {
            let mut b = Builder::new(6, n);
            let (g, u, o) = (
                b.rec.tokens_f32("g", cols),
                b.rec.tokens_f32("u", cols),
                b.rec.tokens_f32("out", cols),
            );
            let inputs = vec![
                (g, rng.scaled(n * cols, 4.0)),
                (u, rng.scaled(n * cols, 4.0)),
            ];
            let (f, _) = Weights::default().build();
            let op = Op::SwiGlu(moe::SwiGlu {
                gate: g,
                up: u,
                out: o,
                clamp,
                cols,
            });
            out.push(b.finish(
                format!("swiglu {cols}×{n} clamp {clamp}"),
                f,
                op,
                inputs,
                vec![],
                0,
            ));
        }
        // take_last
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.fixed_f32("out", 1, cols);
        let inputs = vec![(x, rng.scaled(n * cols, 1.0))];
        let (f, _) = Weights::default().build();
        let op = Op::TakeLast(basic::TakeLast { x, out: o, cols });
        out.push(b.finish(format!("take_last {cols}×{n}"), f, op, inputs, vec![], 0));
        // gather_last: a step of one session (state 0) into three state
        // rows; rows of states without rows are zero (several sessions per
        // step: tests/batch_ops.rs).
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.fixed_f32("out", 3, cols);
        let inputs = vec![(x, rng.scaled(n * cols, 1.0))];
        let (f, _) = Weights::default().build();
        let op = Op::GatherLast(gather::GatherLast {
            x,
            out: o,
            cols,
            states: 3,
        });
        out.push(b.finish(format!("gather_last {cols}×{n}"), f, op, inputs, vec![], 0));
        // hc_init
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.tokens_f32("out", 4 * cols);
        let inputs = vec![(x, rng.scaled(n * cols, 1.0))];
        let (f, _) = Weights::default().build();
        let op = Op::HcInit(hc::HcInit {
            x,
            out: o,
            n_hc: 4,
            dim: cols,
        });
        out.push(b.finish(format!("hc_init {cols}×{n}"), f, op, inputs, vec![], 0));
    }
    out
}

#[test]
fn elementwise_ops_match_the_cpu() {
    check(elementwise_cases());
}

#[test]
fn embedding_matches_the_cpu_for_every_table_type() {
    let mut rng = Rng(0xE3B);
    let mut cases = Vec::new();
    for &(ty, dim, vocab, n) in &[
        (GgmlType::F32, 3usize, 11usize, 1usize),
        (GgmlType::F16, 64, 37, 5),
        (GgmlType::Bf16, 300, 9, 4),
        (GgmlType::F16, 258, 5, 3),
    ] {
        let mut w = Weights::default();
        w.add(
            "table",
            &[dim as u64, vocab as u64],
            ty,
            &rng.scaled(dim * vocab, 2.0),
        );
        let (f, r) = w.build();
        let mut b = Builder::new(8, n);
        let o = b.rec.tokens_f32("out", dim);
        let toks: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        let op = Op::Embed(basic::Embed {
            table: r[0].clone(),
            tokens: b.tokens,
            out: o,
        });
        let tk = b.tokens;
        let inputs = vec![(tk, toks.iter().map(|&t| t as f32).collect())];
        cases.push(b.finish(
            format!("embed {ty} {dim}×{vocab} n {n}"),
            f,
            op,
            inputs,
            toks,
            0,
        ));
    }
    check(cases);
}

#[test]
fn rms_norm_matches_the_cpu() {
    let mut rng = Rng(0x40F);
    let mut cases = Vec::new();
    for &(dim, heads, n, weighted, fixed) in &[
        (1usize, 1usize, 1usize, true, false),
        (7, 3, 2, false, false),
        (300, 1, 5, true, false),
        (64, 2, 3, true, true),
        (1000, 1, 2, true, false),
    ] {
        let mut w = Weights::default();
        w.add("w", &[dim as u64], GgmlType::F32, &rng.scaled(dim, 1.5));
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let (x, o) = if fixed {
            (
                b.rec.fixed_f32("x", 3, dim * heads),
                b.rec.fixed_f32("out", 3, dim * heads),
            )
        } else {
            (
                b.rec.tokens_f32("x", dim * heads),
                b.rec.tokens_f32("out", dim * heads),
            )
        };
        let len = b.rec.value(x).len();
        let inputs = vec![(x, rng.scaled(len, 5.0))];
        let op = Op::RmsNorm(norm::RmsNorm {
            x,
            out: o,
            dim,
            weight: weighted.then(|| r[0].clone()),
            eps: 1e-6,
            rows: ds4::graph::ops::Rows::of(b.rec.value(o), dim),
        });
        cases.push(b.finish(
            format!("rms_norm {dim}×{heads} n {n} w {weighted} fixed {fixed}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    check(cases);
}

#[test]
fn hyper_connection_ops_match_the_cpu() {
    let mut rng = Rng(0x4C);
    let mut cases = Vec::new();
    let nh = 4usize;
    for &(dim, n) in &[(5usize, 1usize), (300, 3)] {
        for head in [false, true] {
            let mix = if head { nh } else { (2 + nh) * nh };
            let mut w = Weights::default();
            w.add("scale", &[3], GgmlType::F32, &rng.scaled(3, 1.0));
            w.add("base", &[mix as u64], GgmlType::F32, &rng.scaled(mix, 1.0));
            let (f, r) = w.build();
            let mut b = Builder::new(4, n);
            let logits = b.rec.tokens_f32("mix", mix);
            let pre = b.rec.tokens_f32("pre", nh);
            let post = (!head).then(|| b.rec.tokens_f32("post", nh));
            let comb = (!head).then(|| b.rec.tokens_f32("comb", nh * nh));
            let inputs = vec![(logits, rng.scaled(n * mix, 3.0))];
            let op = Op::HcMix(hc::HcMix {
                logits,
                scale: r[0].clone(),
                base: r[1].clone(),
                pre,
                post,
                comb,
                n_hc: nh,
                sinkhorn_iters: 20,
                eps: 1e-6,
            });
            cases.push(b.finish(
                format!("hc_mix head {head} n {n}"),
                f,
                op,
                inputs,
                vec![],
                0,
            ));
        }
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let state = b.rec.tokens_f32("state", nh * dim);
        let pre = b.rec.tokens_f32("pre", nh);
        let o = b.rec.tokens_f32("out", dim);
        let inputs = vec![
            (state, rng.scaled(n * nh * dim, 2.0)),
            (pre, rng.scaled(n * nh, 1.0)),
        ];
        let op = Op::HcCollapse(hc::HcCollapse {
            state,
            pre,
            out: o,
            n_hc: nh,
            dim,
        });
        cases.push(b.finish(format!("hc_collapse {dim} n {n}"), f, op, inputs, vec![], 0));
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let state = b.rec.tokens_f32("state", nh * dim);
        let y = b.rec.tokens_f32("y", dim);
        let post = b.rec.tokens_f32("post", nh);
        let comb = b.rec.tokens_f32("comb", nh * nh);
        let o = b.rec.tokens_f32("out", nh * dim);
        let inputs = vec![
            (state, rng.scaled(n * nh * dim, 2.0)),
            (y, rng.scaled(n * dim, 2.0)),
            (post, rng.scaled(n * nh, 1.0)),
            (comb, rng.scaled(n * nh * nh, 1.0)),
        ];
        let op = Op::HcExpand(hc::HcExpand {
            state,
            y,
            post,
            comb,
            out: o,
            n_hc: nh,
            dim,
        });
        cases.push(b.finish(format!("hc_expand {dim} n {n}"), f, op, inputs, vec![], 0));
    }
    check(cases);
}

fn rope_config(n_rot: usize, yarn: bool) -> RopeConfig {
    RopeConfig {
        base: 10000.0,
        yarn: yarn.then_some(Yarn {
            factor: 16.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
        n_rot,
    }
}

#[test]
fn rope_matches_the_cpu_at_small_and_large_positions() {
    let mut rng = Rng(0x20BE);
    let mut cases = Vec::new();
    for &(heads, hd, n_rot, n, pos0, yarn, inverse) in &[
        (1usize, 2usize, 2usize, 1usize, 0usize, false, false),
        (3, 16, 8, 5, 7, true, false),
        (2, 64, 64, 3, 100_000, true, true),
        (1, 72, 8, 2, 1_000_003, false, false),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", heads * hd);
        let o = b.rec.tokens_f32("out", heads * hd);
        let inputs = vec![(x, rng.scaled(n * heads * hd, 2.0))];
        let op = Op::Rope(rope::Rope {
            x,
            out: o,
            heads,
            head_dim: hd,
            rope: rope_config(n_rot, yarn),
            inverse,
        });
        cases.push(b.finish(
            format!("rope {heads}×{hd} rot {n_rot} pos {pos0} yarn {yarn} inv {inverse}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

/// The row table: one GPU step whose rows carry unrelated positions (as rows
/// of several sessions would) against the CPU twin run once per row at that
/// row's position (the CPU twins take consecutive positions only). RoPE is
/// the op whose rows are independent; the KV ops need per-session state
/// selection first (docs/ARCHITECTURE.md, "Per-row parameters").
#[test]
fn rope_rows_carry_their_own_positions() {
    let mut rng = Rng(0x70E5);
    let positions = [1_000_003u32, 7, 100_000, 0, 65_537];
    let (heads, hd, n_rot) = (2usize, 24usize, 16usize);
    let n = positions.len();
    for (gpu, inverse) in gpus()
        .into_iter()
        .flat_map(|g| [(g.clone(), false), (g, true)])
    {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(n, n);
        let x = b.rec.tokens_f32("x", heads * hd);
        let o = b.rec.tokens_f32("out", heads * hd);
        let input = rng.scaled(n * heads * hd, 2.0);
        let op = Op::Rope(rope::Rope {
            x,
            out: o,
            heads,
            head_dim: hd,
            rope: rope_config(n_rot, true),
            inverse,
        });
        let case = b.finish(format!("rope rows inv {inverse}"), f, op, vec![], vec![], 0);
        let mut wg = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone()).unwrap();
        let h = wg.load_graph(case.graph.clone()).unwrap();
        wg.write_value(h, x, &input).unwrap();
        wg.write_value(h, o, &vec![f32::NAN; n * heads * hd])
            .unwrap();
        let rows: Vec<RowRecord> = positions
            .iter()
            .map(|&pos| RowRecord { pos, state: 0 })
            .collect();
        wg.run_free_positions(h, &vec![0; n], &rows).unwrap();
        let got = wg.read_value(h, o).unwrap();
        let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
        let hc = cpu.load_graph(case.graph.clone()).unwrap();
        let (abs, rel) = tolerance("rope");
        let w = heads * hd;
        for (t, &pos) in positions.iter().enumerate() {
            cpu.write_value(hc, x, &input[t * w..(t + 1) * w]).unwrap();
            let step = StepParams {
                pos0: pos as usize,
                n_tokens: 1,
            };
            cpu.run(hc, &[0], step).unwrap();
            let want = cpu.read_value(hc, o).unwrap();
            for (j, (&g, &e)) in got[t * w..(t + 1) * w].iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= abs + rel * e.abs(),
                    "row {t} at position {pos}, value {j}: wgpu {g} cpu {e} (inverse {inverse})"
                );
            }
        }
    }
}

#[test]
fn rounding_ops_match_the_cpu() {
    let mut rng = Rng(0x80F8);
    let mut cases = Vec::new();
    for &(dim, n_rot, n, fp8, f16) in &[
        (72usize, 8usize, 1usize, true, true),
        (512, 64, 3, true, true),
        (100, 0, 2, false, true),
        (33, 40, 2, true, false),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let x = b.rec.tokens_f32("x", dim);
        let o = b.rec.tokens_f32("out", dim);
        let mut v = rng.scaled(n * dim, 1.0);
        // Spread magnitudes over many binades (and f16 overflow).
        for (i, x) in v.iter_mut().enumerate() {
            *x *= 10f32.powi((i % 13) as i32 - 7);
        }
        v[0] = 70000.0;
        let inputs = vec![(x, v)];
        let op = Op::KvRound(round::KvRound {
            x,
            out: o,
            dim,
            n_rot,
            fp8,
            f16,
        });
        cases.push(b.finish(
            format!("kv_round {dim} rot {n_rot} fp8 {fp8} f16 {f16} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    for &(hd, heads, n) in &[(32usize, 2usize, 1usize), (128, 3, 2)] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let x = b.rec.tokens_f32("x", hd * heads);
        let o = b.rec.tokens_f32("out", hd * heads);
        let inputs = vec![(x, rng.scaled(n * hd * heads, 3.0))];
        let op = Op::HadamardFp4(round::HadamardFp4 {
            x,
            out: o,
            cols: hd * heads,
            head_dim: hd,
        });
        cases.push(b.finish(
            format!("hadamard_fp4 {hd}×{heads} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    check(cases);
}

#[test]
fn attention_and_ring_writes_match_the_cpu() {
    let mut rng = Rng(0xA77);
    let mut cases = Vec::new();
    for &(nh, hd, n, pos0, ratio, sel, window, top_k) in &[
        (
            1usize, 16usize, 1usize, 0usize, 0usize, false, 8usize, 5usize,
        ),
        (2, 16, 5, 3, 0, false, 8, 5),
        (3, 64, 4, 21, 4, false, 8, 5),
        (2, 32, 3, 40, 4, true, 8, 5),
        (1, 300, 2, 9, 4, false, 8, 5),
        // Decode over 400 compressed rows: the fast twin splits the heads
        // of a lone token across threads.
        (5, 48, 1, 1600, 4, false, 8, 5),
        // Long contexts (issue 16), window 128: every one of 3,100+ rows
        // (13 blocks of 256 candidates), and Flash's 512 chosen among them.
        (4, 80, 3, 3100, 1, false, 128, 5),
        (2, 64, 3, 3300, 1, true, 128, 512),
    ] {
        let mut w = Weights::default();
        w.add("sinks", &[nh as u64], GgmlType::F32, &rng.scaled(nh, 2.0));
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let ring = b.state("ring", window, hd, rng.scaled(window * hd, 1.0));
        let cap = 32.max((pos0 + n) / ratio.max(1) + 1);
        let compressed = (ratio > 0).then(|| attention::CompressedRows {
            rows: b.state("comp", cap, hd, rng.scaled(cap * hd, 1.0)),
            ratio,
        });
        let q = b.rec.tokens_f32("q", nh * hd);
        let kv = b.rec.tokens_f32("kv", hd);
        let o = b.rec.tokens_f32("out", nh * hd);
        let selected = sel.then(|| b.rec.tokens_i32("sel", top_k));
        let mut inputs = vec![
            (q, rng.scaled(n * nh * hd, 1.0)),
            (kv, rng.scaled(n * hd, 1.0)),
        ];
        if let Some(s) = selected {
            // Some unused (-1) and some not yet visible entries.
            let v = rng.selection(n * top_k, cap);
            inputs.push((s, v));
        }
        let op = Op::Attention(attention::Attention {
            q,
            kv,
            ring,
            window,
            compressed,
            selected,
            top_k,
            sinks: r[0].clone(),
            n_head: nh,
            head_dim: hd,
            out: o,
        });
        cases.push(b.finish(
            format!("attention {nh}×{hd} n {n} pos {pos0} ratio {ratio} sel {sel}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    let window = 8usize;
    for &(dim, n, pos0) in &[(16usize, 1usize, 0usize), (7, 5, 6), (300, 11, 13)] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(12, n);
        let ring = b.state("ring", window, dim, rng.scaled(window * dim, 1.0));
        let kv = b.rec.tokens_f32("kv", dim);
        let inputs = vec![(kv, rng.scaled(n * dim, 1.0))];
        let op = Op::RingWrite(attention::RingWrite {
            kv,
            ring,
            window,
            dim,
        });
        cases.push(b.finish(
            format!("ring_write {dim} n {n} pos {pos0}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn compressor_matches_the_cpu() {
    let mut rng = Rng(0xC0C0);
    let mut cases = Vec::new();
    for &(ratio, hd, overlapped, rounding, n, pos0) in &[
        (
            4usize,
            32usize,
            false,
            compress::RowRounding::None,
            1usize,
            3usize,
        ),
        (4, 32, true, compress::RowRounding::Fp8F16, 7, 2),
        (16, 64, false, compress::RowRounding::Fp8F16, 20, 5),
        (4, 128, true, compress::RowRounding::HadamardFp4F16, 9, 0),
        // Long steps (issue 16): one step of 3,100 tokens emits 775 rows
        // of ratio 4 (past llvmpipe's loop cap in one invocation) and 24 of
        // ratio 128; the rows start as random values, so a row the GPU
        // never writes fails. Unrounded rows: among tens of thousands of
        // FP8 roundings a last-bit difference before one moves it a step.
        (4, 80, true, compress::RowRounding::None, 3100, 0),
        (128, 80, false, compress::RowRounding::None, 3100, 0),
        (4, 32, true, compress::RowRounding::None, 3100, 0),
    ] {
        let width = if overlapped { 2 * hd } else { hd };
        let slots = if overlapped { 2 * ratio } else { ratio };
        let (f, r) = Weights::compressor(&mut rng, ratio, width, hd).build();
        let mut b = Builder::new(n.max(24), n);
        let cap = ((pos0 + n) / ratio + 1).max(16);
        let mut score = rng.scaled(slots * width, 2.0);
        // Empty slots are part of every real state.
        for s in score.iter_mut().step_by(3) {
            *s = compress::EMPTY_SCORE;
        }
        let state_kv = b.state("ckv", slots, width, rng.scaled(slots * width, 1.0));
        let state_score = b.state("cscore", slots, width, score);
        let rows = b.state("crows", cap, hd, rng.scaled(cap * hd, 1.0));
        let kv = b.rec.tokens_f32("kv", width);
        let gate = b.rec.tokens_f32("gate", width);
        let inputs = vec![
            (kv, rng.scaled(n * width, 1.0)),
            (gate, rng.scaled(n * width, 2.0)),
        ];
        let op = Op::Compress(compress::Compress {
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
            rope: rope_config(16.min(hd), true),
            rounding,
            eps: 1e-6,
        });
        cases.push(b.finish(
            format!("compress r{ratio} {hd} ov {overlapped} {rounding:?} n {n} pos {pos0}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn indexer_matches_the_cpu() {
    let mut rng = Rng(0x1DE);
    let mut cases = Vec::new();
    // `grid`: q, rows and weights on a coarse grid (q, k in {-1, 0, 1},
    // weights in ±{1/4, 1/2, 1}), so every score is exact in f32 whatever
    // the summation order: exact ties, among them at the k-th score, and
    // near-ties one grid step (1/4) apart, which every backend must break
    // the same way (ties to the lower row).
    for &(ratio, top_k, nh, hd, n, pos0, grid) in &[
        (4usize, 5usize, 2usize, 16usize, 1usize, 3usize, false),
        (4, 5, 2, 16, 6, 30, false),
        (4, 16, 3, 32, 3, 1500, false),
        (16, 1, 1, 8, 2, 600, false),
        // 17 heads: one past the fast CPU twin's 16-head vector chunk.
        (4, 8, 17, 24, 3, 203, false),
        // One token over 750 rows: the fast twin splits a decode token's
        // rows across threads (256 per task, a partial last one).
        (4, 16, 3, 32, 1, 3000, false),
        // Long contexts (issue 16): 3,100+ rows, the long-context test
        // model's 64 of them with 4 heads and Flash's 512 with 8.
        (1, 64, 4, 32, 3, 3100, false),
        (1, 512, 8, 64, 2, 3300, false),
        (1, 64, 4, 32, 4, 3100, true),
        (1, 512, 3, 16, 2, 3300, true),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(8, n);
        let cap = (pos0 + n) / ratio + 1;
        let mut grid_vec = |len: usize, w: bool| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let v = rng.below(3) as f32 - 1.0;
                    if w {
                        let sign = if rng.below(4) == 0 { -1.0 } else { 1.0 };
                        sign * [0.25f32, 0.5, 1.0][rng.below(3)]
                    } else {
                        v
                    }
                })
                .collect()
        };
        let (rows_init, q_in, w_in) = if grid {
            let mut rows = grid_vec(cap * hd, false);
            // Whole duplicated rows too: equal scores in any kernel.
            for r in (5..cap).step_by(7) {
                let src = (r - 5) * hd;
                rows.copy_within(src..src + hd, r * hd);
            }
            let (q, w) = (grid_vec(n * nh * hd, false), grid_vec(n * nh, true));
            // The case must straddle a tie: at the last token the k-th and
            // (k+1)-th best scores are equal (exact here in any order).
            let t = n - 1;
            let visible = (pos0 + t + 1) / ratio;
            let mut sc: Vec<f32> = (0..visible)
                .map(|r| {
                    (0..nh)
                        .map(|h| {
                            let d: f32 = (0..hd)
                                .map(|j| q[(t * nh + h) * hd + j] * rows[r * hd + j])
                                .sum();
                            w[t * nh + h] * d.max(0.0)
                        })
                        .sum()
                })
                .collect();
            sc.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(
                sc[top_k - 1],
                sc[top_k],
                "grid case without a tie at the k-th score"
            );
            (rows, q, w)
        } else {
            (
                rng.scaled(cap * hd, 1.0),
                rng.scaled(n * nh * hd, 1.0),
                rng.scaled(n * nh, 1.0),
            )
        };
        let rows = b.state("irows", cap, hd, rows_init);
        let q = b.rec.tokens_f32("q", nh * hd);
        let wts = b.rec.tokens_f32("w", nh);
        let o = b.rec.tokens_i32("out", top_k);
        let inputs = vec![(q, q_in), (wts, w_in)];
        let op = Op::IndexerTopK(indexer::IndexerTopK {
            q,
            weights: wts,
            rows,
            ratio,
            top_k,
            n_head: nh,
            head_dim: hd,
            out: o,
        });
        let kind = if grid { " grid (ties)" } else { "" };
        cases.push(b.finish(
            format!("indexer r{ratio} k{top_k} {nh}×{hd} n {n} pos {pos0}{kind}"),
            f,
            op,
            inputs,
            vec![],
            pos0,
        ));
    }
    check(cases);
}

#[test]
fn router_matches_the_cpu() {
    let mut rng = Rng(0x2007);
    let mut cases = Vec::new();
    for &(e, k, n, bias, hash, normalize) in &[
        (8usize, 2usize, 1usize, false, false, true),
        (33, 6, 5, true, false, true),
        (256, 6, 3, true, false, false),
        (16, 4, 4, false, true, true),
    ] {
        let vocab = 11;
        let mut w = Weights::default();
        w.add("bias", &[e as u64], GgmlType::F32, &rng.scaled(e, 0.5));
        let table: Vec<i32> = (0..vocab * k)
            .map(|i| ((i * 7 + i / k) % e) as i32)
            .collect();
        w.add_i32("tid2eid", &[k as u64, vocab as u64], &table);
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let logits = b.rec.tokens_f32("logits", e);
        let sel = b.rec.tokens_i32("sel", k);
        let wts = b.rec.tokens_f32("w", k);
        let toks: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        let tk = b.tokens;
        let inputs = vec![
            (logits, rng.scaled(n * e, 30.0)),
            (tk, toks.iter().map(|&t| t as f32).collect()),
        ];
        let op = Op::Router(moe::Router {
            logits,
            tokens: tk,
            bias: bias.then(|| r[0].clone()),
            tid2eid: hash.then(|| r[1].clone()),
            selected: sel,
            weights: wts,
            n_expert: e,
            k,
            scale: 1.5,
            normalize,
        });
        cases.push(b.finish(
            format!("router e{e} k{k} n {n} bias {bias} hash {hash}"),
            f,
            op,
            inputs,
            toks,
            0,
        ));
    }
    check(cases);
}

/// One `MatMul` case: an `n_out × n_in` weight of type `ty` made by the
/// real quantizer, `groups` grouped projections, `n` tokens (graph capacity
/// `cap`), seeded inputs.
#[allow(clippy::too_many_arguments)]
fn matmul_case(
    rng: &mut Rng,
    label: &str,
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
    groups: usize,
    n: usize,
    cap: usize,
) -> Case {
    let mut w = Weights::default();
    w.add(
        "w",
        &[n_in as u64, n_out as u64],
        ty,
        &rng.scaled(n_in * n_out, 1.0),
    );
    let (f, r) = w.build();
    let mut b = Builder::new(cap, n);
    let x = b.rec.tokens_f32("x", groups * n_in);
    let o = b.rec.tokens_f32("out", n_out);
    let inputs = vec![(x, rng.scaled(n * groups * n_in, 1.0))];
    let op = Op::MatMul(matmul::MatMul {
        w: r[0].clone(),
        x,
        out: o,
        groups,
        rows: ds4::graph::ops::Rows::value(b.rec.value(o)),
    });
    b.finish(
        format!("{label} {ty} {n_in}→{n_out} g{groups} n {n}"),
        f,
        op,
        inputs,
        vec![],
        0,
    )
}

/// The matrix products (MatMul, MoeExperts) for every weight type.
fn matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x3A7);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 7usize),
        (GgmlType::F16, 33),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(1usize, 1usize, 1usize), (17, 1, 5), (6, 3, 2)] {
            cases.push(matmul_case(
                &mut rng, "matmul", ty, n_in, n_out, groups, n, 6,
            ));
        }
    }
    // Gate and up of one type take the fused gate+up kernel on CUDA; the
    // mixed cases (F16 gate, BF16 up; Q8_0 gate, Q4_K up) the unfused path.
    for &(ty_g, ty_u, ty_d, d, ff, e, k, n) in &[
        (
            GgmlType::F32,
            GgmlType::F32,
            GgmlType::F32,
            16usize,
            8usize,
            4usize,
            2usize,
            1usize,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            64,
            32,
            5,
            2,
            4,
        ),
        (
            GgmlType::Iq2Xxs,
            GgmlType::Iq2Xxs,
            GgmlType::Q2K,
            256,
            256,
            4,
            3,
            3,
        ),
        (
            GgmlType::Q4K,
            GgmlType::Q4K,
            GgmlType::Q4K,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            96,
            64,
            4,
            2,
            3,
        ),
        (
            GgmlType::Q2K,
            GgmlType::Q2K,
            GgmlType::Iq2Xxs,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::F16,
            GgmlType::Bf16,
            GgmlType::F16,
            40,
            24,
            3,
            2,
            3,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q8_0,
            256,
            64,
            3,
            2,
            2,
        ),
    ] {
        let mut w = Weights::default();
        w.add(
            "gate",
            &[d as u64, ff as u64, e as u64],
            ty_g,
            &rng.scaled(d * ff * e, 1.0),
        );
        w.add(
            "up",
            &[d as u64, ff as u64, e as u64],
            ty_u,
            &rng.scaled(d * ff * e, 1.0),
        );
        w.add(
            "down",
            &[ff as u64, d as u64, e as u64],
            ty_d,
            &rng.scaled(d * ff * e, 1.0),
        );
        let (f, r) = w.build();
        let mut b = Builder::new(6, n);
        let x = b.rec.tokens_f32("x", d);
        let sel = b.rec.tokens_i32("sel", k);
        let wts = b.rec.tokens_f32("w", k);
        let o = b.rec.tokens_f32("out", d);
        let picks: Vec<f32> = (0..n)
            .flat_map(|t| (0..k).map(move |i| ((t + 2 * i) % e) as f32))
            .collect();
        let inputs = vec![
            (x, rng.scaled(n * d, 1.0)),
            (sel, picks),
            (wts, rng.scaled(n * k, 1.0)),
        ];
        let op = Op::MoeExperts(moe::MoeExperts {
            x,
            selected: sel,
            weights: wts,
            gate: r[0].clone(),
            up: r[1].clone(),
            down: r[2].clone(),
            clamp: 7.0,
            k,
            out: o,
        });
        cases.push(b.finish(
            format!("moe_experts {ty_g}+{ty_u}/{ty_d} d{d} ff{ff} e{e} k{k} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    cases
}

#[test]
fn matrix_products_match_the_cpu_for_every_weight_type() {
    let cases = matmul_cases();
    check_cpu_self(&cases);
    check_fast_cpu(&cases);
    for g in gpus() {
        check_on_gpu(&g, &cases);
    }
    #[cfg(feature = "cuda")]
    cuda_half::check_on_cuda(&cases);
}

/// Prefill-sized matmuls (≥ 32 tokens, the tensor-core threshold, and one
/// step below it) for every weight type, 64-row tiles that end mid-tile
/// and a grouped product.
#[cfg(feature = "cuda")]
fn prefill_matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x7C0);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 64usize),
        (GgmlType::F16, 96),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 128),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(70usize, 1usize, 33usize), (128, 2, 40), (20, 1, 5)] {
            cases.push(matmul_case(&mut rng, "mma", ty, n_in, n_out, groups, n, 40));
        }
    }
    cases
}

/// The tensor-core prefill kernels (`mma_<type>`, off by default) against
/// the CPU, on the device or on the emulator's software `mma.sync`. The
/// operands are rounded to f16: each product carries at most 2^-10 relative
/// error and the outputs sum ≤ 512 products of magnitude ≤ 1, so 0.05
/// absolute (+ 2e-3 relative) covers the rounding ~10× while a fragment
/// layout error moves outputs by O(1).
#[cfg(feature = "cuda")]
#[test]
fn tensor_core_prefill_matches_the_cpu() {
    cuda_half::check_tensor_cores(&prefill_matmul_cases(), (5e-2, 2e-3));
}

#[cfg(feature = "cuda")]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;
