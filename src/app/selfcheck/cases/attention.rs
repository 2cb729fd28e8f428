//! The one-op cases of attention and the ring writes, the compressor, the
//! indexer and the router: decode and prefill steps, long contexts (3,100+
//! rows, issue 16), exact ties the backends must break the same way.

use super::basic::rope_config;
use crate::app::selfcheck::oneop::{Builder, Case, Weights};
use crate::app::selfcheck::rng::Rng;
use crate::graph::ops::{attention, compress, indexer, moe, Op};
use crate::quant::GgmlType;

/// Attention (window, compressed rows, the indexer's selection; long
/// contexts) and the ring writes.
pub fn attention_cases() -> Vec<Case> {
    let mut rng = Rng(0xA77);
    let mut cases = Vec::new();
    // `block`: a DSpark draft block (every row sees the whole step): no
    // ring rows yet, a ring not yet full, a full one, one row.
    let blocks = [
        (1usize, 16usize, 3usize, 0usize),
        (2, 16, 5, 3),
        (3, 64, 4, 21),
        (2, 32, 1, 9),
    ];
    let causal = [
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
    ];
    let block_cases = blocks.map(|(nh, hd, n, pos0)| (nh, hd, n, pos0, 0, false, 8, 5, true));
    for &(nh, hd, n, pos0, ratio, sel, window, top_k, block) in causal
        .map(|(a, b, c, d, e, f, g, h)| (a, b, c, d, e, f, g, h, false))
        .iter()
        .chain(&block_cases)
    {
        let mut w = Weights::default();
        w.random(&mut rng, "sinks", &[nh], GgmlType::F32, 2.0);
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
            block,
            compressed,
            selected,
            top_k,
            sinks: r[0].clone(),
            n_head: nh,
            head_dim: hd,
            out: o,
        });
        cases.push(b.finish(
            format!("attention {nh}×{hd} n {n} pos {pos0} ratio {ratio} sel {sel} block {block}"),
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
    cases
}

/// The compressor: ratios 4 and 128, overlapped or not, each rounding,
/// and one step of 3,100 tokens.
pub fn compressor_cases() -> Vec<Case> {
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
    cases
}

/// The indexer's top-k, with exact ties on a coarse grid.
pub fn indexer_cases() -> Vec<Case> {
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
    cases
}

/// The router: bias, hash layers, normalized or not.
pub fn router_cases() -> Vec<Case> {
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
        w.random(&mut rng, "bias", &[e], GgmlType::F32, 0.5);
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
    cases
}
