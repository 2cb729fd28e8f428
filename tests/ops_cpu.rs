//! The CPU twins against plain, independent formulas: fresh random inputs,
//! outputs poisoned with NaN before each call, several sizes including odd
//! ones. (The whole model is checked against transformers elsewhere; these
//! pin each op down on its own, and are what GPU kernels will be held to.)

mod common;
use common::rng::Rng;

use ds4::app::selfcheck::oneop::indexer_score;
use ds4::gguf::TensorRef;
use ds4::gguf::{GgufFile, GgufWriter};
use ds4::graph::ops::attention::{Attention, AttentionInputs, CompressedRows};
use ds4::graph::ops::compress::{Compress, CompressState, RowRounding, EMPTY_SCORE};
use ds4::graph::ops::hc::sinkhorn;
use ds4::graph::ops::indexer::IndexerTopK;
use ds4::graph::ops::matmul::matmul_rows;
use ds4::graph::ops::moe::{softplus, Router};
use ds4::graph::ops::rope::{frequencies, rotate};
use ds4::graph::ops::rope::{RopeConfig, Yarn};
use ds4::graph::{StateId, ValueId};
use ds4::quant::{self, GgmlType};

/// A GGUF in memory holding F32 tensors, and refs to them.
fn weights(tensors: &[(&str, Vec<u64>, Vec<f32>)]) -> (GgufFile, Vec<TensorRef>) {
    let mut w = GgufWriter::new();
    for (n, ne, v) in tensors {
        w.add_tensor(
            n,
            ne,
            GgmlType::F32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
        .unwrap();
    }
    let f = GgufFile::from_vec(w.to_bytes().unwrap()).unwrap();
    let refs = tensors
        .iter()
        .map(|(n, ne, _)| {
            let info = f.tensor_info(n).unwrap();
            let mut a = [1u64; 4];
            a[..ne.len()].copy_from_slice(ne);
            TensorRef {
                name: n.to_string(),
                ty: GgmlType::F32,
                ne: a,
                offset: f.data_offset() + info.offset,
                n_bytes: info.n_bytes,
            }
        })
        .collect();
    (f, refs)
}

fn close(a: f32, b: f64, tol: f64) -> bool {
    (a as f64 - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn matmul_matches_dequantise_then_dot_for_every_type() {
    let mut rng = Rng(0x1234_5678);
    let cases: &[(GgmlType, &[usize])] = &[
        (GgmlType::F32, &[7, 33]),
        (GgmlType::F16, &[7, 33]),
        (GgmlType::Bf16, &[5]),
        (GgmlType::Q8_0, &[32, 96]),
        (GgmlType::Q2K, &[256, 512]),
        (GgmlType::Q4K, &[256]),
        (GgmlType::Iq2Xxs, &[256, 512]),
    ];
    for &(ty, ins) in cases {
        for &n_in in ins {
            for &(n_out, groups) in &[(1usize, 1usize), (17, 1), (6, 3)] {
                for &n_tok in &[1usize, 5] {
                    let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
                    let mut w = vec![0u8; rb * n_out];
                    for r in 0..n_out {
                        quant::quantize_row(ty, &rng.vec(n_in), &mut w[r * rb..(r + 1) * rb], None)
                            .unwrap();
                    }
                    let x = rng.vec(n_tok * groups * n_in);
                    let mut out = vec![f32::NAN; n_tok * n_out];
                    matmul_rows(ty, &w, n_in, n_out, groups, &x, n_tok, &mut out);
                    let mut row = vec![0f32; n_in];
                    for o in 0..n_out {
                        quant::dequantize_row(ty, &w[o * rb..(o + 1) * rb], &mut row).unwrap();
                        let g = o / (n_out / groups);
                        for t in 0..n_tok {
                            let xs = &x[t * groups * n_in + g * n_in..][..n_in];
                            let want: f64 =
                                row.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                            let got = out[t * n_out + o];
                            assert!(
                                close(got, want, 1e-5),
                                "{ty} in {n_in} out {n_out} g {groups}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rope_is_a_rotation_and_yarn_blends_the_right_pairs() {
    let yarn = Yarn {
        factor: 16.0,
        original_context: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let plain = RopeConfig {
        base: 160000.0,
        yarn: None,
        n_rot: 64,
    };
    let scaled = RopeConfig {
        yarn: Some(yarn),
        ..plain
    };
    let (fp, fy) = (frequencies(&plain), frequencies(&scaled));
    // Flash: pairs ≤ 15 keep their frequency, pairs ≥ 25 are divided by 16.
    for k in 0..32 {
        if k <= 15 {
            assert_eq!(fy[k], fp[k]);
        } else if k >= 25 {
            assert!((fy[k] - fp[k] / 16.0).abs() <= 1e-15 * fp[k]);
        } else {
            assert!(fy[k] < fp[k] && fy[k] > fp[k] / 16.0);
        }
    }
    let mut rng = Rng(99);
    for head_dim in [64usize, 80, 512] {
        let x = rng.vec(head_dim);
        let mut y = x.clone();
        let pos = 123_457.0;
        rotate(&mut y, &fy, pos, false);
        // Non-rotary dims untouched, norm preserved, inverse restores.
        assert_eq!(&y[..head_dim - 64], &x[..head_dim - 64]);
        let n = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        assert!((n(&x) - n(&y)).abs() < 1e-4 * n(&x));
        rotate(&mut y, &fy, pos, true);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}

#[test]
fn sinkhorn_gives_a_doubly_stochastic_matrix() {
    let mut rng = Rng(7);
    for n in [2usize, 4, 5] {
        let mut c: Vec<f32> = rng.vec(n * n).iter().map(|x| x * 4.0).collect();
        sinkhorn(&mut c, n, 20, 1e-6);
        for i in 0..n {
            let row: f32 = c[i * n..(i + 1) * n].iter().sum();
            let col: f32 = (0..n).map(|r| c[r * n + i]).sum();
            assert!(
                (row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-4,
                "n {n}: row {row} col {col}"
            );
            assert!(c.iter().all(|&v| v > 0.0));
        }
    }
}

/// Naive attention over an explicit list of rows.
fn naive_attention(q: &[f32], rows: &[Vec<f32>], sink: f32) -> Vec<f64> {
    let hd = q.len();
    let l: Vec<f64> = rows
        .iter()
        .map(|r| {
            r.iter()
                .zip(q)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                / (hd as f64).sqrt()
        })
        .collect();
    let m = l.iter().cloned().fold(sink as f64, f64::max);
    let den = (sink as f64 - m).exp() + l.iter().map(|x| (x - m).exp()).sum::<f64>();
    (0..hd)
        .map(|d| {
            rows.iter()
                .zip(&l)
                .map(|(r, x)| (x - m).exp() * r[d] as f64)
                .sum::<f64>()
                / den
        })
        .collect()
}

/// An attention over the raw window of `w` only (no compressed rows, no
/// block), `n_head` heads of `head_dim`, with the sinks `sinks`.
fn window_attention(w: usize, n_head: usize, head_dim: usize, sinks: TensorRef) -> Attention {
    Attention {
        q: ValueId(0),
        kv: ValueId(1),
        ring: StateId(0),
        window: w,
        block: false,
        compressed: None,
        selected: None,
        top_k: 0,
        sinks,
        n_head,
        head_dim,
        out: ValueId(3),
    }
}

/// `op` on `inp` for `n_tok` rows from `pos0`, its output poisoned first.
fn attend(
    op: &Attention,
    file: &GgufFile,
    inp: AttentionInputs,
    pos0: usize,
    n_tok: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; n_tok * op.n_head * op.head_dim];
    op.compute(file, inp, pos0, n_tok, &mut out);
    out
}

/// Every head of one output row `out` equals the naive softmax over `rows`
/// of that head's query in `q`, with the head's sink; `what` names the row.
fn check_heads(q: &[f32], out: &[f32], rows: &[Vec<f32>], sinks: &[f32], what: &str) {
    let hd = q.len() / sinks.len();
    for (h, &sink) in sinks.iter().enumerate() {
        let want = naive_attention(&q[h * hd..][..hd], rows, sink);
        for d in 0..hd {
            let got = out[h * hd + d];
            assert!(
                close(got, want[d], 1e-5),
                "{what} head {h} dim {d}: {got} vs {}",
                want[d]
            );
        }
    }
}

#[test]
fn attention_matches_a_naive_softmax_over_the_visible_rows() {
    let mut rng = Rng(42);
    let (nh, hd, w, ratio, top_k) = (3usize, 24usize, 8usize, 4usize, 3usize);
    let (file, refs) = weights(&[("sinks", vec![nh as u64], rng.vec(nh))]);
    let sinks: Vec<f32> = ds4::graph::ops::load_f32(&file, &refs[0]);
    for (pos0, n_tok, indexed) in [
        (0usize, 5usize, false),
        (13, 6, false),
        (30, 3, true),
        (7, 1, true),
    ] {
        let q = rng.vec(n_tok * nh * hd);
        let kv = rng.vec(n_tok * hd);
        let ring = rng.vec(w * hd);
        let comp = rng.vec(20 * hd);
        // Indexer choice: a few rows, some beyond visibility or unused (−1).
        let sel: Vec<i32> = (0..n_tok * top_k)
            .map(|i| [0, 2, -1, 5, 1, 9][i % 6])
            .collect();
        let op = Attention {
            compressed: Some(CompressedRows {
                rows: StateId(1),
                ratio,
            }),
            selected: indexed.then_some(ValueId(2)),
            top_k,
            ..window_attention(w, nh, hd, refs[0].clone())
        };
        let inp = AttentionInputs {
            q: &q,
            kv: &kv,
            ring: &ring,
            compressed: Some(&comp),
            selected: indexed.then_some(&sel[..]),
        };
        let out = attend(&op, &file, inp, pos0, n_tok);
        for t in 0..n_tok {
            let p = pos0 + t;
            let mut rows: Vec<Vec<f32>> = Vec::new();
            for s in p.saturating_sub(w - 1)..=p {
                rows.push(if s >= pos0 {
                    kv[(s - pos0) * hd..][..hd].to_vec()
                } else {
                    ring[(s % w) * hd..][..hd].to_vec()
                });
            }
            let n_vis = (p + 1) / ratio;
            let comp_rows: Vec<usize> = if indexed {
                sel[t * top_k..(t + 1) * top_k]
                    .iter()
                    .filter(|&&r| r >= 0 && (r as usize) < n_vis)
                    .map(|&r| r as usize)
                    .collect()
            } else {
                (0..n_vis).collect()
            };
            rows.extend(comp_rows.iter().map(|&r| comp[r * hd..][..hd].to_vec()));
            let row = t * nh * hd..(t + 1) * nh * hd;
            check_heads(
                &q[row.clone()],
                &out[row],
                &rows,
                &sinks,
                &format!("pos {p}"),
            );
        }
    }
}

/// A DSpark draft block (`block`): every row sees the ring's last `W`
/// positions before the step and all the step's rows, later ones included.
#[test]
fn block_attention_sees_the_ring_and_the_whole_block() {
    let mut rng = Rng(43);
    let (nh, hd, w) = (2usize, 16usize, 8usize);
    let (file, refs) = weights(&[("sinks", vec![nh as u64], rng.vec(nh))]);
    let sinks: Vec<f32> = ds4::graph::ops::load_f32(&file, &refs[0]);
    for (pos0, n_tok) in [(0usize, 4usize), (3, 5), (20, 5), (9, 1)] {
        let q = rng.vec(n_tok * nh * hd);
        let kv = rng.vec(n_tok * hd);
        let ring = rng.vec(w * hd);
        let op = Attention {
            block: true,
            ..window_attention(w, nh, hd, refs[0].clone())
        };
        let inp = AttentionInputs {
            q: &q,
            kv: &kv,
            ring: &ring,
            compressed: None,
            selected: None,
        };
        let out = attend(&op, &file, inp, pos0, n_tok);
        // Written out by hand: ring slots of positions pos0-W.., then the block.
        let mut rows: Vec<Vec<f32>> = (pos0.saturating_sub(w)..pos0)
            .map(|s| ring[(s % w) * hd..][..hd].to_vec())
            .collect();
        assert_eq!(rows.len(), pos0.min(w));
        rows.extend((0..n_tok).map(|t| kv[t * hd..][..hd].to_vec()));
        for t in 0..n_tok {
            let row = t * nh * hd..(t + 1) * nh * hd;
            let what = format!("pos0 {pos0} row {t}");
            check_heads(&q[row.clone()], &out[row], &rows, &sinks, &what);
        }
    }
}

#[test]
fn indexer_picks_the_best_rows_with_ties_to_the_lower_index() {
    let mut rng = Rng(5);
    let (nh, hd, ratio, k) = (3usize, 32usize, 4usize, 4usize);
    let mut rows = rng.vec(40 * hd);
    // Rows 3 and 9 identical to row 1: exact ties.
    for dup in [3usize, 9] {
        let r1: Vec<f32> = rows[hd..2 * hd].to_vec();
        rows[dup * hd..(dup + 1) * hd].copy_from_slice(&r1);
    }
    let op = IndexerTopK {
        q: ValueId(0),
        weights: ValueId(1),
        rows: StateId(0),
        ratio,
        top_k: k,
        n_head: nh,
        head_dim: hd,
        out: ValueId(2),
    };
    for (pos0, n_tok) in [(0usize, 20usize), (60, 7)] {
        let q = rng.vec(n_tok * nh * hd);
        let wts = rng
            .vec(n_tok * nh)
            .iter()
            .map(|x| x.abs())
            .collect::<Vec<_>>();
        let mut out = vec![i32::MIN; n_tok * k];
        op.compute(&q, &wts, &rows, pos0, n_tok, &mut out);
        for t in 0..n_tok {
            let n = (pos0 + t + 1) / ratio;
            let got = &out[t * k..(t + 1) * k];
            if n <= k {
                let want: Vec<i32> = (0..k as i32)
                    .map(|r| if (r as usize) < n { r } else { -1 })
                    .collect();
                assert_eq!(got, &want[..]);
                continue;
            }
            let score = |r: usize| indexer_score(&q, &wts, &rows, t, r, nh, hd);
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
            let mut want: Vec<i32> = order[..k].iter().map(|&r| r as i32).collect();
            want.sort_unstable();
            assert_eq!(got, &want[..], "token {t}");
        }
    }
}

#[test]
fn router_chooses_top_k_with_bias_ties_low_and_hash_rows() {
    let e = 6;
    // Experts 1 and 4 tie exactly on s + bias; the lower index must win.
    // The bias lifts expert 2 above expert 3 for selection only.
    let logits = vec![0.0f32, 0.3, -1.0, 0.7, 0.3, 2.0];
    let s: Vec<f32> = logits.iter().map(|&x| softplus(x).sqrt()).collect();
    let bias = vec![0.0f32, 0.0, 2.0, 0.0, 0.0, 0.0];
    let (file, refs) = weights(&[("bias", vec![e as u64], bias)]);
    let op = Router {
        logits: ValueId(0),
        tokens: ValueId(1),
        bias: Some(refs[0].clone()),
        tid2eid: None,
        selected: ValueId(2),
        weights: ValueId(3),
        n_expert: e,
        k: 3,
        scale: 1.5,
        normalize: true,
    };
    let mut sel = vec![-7; 4];
    let mut w = vec![f32::NAN; 4];
    Router { k: 4, ..op.clone() }.compute(&file, &logits, &[0], 1, &mut sel, &mut w);
    assert_eq!(
        sel,
        vec![2, 5, 3, 1],
        "ties between experts 1 and 4 go to 1"
    );
    let mut sel = vec![-7; 3];
    let mut w = vec![f32::NAN; 3];
    op.compute(&file, &logits, &[0], 1, &mut sel, &mut w);
    assert_eq!(sel, vec![2, 5, 3], "bias steers selection");
    let sum: f32 = [2, 5, 3].iter().map(|&i| s[i]).sum();
    for (i, &x) in [2usize, 5, 3].iter().enumerate() {
        assert!((w[i] - s[x] / sum * 1.5).abs() < 1e-6);
    }
    // Hash routing: the table row of the token, in stored order.
    let mut wr = GgufWriter::new();
    let rows: Vec<i32> = vec![4, 0, 2, 1, 5, 3];
    wr.add_tensor(
        "t",
        &[3, 2],
        GgmlType::I32,
        rows.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
    .unwrap();
    let f2 = GgufFile::from_vec(wr.to_bytes().unwrap()).unwrap();
    let info = f2.tensor_info("t").unwrap();
    let tref = TensorRef {
        name: "t".into(),
        ty: GgmlType::I32,
        ne: [3, 2, 1, 1],
        offset: f2.data_offset() + info.offset,
        n_bytes: info.n_bytes,
    };
    let op = Router {
        tid2eid: Some(tref),
        bias: None,
        ..op
    };
    op.compute(&f2, &logits, &[1], 1, &mut sel, &mut w);
    assert_eq!(sel, vec![1, 5, 3]);
}

#[test]
fn compressor_emits_the_gated_pool_of_each_window() {
    let mut rng = Rng(77);
    let d_hd = 16usize;
    for (overlapped, ratio) in [(false, 4usize), (true, 4), (true, 2)] {
        let c = if overlapped { 2 * d_hd } else { d_hd };
        let ape = rng.vec(c * ratio);
        let (file, refs) = weights(&[
            ("ape", vec![c as u64, ratio as u64], ape.clone()),
            ("norm", vec![d_hd as u64], vec![1.0; d_hd]),
        ]);
        let op = Compress {
            kv: ValueId(0),
            gate: ValueId(1),
            ape: refs[0].clone(),
            norm: refs[1].clone(),
            state_kv: StateId(0),
            state_score: StateId(1),
            rows: StateId(2),
            ratio,
            head_dim: d_hd,
            overlapped,
            rope: RopeConfig {
                base: 10000.0,
                yarn: None,
                n_rot: 8,
            },
            rounding: RowRounding::None,
            eps: 1e-6,
        };
        let coff = if overlapped { 2 } else { 1 };
        let mut skv = vec![0f32; coff * ratio * c];
        let mut ssc = vec![EMPTY_SCORE; coff * ratio * c];
        let mut rows = vec![f32::NAN; 8 * d_hd];
        let n = 3 * ratio + 1;
        let kv = rng.vec(n * c);
        let gate = rng.vec(n * c);
        // Two steps (split mid-window) must equal one.
        let split = ratio + 1;
        for (p0, len) in [(0usize, split), (split, n - split)] {
            let st = CompressState {
                kv: &mut skv,
                score: &mut ssc,
                rows: &mut rows,
            };
            op.compute(
                &file,
                &kv[p0 * c..(p0 + len) * c],
                &gate[p0 * c..(p0 + len) * c],
                p0,
                len,
                st,
            );
        }
        let freqs = frequencies(&op.rope);
        for wdw in 0..3 {
            // Candidates (token, column offset) of window wdw.
            let mut cands: Vec<(usize, usize)> = Vec::new();
            if overlapped && wdw > 0 {
                cands.extend(((wdw - 1) * ratio..wdw * ratio).map(|t| (t, 0)));
            }
            cands.extend(
                (wdw * ratio..(wdw + 1) * ratio).map(|t| (t, if overlapped { d_hd } else { 0 })),
            );
            let mut pooled = vec![0f32; d_hd];
            for (j, pj) in pooled.iter_mut().enumerate() {
                let z: Vec<f64> = cands
                    .iter()
                    .map(|&(t, off)| {
                        gate[t * c + off + j] as f64 + ape[(t % ratio) * c + off + j] as f64
                    })
                    .collect();
                let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = z.iter().map(|x| (x - m).exp()).sum();
                *pj = (cands
                    .iter()
                    .zip(&z)
                    .map(|(&(t, off), x)| (x - m).exp() * kv[t * c + off + j] as f64)
                    .sum::<f64>()
                    / den) as f32;
            }
            let ss: f64 = pooled.iter().map(|&x| x as f64 * x as f64).sum();
            let mut want: Vec<f32> = pooled
                .iter()
                .map(|&x| (x as f64 / (ss / d_hd as f64 + 1e-6).sqrt()) as f32)
                .collect();
            rotate(&mut want, &freqs, (wdw * ratio) as f64, false);
            for j in 0..d_hd {
                let got = rows[wdw * d_hd + j];
                assert!(
                    close(got, want[j] as f64, 1e-4),
                    "overlap {overlapped} ratio {ratio} window {wdw} dim {j}: {got} vs {}",
                    want[j]
                );
            }
        }
        assert!(rows[3 * d_hd].is_nan(), "no row for the incomplete window");
    }
}
