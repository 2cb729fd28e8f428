//! The one-op cases of the elementwise, embedding, norm, hyper-connection,
//! RoPE and rounding ops: sizes include 1, odd widths and widths that are
//! not a multiple of the 256-thread workgroup; seeded random inputs.

use crate::app::selfcheck::oneop::{Builder, Case, Weights};
use crate::app::selfcheck::rng::Rng;
use crate::graph::ops::rope::{RopeConfig, Yarn};
use crate::graph::ops::{basic, gather, hc, moe, norm, rope, round, Op};
use crate::quant::GgmlType;

/// add, scale, swiglu (with and without the clamp), take_last,
/// gather_last and hc_init at widths 1, 7 and 300.
pub fn elementwise_cases() -> Vec<Case> {
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

/// Embedding lookups for every table type.
pub fn embed_cases() -> Vec<Case> {
    let mut rng = Rng(0xE3B);
    let mut cases = Vec::new();
    for &(ty, dim, vocab, n) in &[
        (GgmlType::F32, 3usize, 11usize, 1usize),
        (GgmlType::F16, 64, 37, 5),
        (GgmlType::Bf16, 300, 9, 4),
        (GgmlType::F16, 258, 5, 3),
    ] {
        let mut w = Weights::default();
        w.random(&mut rng, "table", &[dim, vocab], ty, 2.0);
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
    cases
}

/// RMS norms: weighted or not, per head, over fixed rows.
pub fn rms_norm_cases() -> Vec<Case> {
    let mut rng = Rng(0x40F);
    let mut cases = Vec::new();
    for &(dim, heads, n, weighted, fixed) in &[
        (1usize, 1usize, 1usize, true, false),
        (7, 3, 2, false, false),
        (300, 1, 5, true, false),
        (64, 2, 3, true, true),
        (1000, 1, 2, true, false),
        // Enough rows for the fast backend's row split and a tail of rows
        // below its 8 side-by-side sums.
        (500, 3, 29, true, false),
    ] {
        let mut w = Weights::default();
        w.random(&mut rng, "w", &[dim], GgmlType::F32, 1.5);
        let (f, r) = w.build();
        let mut b = Builder::new(n.max(6), n);
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
            rows: crate::graph::ops::Rows::of(b.rec.value(o), dim),
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
    cases
}

/// The hyper-connection mixer (head and layer form), collapse and expand.
pub fn hc_cases() -> Vec<Case> {
    let mut rng = Rng(0x4C);
    let mut cases = Vec::new();
    let nh = 4usize;
    for &(dim, n) in &[(5usize, 1usize), (300, 3)] {
        for head in [false, true] {
            let mix = if head { nh } else { (2 + nh) * nh };
            let mut w = Weights::default();
            w.random(&mut rng, "scale", &[3], GgmlType::F32, 1.0);
            w.random(&mut rng, "base", &[mix], GgmlType::F32, 1.0);
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
    cases
}

/// The RoPE configuration of the cases (base 10000, YaRN as Flash).
pub fn rope_config(n_rot: usize, yarn: bool) -> RopeConfig {
    rope_config_at(10000.0, n_rot, yarn)
}

/// The cases' RoPE configuration at frequency base `base`.
pub fn rope_config_at(base: f32, n_rot: usize, yarn: bool) -> RopeConfig {
    RopeConfig {
        base,
        yarn: yarn.then_some(Yarn {
            factor: 16.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }),
        n_rot,
    }
}

/// RoPE at small and large positions, with and without YaRN, inverse.
pub fn rope_cases() -> Vec<Case> {
    let mut rng = Rng(0x20BE);
    let mut cases = Vec::new();
    for &(heads, hd, n_rot, n, pos0, yarn, inverse) in &[
        (1usize, 2usize, 2usize, 1usize, 0usize, false, false),
        (3, 16, 8, 5, 7, true, false),
        (2, 64, 64, 3, 100_000, true, true),
        (1, 72, 8, 2, 1_000_003, false, false),
        // Enough tokens for the fast backend's token split (positions go on
        // across the parts).
        (4, 64, 16, 150, 3, true, false),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(n.max(6), n);
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
    cases
}

/// The KV rounding (FP8, f16) and the Hadamard/FP4 rounding.
pub fn rounding_cases() -> Vec<Case> {
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
    cases.extend(block_round_cases(&mut rng));
    cases
}

/// V4.1's block round trips in the three formats: rows wider than a
/// workgroup's row memory, a short final block, an all-zero block (the
/// amax floors), magnitudes over many binades, and ties at the rounding
/// boundaries (values that land exactly halfway between two codes).
fn block_round_cases(rng: &mut Rng) -> Vec<Case> {
    use round::BlockFormat::{Fp4, Fp4E4m3Scale, Fp8};
    let mut cases = Vec::new();
    // (cols, head, block, format, tokens): heads narrower than a block
    // (the tiny V4.1 indexer's 16) and several heads per row.
    for &(cols, head, block, format, n) in &[
        (70usize, 70usize, 32usize, Fp8, 2usize),
        (8192, 8192, 32, Fp8, 1),
        (96, 96, 32, Fp4, 3),
        (64, 16, 32, Fp4, 2),
        (2304, 128, 32, Fp4, 1),
        (100, 100, 16, Fp4E4m3Scale, 2),
        (1040, 1040, 16, Fp4E4m3Scale, 1),
    ] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(4, n);
        let x = b.rec.tokens_f32("x", cols);
        let o = b.rec.tokens_f32("out", cols);
        let mut v = rng.scaled(n * cols, 1.0);
        for (i, x) in v.iter_mut().enumerate() {
            *x *= 10f32.powi((i / block % 9) as i32 - 4);
        }
        // Block 0 of the first row: its amax sets a scale of exactly 1
        // (FP8: 448; FP4: 6; E4M3-scaled FP4: 4.5 → scale 0.75), and the
        // other values sit on ties of the format (even-code choices).
        let ties: &[f32] = match format {
            Fp8 => &[448.0, 1.0625, -17.0, 0.0087890625, 3.125, -0.0029296875],
            Fp4 => &[6.0, 0.25, -0.75, 1.25, 1.75, -2.5, 3.5, 5.0],
            Fp4E4m3Scale => &[4.5, 0.1875, -0.5625, 0.9375, 1.3125, -1.875, 2.625, 3.75],
        };
        v[..block].fill(0.0);
        v[..ties.len()].copy_from_slice(ties);
        // Block 1: all zeros.
        v[block..2 * block].fill(0.0);
        let inputs = vec![(x, v)];
        let op = Op::BlockRound(round::BlockRound {
            x,
            out: o,
            cols,
            head,
            block,
            format,
        });
        cases.push(b.finish(
            format!("block_round {format:?} {cols} heads of {head} / {block} n {n}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
    }
    cases
}
