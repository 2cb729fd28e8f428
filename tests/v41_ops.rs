//! One-op tests of the V4.1-only ops (`Op::V41`): each CPU twin on
//! seeded random inputs against a direct float64 transcription of the
//! official formula written here, plus the state they carry across steps.

mod common;

use std::sync::Arc;

use common::rng::Rng;
use ds4::gguf::{GgufFile, GgufWriter, TensorRef};
use ds4::graph::ops::candidate::{CandidateBlocks, CandidateTopK};
use ds4::graph::ops::engram::{EngramGate, EngramHash, EngramHashLayout, EngramLookup};
use ds4::graph::ops::rope::RopeConfig;
use ds4::graph::ops::source_compress::{CompressWeights, Frontier, SourceCompress};
use ds4::graph::{StateId, ValueId};
use ds4::quant::GgmlType;

const V: ValueId = ValueId(0);
const S: StateId = StateId(0);

fn worst(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs() / (1.0 + w.abs()))
        .fold(0.0, f64::max)
}

fn rms(v: &[f64], eps: f64) -> f64 {
    1.0 / (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64 + eps).sqrt()
}

#[test]
fn engram_gate_matches_the_official_formula() {
    let (n, d, t) = (4, 64, 5);
    let mut r = Rng(0x5eed_0001);
    let state = r.vec(t * n * d);
    let kv: Vec<f32> = r.vec(t * (n + 1) * d).iter().map(|x| x * 3.0).collect();
    let qw: Vec<f32> = (0..n * d).map(|_| 1.0 + 0.2 * r.f()).collect();
    let kw: Vec<f32> = (0..n * d).map(|_| 1.0 + 0.2 * r.f()).collect();
    let op = EngramGate {
        state: V,
        kv: V,
        q_weight: dummy_ref(),
        k_weight: dummy_ref(),
        n_hc: n,
        dim: d,
        eps: 1e-20,
        out: V,
    };
    let mut out = vec![0f32; t * n * d];
    op.compute_with(&qw, &kw, &state, &kv, t, &mut out);
    let mut want = vec![0f64; t * n * d];
    let mut gates = Vec::new();
    for ti in 0..t {
        let value: Vec<f64> = (0..d)
            .map(|i| kv[ti * (n + 1) * d + n * d + i] as f64)
            .collect();
        for h in 0..n {
            let x: Vec<f64> = (0..d).map(|i| state[(ti * n + h) * d + i] as f64).collect();
            let key: Vec<f64> = (0..d)
                .map(|i| kv[ti * (n + 1) * d + h * d + i] as f64)
                .collect();
            let dot: f64 = (0..d)
                .map(|i| x[i] * qw[h * d + i] as f64 * kw[h * d + i] as f64 * key[i])
                .sum::<f64>()
                * rms(&x, 1e-20)
                * rms(&key, 1e-20)
                / (d as f64).sqrt();
            let g = 1.0 / (1.0 + (-(dot.abs().max(1e-6).sqrt().copysign(dot))).exp());
            gates.push(g);
            for i in 0..d {
                want[(ti * n + h) * d + i] = x[i] + g * value[i];
            }
        }
    }
    // The gates spread: some streams shut, some open.
    let (lo, hi) = gates
        .iter()
        .fold((1f64, 0f64), |a, &g| (a.0.min(g), a.1.max(g)));
    assert!(lo < 0.4 && hi > 0.6, "gates {lo}..{hi}");
    let e = worst(&out, &want);
    assert!(e < 2e-6, "engram gate: worst relative error {e:.3e}");
}

fn dummy_ref() -> TensorRef {
    TensorRef {
        name: "unused".into(),
        ty: GgmlType::F32,
        ne: [1, 1, 1, 1],
        offset: 0,
        n_bytes: 4,
    }
}

/// E4M3FN decoded from its definition, independently of the crate's tables.
fn e4m3(b: u8) -> f64 {
    let (s, e, m) = ((b >> 7) & 1, ((b >> 3) & 15) as i32, (b & 7) as f64);
    let v = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

#[test]
fn engram_lookup_reads_rows_by_id_and_zeroes_the_rest() {
    let (hd, rows, cols, layers, t) = (64usize, 37usize, 3usize, 2usize, 4usize);
    let rb = hd + hd / 32;
    let mut r = Rng(0x5eed_0002);
    let mut table = vec![0u8; rows * rb];
    for row in table.chunks_exact_mut(rb) {
        for c in &mut row[..hd] {
            let mut b = (r.next_u64() & 0xff) as u8;
            if b & 0x7f == 0x7f {
                b ^= 1;
            }
            *c = b;
        }
        for s in &mut row[hd..] {
            *s = 120 + (r.next_u64() % 10) as u8;
        }
    }
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[rb as u64, rows as u64], GgmlType::I8, table.clone())
        .unwrap();
    let f = GgufFile::from_vec(w.to_bytes().unwrap()).unwrap();
    let info = f.tensor_info("t").unwrap();
    let tref = TensorRef {
        name: "t".into(),
        ty: GgmlType::I8,
        ne: [rb as u64, rows as u64, 1, 1],
        offset: f.data_offset() + info.offset,
        n_bytes: info.n_bytes,
    };
    // Ids for both layers; layer slot 1 is read; some ids out of range.
    let mut ids = Vec::new();
    for _ in 0..t * layers * cols {
        ids.push((r.next_u64() % (rows as u64 + 5)) as i32);
    }
    ids[layers * cols + cols] = -3;
    let op = EngramLookup {
        rows: V,
        slot: 1,
        n_layers: layers,
        cols,
        head_dim: hd,
        table: tref,
        out: V,
    };
    let mut out = vec![f32::NAN; t * cols * hd];
    op.compute(&f, &ids, t, &mut out);
    let mut want = vec![0f64; t * cols * hd];
    for ti in 0..t {
        for c in 0..cols {
            let id = ids[ti * layers * cols + cols + c];
            if id < 0 || id as usize >= rows {
                continue;
            }
            let row = &table[id as usize * rb..(id as usize + 1) * rb];
            for j in 0..hd {
                want[(ti * cols + c) * hd + j] =
                    e4m3(row[j]) * 2f64.powi(row[hd + j / 32] as i32 - 127);
            }
        }
    }
    // E4M3 times a power of two is exact in bf16: equality, not tolerance.
    assert_eq!(worst(&out, &want), 0.0);
}

#[test]
fn engram_hash_carries_its_history_across_steps() {
    let layout = Arc::new(EngramHashLayout {
        token_map: Arc::from((0..500u32).map(|i| (i * 37 + 11) % 97).collect::<Vec<_>>()),
        pad_id: 5,
        max_ngram: 4,
        n_heads: 3,
        n_layers: 2,
        primes: vec![
            101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181,
            191,
        ],
        multipliers: vec![7, 11, 13, 17, 19, 23, 29, 31],
    });
    let op = EngramHash {
        tokens: V,
        history: S,
        layout: layout.clone(),
        out: V,
    };
    let mut r = Rng(0x5eed_0003);
    let toks: Vec<i32> = (0..20).map(|_| (r.next_u64() % 500) as i32).collect();
    let per = 2 * 9;
    let mut whole = vec![0i32; toks.len() * per];
    let mut hist = vec![-1f32; 3];
    op.compute(&toks, &mut hist, &mut whole);
    let mut parts = vec![0i32; toks.len() * per];
    let mut hist2 = vec![-1f32; 3];
    for (i, chunk) in toks.chunks(7).enumerate() {
        op.compute(
            chunk,
            &mut hist2,
            &mut parts[i * 7 * per..(i * 7 + chunk.len()) * per],
        );
    }
    assert_eq!(whole, parts);
    assert_eq!(hist, hist2);
    // Token 5 by hand: its n-grams are tokens 5, 4, 3, 2 (compressed), layer 0.
    let c = |i: usize| ((toks[i] as u64) * 37 + 11) % 97;
    let mut h = c(5) * 7;
    let mut want = Vec::new();
    let mut off = 0;
    for (j, prev) in [4usize, 3, 2].iter().enumerate() {
        h ^= c(*prev) * [11, 13, 17][j];
        for k in 0..3 {
            let p = [101u64, 103, 107, 109, 113, 127, 131, 137, 139][j * 3 + k];
            want.push((h % p + off) as i32);
            off += p;
        }
    }
    assert_eq!(&whole[5 * per..5 * per + 9], &want[..]);
    // Every id stays inside its layer's table.
    let rows0: u64 = layout.primes[..9].iter().sum();
    for row in whole.chunks(per) {
        assert!(row[..9].iter().all(|&x| (0..rows0 as i32).contains(&x)));
    }
}

/// Independent compressor: pool whole groups, norm, index key, rope.
#[allow(clippy::too_many_arguments)]
fn compress_ref(
    kv: &[f32],
    gate: &[f32],
    ratio: usize,
    hd: usize,
    ihd: usize,
    w: &CompressWeights,
    n_rot: usize,
    base: f64,
    n_tokens: usize,
) -> (Vec<f64>, Vec<f64>) {
    let groups = n_tokens / ratio;
    let (mut rows, mut keys) = (Vec::new(), Vec::new());
    let rope = |v: &mut Vec<f64>, pos: f64| {
        let n = v.len();
        for k in 0..n_rot / 2 {
            let a = pos * base.powf(-2.0 * k as f64 / n_rot as f64);
            let (x0, x1) = (v[n - n_rot + 2 * k], v[n - n_rot + 2 * k + 1]);
            v[n - n_rot + 2 * k] = x0 * a.cos() - x1 * a.sin();
            v[n - n_rot + 2 * k + 1] = x0 * a.sin() + x1 * a.cos();
        }
    };
    for j in 0..groups {
        let mut lat = vec![0f64; hd];
        for (c, l) in lat.iter_mut().enumerate() {
            if ratio == 1 {
                *l = kv[j * hd + c] as f64;
                continue;
            }
            let s: Vec<f64> = (0..ratio)
                .map(|i| gate[(j * ratio + i) * hd + c] as f64)
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            *l = (0..ratio)
                .map(|i| (s[i] - m).exp() / z * kv[(j * ratio + i) * hd + c] as f64)
                .sum();
        }
        let sc = rms(&lat, 1e-20);
        let mut lat: Vec<f64> = lat
            .iter()
            .zip(&w.norm)
            .map(|(x, &g)| x * sc * g as f64)
            .collect();
        let mut key: Vec<f64> = (0..ihd)
            .map(|i| (0..hd).map(|c| w.wk[i * hd + c] as f64 * lat[c]).sum())
            .collect();
        let sk = rms(&key, 1e-20);
        key = key
            .iter()
            .zip(&w.index_norm)
            .map(|(x, &g)| x * sk * g as f64)
            .collect();
        rope(&mut key, (j * ratio) as f64);
        rope(&mut lat, (j * ratio) as f64);
        rows.extend(lat);
        keys.extend(key);
    }
    (rows, keys)
}

#[test]
fn source_compressor_pools_norms_and_keys_in_any_step_split() {
    let (hd, ihd, n_rot, t) = (32usize, 16usize, 8usize, 11usize);
    let mut r = Rng(0x5eed_0004);
    let w = CompressWeights {
        norm: (0..hd).map(|_| 1.0 + 0.1 * r.f()).collect(),
        wk: r.vec(ihd * hd).iter().map(|x| x * 0.3).collect(),
        index_norm: (0..ihd).map(|_| 1.0 + 0.1 * r.f()).collect(),
    };
    let kv = r.vec(t * hd);
    let gate: Vec<f32> = r.vec(t * hd).iter().map(|x| x * 2.0).collect();
    for ratio in [1usize, 2, 3] {
        let op = SourceCompress {
            kv: V,
            gate: (ratio > 1).then_some(V),
            norm: dummy_ref(),
            index_wk: dummy_ref(),
            index_norm: dummy_ref(),
            frontier: (ratio > 1).then_some(Frontier { kv: S, score: S }),
            rows: S,
            index_rows: S,
            ratio,
            head_dim: hd,
            index_head_dim: ihd,
            rope: RopeConfig {
                base: 160000.0,
                yarn: None,
                n_rot,
            },
            eps: 1e-20,
            round_rows: false,
        };
        let (want_rows, want_keys) =
            compress_ref(&kv, &gate, ratio, hd, ihd, &w, n_rot, 160000.0, t);
        for split in [t, 1, 4] {
            let cap = t + 2;
            let (mut rows, mut keys) = (vec![0f32; cap * hd], vec![0f32; cap * ihd]);
            let (mut fk, mut fs) = (vec![0f32; ratio * hd], vec![f32::NEG_INFINITY; ratio * hd]);
            let mut pos = 0;
            while pos < t {
                let n = split.min(t - pos);
                op.compute(
                    &w,
                    &kv[pos * hd..(pos + n) * hd],
                    (ratio > 1).then(|| &gate[pos * hd..(pos + n) * hd]),
                    pos,
                    n,
                    (ratio > 1).then_some((fk.as_mut_slice(), fs.as_mut_slice())),
                    &mut rows,
                    &mut keys,
                );
                pos += n;
            }
            let groups = t / ratio;
            let e1 = worst(&rows[..groups * hd], &want_rows);
            let e2 = worst(&keys[..groups * ihd], &want_keys);
            assert!(
                e1 < 2e-6 && e2 < 2e-6,
                "ratio {ratio}, steps of {split}: rows {e1:.2e}, keys {e2:.2e}"
            );
            // Nothing is written past the last whole group.
            assert!(rows[groups * hd..].iter().all(|&x| x == 0.0));
        }
    }
}

/// Scores as the official indexer: Σ_h relu(q_h·k)·w_h, −inf where not visible.
#[allow(clippy::too_many_arguments)]
fn scores(
    q: &[f32],
    w: &[f32],
    k: &[f32],
    t: usize,
    n_rows: usize,
    nh: usize,
    hd: usize,
    v: usize,
) -> Vec<f64> {
    (0..n_rows)
        .map(|r| {
            if r >= v {
                return f64::NEG_INFINITY;
            }
            (0..nh)
                .map(|h| {
                    let d: f64 = (0..hd)
                        .map(|i| q[t * nh * hd + h * hd + i] as f64 * k[r * hd + i] as f64)
                        .sum();
                    d.max(0.0) * w[t * nh + h] as f64
                })
                .sum()
        })
        .collect()
}

fn top_low(s: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..s.len()).collect();
    idx.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[test]
fn candidate_blocks_and_restricted_topk_match_the_official_two_levels() {
    let (nh, hd, ratio, bs, kb, k, n_tokens) =
        (3usize, 16usize, 1usize, 4usize, 3usize, 6usize, 40usize);
    let mut r = Rng(0x5eed_0005);
    let n_rows = n_tokens / ratio;
    let keys = r.vec(n_rows * hd);
    let q = r.vec(n_tokens * nh * hd);
    let w: Vec<f32> = (0..n_tokens * nh).map(|_| 0.5 + r.f().abs()).collect();
    let blocks_op = CandidateBlocks {
        q: V,
        weights: V,
        rows: S,
        ratio,
        n_head: nh,
        head_dim: hd,
        topk_blocks: kb,
        block_size: bs,
        out: V,
    };
    let topk_op = CandidateTopK {
        q: V,
        weights: V,
        rows: S,
        blocks: V,
        ratio,
        top_k: k,
        n_head: nh,
        head_dim: hd,
        topk_blocks: kb,
        block_size: bs,
        out: V,
    };
    let mut blocks = vec![0i32; n_tokens * kb];
    blocks_op.compute(&q, &w, &keys, 0, n_tokens, &mut blocks);
    let mut sel = vec![0i32; n_tokens * k];
    topk_op.compute(&q, &w, &keys, &blocks, 0, n_tokens, &mut sel);
    let mut restricted = 0;
    for t in 0..n_tokens {
        let v = (t + 1) / ratio;
        let s = scores(&q, &w, &keys, t, n_rows, nh, hd, v);
        // Level one, as select_candidate_blocks: block maxima, newest pinned.
        let nb = n_rows.div_ceil(bs);
        let mut bm: Vec<f64> = (0..nb)
            .map(|b| {
                (b * bs..((b + 1) * bs).min(n_rows))
                    .map(|r| s[r])
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect();
        if v >= 1 {
            bm[(v - 1) / bs] = f64::INFINITY;
        }
        let mut keep: Vec<usize> = top_low(&bm, kb.min(nb))
            .into_iter()
            .filter(|&b| bm[b] > f64::NEG_INFINITY)
            .collect();
        keep.sort_unstable();
        let got: Vec<usize> = blocks[t * kb..(t + 1) * kb]
            .iter()
            .filter(|&&b| b >= 0)
            .map(|&b| b as usize)
            .collect();
        assert_eq!(got, keep, "blocks at {t}");
        // Level two: only candidate rows, top-k of them, ascending.
        let masked: Vec<f64> = (0..n_rows)
            .map(|r| {
                if keep.contains(&(r / bs)) {
                    s[r]
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let kk = k.min(n_tokens / ratio);
        let mut want: Vec<usize> = top_low(&masked, kk)
            .into_iter()
            .filter(|&r| masked[r].is_finite())
            .collect();
        want.sort_unstable();
        let got: Vec<usize> = sel[t * k..(t + 1) * k]
            .iter()
            .filter(|&&r| r >= 0)
            .map(|&r| r as usize)
            .collect();
        assert_eq!(got, want, "rows at {t}");
        if v > kb * bs {
            restricted += 1;
        }
    }
    assert!(
        restricted > 20,
        "too few positions where the candidates restrict"
    );
}
