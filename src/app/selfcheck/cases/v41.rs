//! The one-op cases of the DeepSeek V4.1 ops (`Op::V41`): sizes
//! include 1, odd widths and widths past one 256-thread workgroup; the
//! top-k ops get grid-valued cases whose scores are exact in any summation
//! order, so ties (at the cut among them) must be broken the same way
//! everywhere (lower id). EngramHash and EngramLookup have no GPU kernels
//! by design (the host hashes and reads the rows; docs/V41.md).

use super::basic::rope_config_at;
use crate::app::selfcheck::oneop::{indexer_score, Builder, Case, Weights};
use crate::app::selfcheck::rng::Rng;
use crate::graph::ops::candidate::{CandidateBlocks, CandidateTopK};
use crate::graph::ops::engram::EngramGate;
use crate::graph::ops::hc::HcOneHot;
use crate::graph::ops::rope::RopeConfig;
use crate::graph::ops::source_compress::{Frontier, SourceCompress};
use crate::graph::ops::v41::V41Op;
use crate::graph::ops::Op;
use crate::quant::GgmlType;

/// The RoPE configuration of the V4.1 cases (base 160000, YaRN as Flash).
pub fn v41_rope(n_rot: usize, yarn: bool) -> RopeConfig {
    rope_config_at(160000.0, n_rot, yarn)
}

/// The one-hot stream weights at 1 to 5 streams.
pub fn hc_one_hot_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &(n_hc, n) in &[(4usize, 1usize), (4, 7), (1, 3), (5, 300)] {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(n.max(8), n);
        let out = b.rec.tokens_f32("pre", n_hc);
        let op = Op::V41(V41Op::HcOneHot(HcOneHot { out, n_hc }));
        cases.push(b.finish(
            format!("hc_one_hot {n_hc} streams n {n}"),
            f,
            op,
            vec![],
            vec![],
            0,
        ));
    }
    cases
}

/// The Engram gate: gates spread over (0, 1).
pub fn engram_gate_cases() -> Vec<Case> {
    let mut rng = Rng(0xE6A7E);
    let mut cases = Vec::new();
    for &(n_hc, d, n) in &[
        (4usize, 64usize, 3usize),
        (4, 300, 2),
        (1, 7, 5),
        (2, 513, 1),
    ] {
        let mut w = Weights::default();
        // Near 1 as trained norms are; the product is what the gate uses.
        let qw: Vec<f32> = (0..n_hc * d).map(|_| 1.0 + 0.3 * rng.f()).collect();
        let kw: Vec<f32> = (0..n_hc * d).map(|_| 1.0 + 0.3 * rng.f()).collect();
        w.add("q_weight", &[d as u64, n_hc as u64], GgmlType::F32, &qw);
        w.add("k_weight", &[d as u64, n_hc as u64], GgmlType::F32, &kw);
        let (f, refs) = w.build();
        let mut b = Builder::new(8, n);
        let state = b.rec.tokens_f32("state", n_hc * d);
        let kv = b.rec.tokens_f32("kv", (n_hc + 1) * d);
        let out = b.rec.tokens_f32("out", n_hc * d);
        // Keys correlated with the state on some streams, so gates spread
        // over (0, 1) rather than sitting at 1/2.
        let st = rng.vec(n * n_hc * d);
        let mut kvv = rng.scaled(n * (n_hc + 1) * d, 3.0);
        for t in 0..n {
            for h in 0..n_hc {
                let s = if h % 2 == 0 { 4.0 } else { -4.0 };
                for j in 0..d {
                    kvv[(t * (n_hc + 1) + h) * d + j] += s * st[(t * n_hc + h) * d + j];
                }
            }
        }
        let op = Op::V41(V41Op::EngramGate(EngramGate {
            state,
            kv,
            q_weight: refs[0].clone(),
            k_weight: refs[1].clone(),
            n_hc,
            dim: d,
            eps: 1e-20,
            out,
        }));
        cases.push(b.finish(
            format!("engram_gate {n_hc}×{d} n {n}"),
            f,
            op,
            vec![(state, st), (kv, kvv)],
            vec![],
            0,
        ));
    }
    cases
}

/// A SourceCompress case: (ratio, head_dim, index_head_dim, n_rot, tokens,
/// pos0, capacity or 0 for enough).
pub type CompressShape = (usize, usize, usize, usize, usize, usize, usize);

pub fn compressor_case(rng: &mut Rng, shape: CompressShape) -> Case {
    compressor_case_rounded(rng, shape, false)
}

/// A SourceCompress case with the model numerics' FP4 rounding of the rows
/// when `round_rows`.
pub fn compressor_case_rounded(rng: &mut Rng, shape: CompressShape, round_rows: bool) -> Case {
    let (ratio, hd, ihd, n_rot, n, pos0, cap) = shape;
    let mut w = Weights::default();
    w.random(rng, "norm", &[hd], GgmlType::F32, 1.5);
    w.random(rng, "index_wk", &[hd, ihd], GgmlType::F16, 0.3);
    w.random(rng, "index_norm", &[ihd], GgmlType::F32, 1.5);
    let (f, refs) = w.build();
    let mut b = Builder::new(16, n);
    let cap = if cap > 0 { cap } else { (pos0 + n) / ratio + 2 };
    let rows = b.state("comp_rows", cap, hd, rng.vec(cap * hd));
    let index_rows = b.state("index_rows", cap, ihd, rng.vec(cap * ihd));
    let frontier = (ratio > 1).then(|| Frontier {
        kv: b.state("comp_state_kv", ratio, hd, rng.vec(ratio * hd)),
        score: b.state("comp_state_score", ratio, hd, rng.scaled(ratio * hd, 2.0)),
    });
    let kv = b.rec.tokens_f32("kv", hd);
    let gate = (ratio > 1).then(|| b.rec.tokens_f32("gate", hd));
    let mut inputs = vec![(kv, rng.scaled(n * hd, 2.0))];
    if let Some(g) = gate {
        inputs.push((g, rng.scaled(n * hd, 2.0)));
    }
    let op = Op::V41(V41Op::SourceCompress(SourceCompress {
        kv,
        gate,
        norm: refs[0].clone(),
        index_wk: refs[1].clone(),
        index_norm: refs[2].clone(),
        frontier,
        rows,
        index_rows,
        ratio,
        head_dim: hd,
        index_head_dim: ihd,
        rope: v41_rope(n_rot, ratio > 1),
        eps: 1e-6,
        round_rows,
    }));
    b.finish(
        format!(
            "source_compress r{ratio} {hd}/{ihd} rot {n_rot} n {n} pos {pos0} cap {cap} \
             round {round_rows}"
        ),
        f,
        op,
        inputs,
        vec![],
        pos0,
    )
}

/// The V4.1 compressor: groups completed and left partial, decode, rows
/// past 256 threads, and a capacity the step overruns (rows dropped).
pub fn source_compressor_cases() -> Vec<Case> {
    let mut rng = Rng(0xC0317);
    let cases = [
        (1usize, 32usize, 16usize, 8usize, 5usize, 0usize, 0usize),
        (2, 32, 16, 8, 7, 3, 0),
        (4, 40, 24, 8, 9, 6, 0),
        (1, 300, 130, 64, 3, 17, 0),
        (2, 64, 32, 16, 1, 9, 0),
        (1, 16, 8, 4, 6, 0, 3),
    ]
    .map(|shape| compressor_case(&mut rng, shape));
    // Model numerics: short final FP4 blocks (40 = 16+16+8, 24 < 32) and
    // rows past 256 threads.
    let rounded = [
        (1usize, 32usize, 16usize, 8usize, 5usize, 0usize, 0usize),
        (4, 40, 24, 8, 9, 6, 0),
        (1, 300, 130, 64, 3, 17, 0),
    ]
    .map(|shape| compressor_case_rounded(&mut rng, shape, true));
    cases.into_iter().chain(rounded).collect()
}

/// Grid values: q and keys in {-1, 0, 1}, weights ±{1/4, 1/2, 1}; every
/// score is then exact in f32 in any order.
fn grid(rng: &mut Rng, len: usize, weights: bool) -> Vec<f32> {
    (0..len)
        .map(|_| {
            if weights {
                let sign = if rng.below(4) == 0 { -1.0 } else { 1.0 };
                sign * [0.25f32, 0.5, 1.0][rng.below(3)]
            } else {
                rng.below(3) as f32 - 1.0
            }
        })
        .collect()
}

/// One shape of the candidate selections (blocks of `bs` rows, `kb` kept).
struct SelectCase {
    ratio: usize,
    nh: usize,
    hd: usize,
    kb: usize,
    bs: usize,
    n: usize,
    pos0: usize,
    grid: bool,
}

impl SelectCase {
    fn inputs(&self, rng: &mut Rng) -> (usize, Vec<f32>, Vec<f32>, Vec<f32>) {
        let cap = (self.pos0 + self.n) / self.ratio + 1;
        let (nh, hd, n) = (self.nh, self.hd, self.n);
        if self.grid {
            (
                cap,
                grid(rng, cap * hd, false),
                grid(rng, n * nh * hd, false),
                grid(rng, n * nh, true),
            )
        } else {
            (
                cap,
                rng.vec(cap * hd),
                rng.vec(n * nh * hd),
                rng.vec(n * nh),
            )
        }
    }

    fn label(&self, what: &str) -> String {
        format!(
            "{what} r{} {}×{} {} blocks of {} n {} pos {}{}",
            self.ratio,
            self.nh,
            self.hd,
            self.kb,
            self.bs,
            self.n,
            self.pos0,
            if self.grid { " grid (ties)" } else { "" }
        )
    }
}

/// The candidate selections' shapes, ties included.
const SELECT_CASES: &[SelectCase] = &[
    // Fewer blocks than kept: all of them.
    SelectCase {
        ratio: 1,
        nh: 2,
        hd: 16,
        kb: 2,
        bs: 2,
        n: 3,
        pos0: 0,
        grid: false,
    },
    SelectCase {
        ratio: 1,
        nh: 2,
        hd: 16,
        kb: 3,
        bs: 4,
        n: 5,
        pos0: 40,
        grid: false,
    },
    SelectCase {
        ratio: 4,
        nh: 3,
        hd: 24,
        kb: 5,
        bs: 3,
        n: 4,
        pos0: 300,
        grid: false,
    },
    // One kept block: the newest only.
    SelectCase {
        ratio: 2,
        nh: 1,
        hd: 8,
        kb: 1,
        bs: 2,
        n: 3,
        pos0: 20,
        grid: false,
    },
    // Hundreds of blocks (several passes of 256 threads), 17 heads.
    SelectCase {
        ratio: 1,
        nh: 17,
        hd: 8,
        kb: 9,
        bs: 8,
        n: 2,
        pos0: 3000,
        grid: false,
    },
    SelectCase {
        ratio: 1,
        nh: 4,
        hd: 32,
        kb: 300,
        bs: 2,
        n: 2,
        pos0: 1500,
        grid: false,
    },
    // Exact ties between block maxima and rows.
    SelectCase {
        ratio: 1,
        nh: 2,
        hd: 4,
        kb: 4,
        bs: 2,
        n: 4,
        pos0: 60,
        grid: true,
    },
    SelectCase {
        ratio: 2,
        nh: 3,
        hd: 3,
        kb: 6,
        bs: 3,
        n: 3,
        pos0: 400,
        grid: true,
    },
];

/// CandidateBlocks over SELECT_CASES, and how many grid tokens tie at the
/// cut.
pub fn candidate_blocks_cases() -> (Vec<Case>, usize) {
    let mut rng = Rng(0xB10C5);
    let mut cases = Vec::new();
    let mut ties_at_cut = 0;
    for c in SELECT_CASES {
        let (cap, keys_in, q_in, w_in) = c.inputs(&mut rng);
        if c.grid {
            // Count tokens whose (kb − 1)-th and kb-th best other blocks tie.
            for t in 0..c.n {
                let v = (c.pos0 + t + 1) / c.ratio;
                let last = (v - 1) / c.bs;
                let mut m: Vec<f64> = (0..v.div_ceil(c.bs))
                    .filter(|&b| b != last)
                    .map(|b| {
                        (b * c.bs..((b + 1) * c.bs).min(v))
                            .map(|r| indexer_score(&q_in, &w_in, &keys_in, t, r, c.nh, c.hd))
                            .fold(f64::NEG_INFINITY, f64::max)
                    })
                    .collect();
                m.sort_by(|a, b| b.total_cmp(a));
                if m.len() >= c.kb && m[c.kb - 2] == m[c.kb - 1] {
                    ties_at_cut += 1;
                }
            }
        }
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(8, c.n);
        let rows = b.state("index_rows", cap, c.hd, keys_in);
        let q = b.rec.tokens_f32("q", c.nh * c.hd);
        let wts = b.rec.tokens_f32("w", c.nh);
        let out = b.rec.tokens_i32("blocks", c.kb);
        let op = Op::V41(V41Op::CandidateBlocks(CandidateBlocks {
            q,
            weights: wts,
            rows,
            ratio: c.ratio,
            n_head: c.nh,
            head_dim: c.hd,
            topk_blocks: c.kb,
            block_size: c.bs,
            out,
        }));
        cases.push(b.finish(
            c.label("candidate_blocks"),
            f,
            op,
            vec![(q, q_in), (wts, w_in)],
            vec![],
            c.pos0,
        ));
    }
    (cases, ties_at_cut)
}

/// CandidateTopK over SELECT_CASES, kept blocks drawn as CandidateBlocks
/// writes them.
pub fn candidate_topk_cases() -> Vec<Case> {
    let mut rng = Rng(0x70B4);
    let mut cases = Vec::new();
    for (i, c) in SELECT_CASES.iter().enumerate() {
        let (cap, keys_in, q_in, w_in) = c.inputs(&mut rng);
        // Kept blocks as CandidateBlocks writes them: the newest, then
        // others at random, ascending and distinct, −1 padded.
        let mut blocks_in = Vec::new();
        for t in 0..c.n {
            let v = (c.pos0 + t + 1) / c.ratio;
            let nb = v.div_ceil(c.bs);
            let mut chosen = vec![nb - 1];
            let want = c.kb.min(nb) - usize::from(i % 3 == 2 && c.kb > 1);
            while chosen.len() < want {
                let b = rng.below(nb - 1);
                if !chosen.contains(&b) {
                    chosen.push(b);
                }
            }
            chosen.sort_unstable();
            blocks_in.extend((0..c.kb).map(|j| chosen.get(j).map_or(-1.0, |&b| b as f32)));
        }
        // top_k: below, at and above the candidate count.
        let top_k = match i % 3 {
            0 => 3,
            1 => c.kb * c.bs,
            _ => (c.kb * c.bs / 2).max(1),
        };
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(8, c.n);
        let rows = b.state("index_rows", cap, c.hd, keys_in);
        let q = b.rec.tokens_f32("q", c.nh * c.hd);
        let wts = b.rec.tokens_f32("w", c.nh);
        let blocks = b.rec.tokens_i32("blocks", c.kb);
        let out = b.rec.tokens_i32("selected", top_k);
        let op = Op::V41(V41Op::CandidateTopK(CandidateTopK {
            q,
            weights: wts,
            rows,
            blocks,
            ratio: c.ratio,
            top_k,
            n_head: c.nh,
            head_dim: c.hd,
            topk_blocks: c.kb,
            block_size: c.bs,
            out,
        }));
        cases.push(b.finish(
            format!("{} top {top_k}", c.label("candidate_topk")),
            f,
            op,
            vec![(q, q_in), (wts, w_in), (blocks, blocks_in)],
            vec![],
            c.pos0,
        ));
    }
    cases
}
