//! The ops only DeepSeek V4.1 needs (docs/V41.md), each with its CPU twin.
//! Everything whose math is V4's (norms, matmuls, RoPE, the HC mixer,
//! collapse and expand, attention with sinks, the indexer's own top-k, the
//! router and experts) is shared with V4 and not repeated here.
//!
//! They travel in the graph as one [`Op::V41`](super::Op::V41) variant so a
//! backend that has no kernels for them yet says so in one place. The Engram
//! table is read through the file by row (`GgufFile::raw_bytes`), never listed
//! among an op's weights: a backend must not upload or map it whole.

use std::sync::Arc;

use super::norm::rms_norm;
use super::rope::{frequencies, rotate, RopeConfig};
use super::CpuCx;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::{StateId, ValueId};
use crate::quant::small_float::{self, e4m3_decode, e8m0_decode};

/// The V4.1-only ops.
#[derive(Clone, Debug)]
pub enum V41Op {
    HcOneHot(HcOneHot),
    EngramHash(EngramHash),
    EngramLookup(EngramLookup),
    EngramGate(EngramGate),
    Compress(V41Compress),
    CandidateBlocks(CandidateBlocks),
    CandidateTopK(CandidateTopK),
}

impl V41Op {
    pub fn inputs(&self) -> Vec<ValueId> {
        match self {
            V41Op::HcOneHot(_) => vec![],
            V41Op::EngramHash(o) => vec![o.tokens],
            V41Op::EngramLookup(o) => vec![o.rows],
            V41Op::EngramGate(o) => vec![o.state, o.kv],
            V41Op::Compress(o) => {
                let mut v = vec![o.kv];
                v.extend(o.gate);
                v
            }
            V41Op::CandidateBlocks(o) => vec![o.q, o.weights],
            V41Op::CandidateTopK(o) => vec![o.q, o.weights, o.blocks],
        }
    }

    pub fn outputs(&self) -> Vec<ValueId> {
        match self {
            V41Op::HcOneHot(o) => vec![o.out],
            V41Op::EngramHash(o) => vec![o.out],
            V41Op::EngramLookup(o) => vec![o.out],
            V41Op::EngramGate(o) => vec![o.out],
            V41Op::Compress(_) => vec![],
            V41Op::CandidateBlocks(o) => vec![o.out],
            V41Op::CandidateTopK(o) => vec![o.out],
        }
    }

    pub fn states(&self) -> Vec<StateId> {
        match self {
            V41Op::EngramHash(o) => vec![o.history],
            V41Op::Compress(o) => {
                let mut v = vec![o.rows, o.index_rows];
                v.extend(o.frontier.map(|f| f.kv));
                v.extend(o.frontier.map(|f| f.score));
                v
            }
            V41Op::CandidateBlocks(o) => vec![o.rows],
            V41Op::CandidateTopK(o) => vec![o.rows],
            _ => vec![],
        }
    }

    /// Weights to upload. The Engram table is deliberately absent.
    pub fn weights(&self) -> Vec<&TensorRef> {
        match self {
            V41Op::EngramGate(o) => vec![&o.q_weight, &o.k_weight],
            V41Op::Compress(o) => vec![&o.index_wk, &o.norm, &o.index_norm],
            _ => vec![],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            V41Op::HcOneHot(_) => "v41_hc_one_hot",
            V41Op::EngramHash(_) => "v41_engram_hash",
            V41Op::EngramLookup(_) => "v41_engram_lookup",
            V41Op::EngramGate(_) => "v41_engram_gate",
            V41Op::Compress(_) => "v41_compress",
            V41Op::CandidateBlocks(_) => "v41_candidate_blocks",
            V41Op::CandidateTopK(_) => "v41_candidate_topk",
        }
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        match self {
            V41Op::HcOneHot(o) => o.cpu(cx),
            V41Op::EngramHash(o) => o.cpu(cx),
            V41Op::EngramLookup(o) => o.cpu(cx),
            V41Op::EngramGate(o) => o.cpu(cx),
            V41Op::Compress(o) => o.cpu(cx),
            V41Op::CandidateBlocks(o) => o.cpu(cx),
            V41Op::CandidateTopK(o) => o.cpu(cx),
        }
    }
}

/// The first sublayer's collapse weights of lagged hyper-connections: stream
/// 0 only (`[1, 0, …]` per token), as the official `make_identity_pre_mix`.
#[derive(Clone, Debug)]
pub struct HcOneHot {
    pub out: ValueId,
    pub n_hc: usize,
}

impl HcOneHot {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |_, out| self.compute(n, out));
    }

    pub fn compute(&self, n_tokens: usize, out: &mut [f32]) {
        for row in out[..n_tokens * self.n_hc].chunks_exact_mut(self.n_hc) {
            row.fill(0.0);
            row[0] = 1.0;
        }
    }
}

/// The Engram hash constants of every Engram layer (research §2.5).
#[derive(Clone, Debug, PartialEq)]
pub struct EngramHashLayout {
    /// Raw token id → compressed id.
    pub token_map: Arc<[u32]>,
    /// The pad, a compressed id.
    pub pad_id: u32,
    pub max_ngram: usize,
    pub n_heads: usize,
    pub n_layers: usize,
    /// `n_layers × (max_ngram − 1)·n_heads`, layer-major.
    pub primes: Vec<u64>,
    /// `n_layers × max_ngram`, layer-major.
    pub multipliers: Vec<u64>,
}

impl EngramHashLayout {
    pub fn cols(&self) -> usize {
        (self.max_ngram - 1) * self.n_heads
    }

    /// Rows of one token for every layer, appended to `out`. `tail` holds the
    /// compressed ids of the previous `max_ngram − 1` tokens, newest first
    /// (`None`: before the sequence, or a dead token), and is advanced.
    /// `current` is this token's compressed id (`None` when dead).
    pub fn hash_token(&self, tail: &mut [Option<u32>], current: Option<u32>, out: &mut Vec<u32>) {
        let mut ids = [0u64; 16];
        let mut blocked = false;
        for (j, id) in ids.iter_mut().enumerate().take(self.max_ngram) {
            let c = if j == 0 { current } else { tail[j - 1] };
            blocked |= c.is_none();
            *id = if blocked { self.pad_id } else { c.unwrap_or(0) } as u64;
        }
        let cols = self.cols();
        for l in 0..self.n_layers {
            let m = &self.multipliers[l * self.max_ngram..(l + 1) * self.max_ngram];
            let primes = &self.primes[l * cols..(l + 1) * cols];
            let mut hash = ids[0].wrapping_mul(m[0]);
            let mut offset = 0u64;
            for j in 1..self.max_ngram {
                hash ^= ids[j].wrapping_mul(m[j]);
                for h in 0..self.n_heads {
                    let p = primes[(j - 1) * self.n_heads + h];
                    out.push((hash % p + offset) as u32);
                    offset += p;
                }
            }
        }
        tail.rotate_right(1);
        if let Some(first) = tail.first_mut() {
            *first = current;
        }
    }
}

/// Token ids → Engram table rows of every Engram layer (`[T, layers·cols]`,
/// i32). The history of the last `max_ngram − 1` compressed ids lives in a
/// one-row state (−1 = none), so decode steps continue the prompt's n-grams.
/// The rows are known as soon as the ids are: a host prefetcher runs the
/// same [`EngramHashLayout::hash_token`].
#[derive(Clone, Debug)]
pub struct EngramHash {
    pub tokens: ValueId,
    pub history: StateId,
    pub layout: Arc<EngramHashLayout>,
    pub out: ValueId,
}

impl EngramHash {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        let mut hist = cx.take_state(self.history);
        cx.write_i32(self.out, |cx, out| {
            self.compute(&cx.get_i32(self.tokens)[..n], &mut hist, out)
        });
        cx.put_state(self.history, hist);
    }

    pub fn compute(&self, tokens: &[i32], history: &mut [f32], out: &mut [i32]) {
        let l = &self.layout;
        let mut tail: Vec<Option<u32>> = history
            .iter()
            .map(|&h| (h >= 0.0).then_some(h as u32))
            .collect();
        let mut rows = Vec::with_capacity(l.n_layers * l.cols());
        for (t, &tok) in tokens.iter().enumerate() {
            rows.clear();
            let current = usize::try_from(tok)
                .ok()
                .and_then(|i| l.token_map.get(i).copied());
            l.hash_token(&mut tail, current, &mut rows);
            for (o, &r) in out[t * rows.len()..(t + 1) * rows.len()]
                .iter_mut()
                .zip(&rows)
            {
                *o = r as i32;
            }
        }
        for (h, t) in history.iter_mut().zip(&tail) {
            *h = t.map_or(-1.0, |c| c as f32);
        }
    }
}

/// One Engram layer's rows, read from the table by row and dequantised
/// (E4M3 × E8M0 per 32, rounded to bf16 as the reference's lookup), then
/// concatenated column after column: `[T, cols·head_dim]`. A row id outside
/// the table, or a NaN code or scale, reads as zeros (the official lookup
/// zeroes out-of-range ids; the converter refuses NaNs).
#[derive(Clone, Debug)]
pub struct EngramLookup {
    pub rows: ValueId,
    /// Which Engram layer's columns of `rows` to read.
    pub slot: usize,
    pub n_layers: usize,
    pub cols: usize,
    pub head_dim: usize,
    pub table: TensorRef,
    pub out: ValueId,
}

impl EngramLookup {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, cx.get_i32(self.rows), n, out)
        });
    }

    pub fn compute(&self, file: &GgufFile, rows: &[i32], n_tokens: usize, out: &mut [f32]) {
        let hd = self.head_dim;
        let row_bytes = self.table.ne[0];
        let n_rows = self.table.ne[1];
        let stride = self.n_layers * self.cols;
        for t in 0..n_tokens {
            for c in 0..self.cols {
                let r = rows[t * stride + self.slot * self.cols + c];
                let o = &mut out[(t * self.cols + c) * hd..(t * self.cols + c + 1) * hd];
                o.fill(0.0);
                if r < 0 || r as u64 >= n_rows {
                    continue;
                }
                let raw = file.raw_bytes(self.table.offset + r as u64 * row_bytes, row_bytes);
                if raw.len() as u64 == row_bytes && decode_row(raw, hd, o).is_none() {
                    o.fill(0.0);
                }
            }
        }
    }
}

/// Decodes one stored Engram row (`head_dim` E4M3 codes, then one E8M0
/// scale per 32) to floats rounded to bf16; `None` for a NaN code or scale.
pub fn decode_row(row: &[u8], head_dim: usize, out: &mut [f32]) -> Option<()> {
    let (codes, scales) = row.split_at(head_dim);
    for (j, (&c, o)) in codes.iter().zip(out.iter_mut()).enumerate() {
        let s = scales[j / 32];
        if c & 0x7f == 0x7f || s == 255 {
            return None;
        }
        *o = half::bf16::from_f32(e4m3_decode(c) * e8m0_decode(s)).to_f32();
    }
    Some(())
}

/// The Engram gate (official `Engram.forward`): with `key_h` and the shared
/// `value` split out of `kv = wkv(rows)`, every stream h of the state gets
/// `gate_h · value`, where `gate_h = σ(signed √ of max(|dot_h|, 1e-6))` and
/// `dot_h = Σ x_h·q_w·k_w·key_h · rstd(x_h) · rstd(key_h) / √D`, each rstd
/// over that stream's own D values.
#[derive(Clone, Debug)]
pub struct EngramGate {
    pub state: ValueId,
    pub kv: ValueId,
    /// `[D, n_hc]` (GGUF order): the official `q_weight` and `k_weight`,
    /// only ever used as their product.
    pub q_weight: TensorRef,
    pub k_weight: TensorRef,
    pub n_hc: usize,
    pub dim: usize,
    pub eps: f32,
    pub out: ValueId,
}

impl EngramGate {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, cx.get(self.state), cx.get(self.kv), n, out)
        });
    }

    pub fn compute(
        &self,
        file: &GgufFile,
        state: &[f32],
        kv: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) {
        let qw = super::load_f32(file, &self.q_weight);
        let kw = super::load_f32(file, &self.k_weight);
        self.compute_with(&qw, &kw, state, kv, n_tokens, out);
    }

    /// The gate with its two weight vectors given (`[n_hc · D]` each).
    pub fn compute_with(
        &self,
        qw: &[f32],
        kw: &[f32],
        state: &[f32],
        kv: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) {
        let (n, d) = (self.n_hc, self.dim);
        let ms = |v: &[f32]| v.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
        for t in 0..n_tokens {
            let kvt = &kv[t * (n + 1) * d..(t + 1) * (n + 1) * d];
            let value = &kvt[n * d..];
            for h in 0..n {
                let x = &state[(t * n + h) * d..(t * n + h + 1) * d];
                let key = &kvt[h * d..(h + 1) * d];
                let w = |i: usize| qw[h * d + i] as f64 * kw[h * d + i] as f64;
                let raw: f64 = (0..d).map(|i| x[i] as f64 * w(i) * key[i] as f64).sum();
                let rstd =
                    1.0 / (ms(x) + self.eps as f64).sqrt() / (ms(key) + self.eps as f64).sqrt();
                let dot = raw * rstd / (d as f64).sqrt();
                let g = dot.abs().max(1e-6).sqrt().copysign(dot);
                let gate = (1.0 / (1.0 + (-g).exp())) as f32;
                let o = &mut out[(t * n + h) * d..(t * n + h + 1) * d];
                for ((o, &xi), &v) in o.iter_mut().zip(x).zip(value) {
                    *o = xi + gate * v;
                }
            }
        }
    }
}

/// A kv-source layer's frontier (ratio > 1): the partial group's projected
/// rows and gate scores, `ratio × head_dim` each, slot = position mod ratio.
#[derive(Clone, Copy, Debug)]
pub struct Frontier {
    pub kv: StateId,
    pub score: StateId,
}

/// The V4.1 compressor of a kv-source layer (official `Compressor` plus the
/// index-key half of `Indexer`): ratio 1 normalises each token's projection;
/// ratio r > 1 pools each whole group of r tokens with a per-channel softmax
/// of its gate scores, then normalises. Group j stands for position j·r.
/// From the pre-RoPE latent it writes the index key
/// `rope(k_norm(wk · latent))` to `index_rows[j]`, then the roped latent to
/// `rows[j]`. No APE, no overlap, no second compressor (unlike V4).
#[derive(Clone, Debug)]
pub struct V41Compress {
    /// The step's `wkv` projections, `[T, head_dim]`.
    pub kv: ValueId,
    /// The step's `wgate` scores (ratio > 1 only).
    pub gate: Option<ValueId>,
    pub norm: TensorRef,
    /// `indexer.wk`, `[head_dim, index_head_dim]` (GGUF order).
    pub index_wk: TensorRef,
    pub index_norm: TensorRef,
    pub frontier: Option<Frontier>,
    pub rows: StateId,
    pub index_rows: StateId,
    pub ratio: usize,
    pub head_dim: usize,
    pub index_head_dim: usize,
    pub rope: RopeConfig,
    pub eps: f32,
    /// `--numerics model`: after their RoPE, the latent goes through FP4
    /// with E4M3 scales in blocks of 16 and the index key through FP4 with
    /// UE8M0 scales in blocks of 32 (the official `fp4_act_quant` calls).
    pub round_rows: bool,
}

/// The block of the official FP4 round trip of a compressed latent.
pub const LATENT_FP4_BLOCK: usize = 16;
/// The block of the official FP4 round trip of an index key or query.
pub const INDEX_FP4_BLOCK: usize = 32;

/// The V4.1 compressor's weights, widened to f32.
pub struct CompressWeights {
    pub norm: Vec<f32>,
    pub wk: Vec<f32>,
    pub index_norm: Vec<f32>,
}

impl V41Compress {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        let w = CompressWeights {
            norm: super::load_f32(cx.file, &self.norm),
            wk: super::load_f32(cx.file, &self.index_wk),
            index_norm: super::load_f32(cx.file, &self.index_norm),
        };
        let mut rows = cx.take_state(self.rows);
        let mut irows = cx.take_state(self.index_rows);
        let mut fr = self
            .frontier
            .map(|f| (cx.take_state(f.kv), cx.take_state(f.score)));
        {
            let kv = cx.get(self.kv);
            let gate = self.gate.map(|g| cx.get(g));
            self.compute(
                &w,
                kv,
                gate,
                pos0,
                n,
                fr.as_mut()
                    .map(|(a, b)| (a.as_mut_slice(), b.as_mut_slice())),
                &mut rows,
                &mut irows,
            );
        }
        cx.put_state(self.rows, rows);
        cx.put_state(self.index_rows, irows);
        if let (Some(f), Some((a, b))) = (self.frontier, fr) {
            cx.put_state(f.kv, a);
            cx.put_state(f.score, b);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        w: &CompressWeights,
        kv: &[f32],
        gate: Option<&[f32]>,
        pos0: usize,
        n_tokens: usize,
        mut frontier: Option<(&mut [f32], &mut [f32])>,
        rows: &mut [f32],
        index_rows: &mut [f32],
    ) {
        let (hd, ihd, r) = (self.head_dim, self.index_head_dim, self.ratio);
        let freqs = frequencies(&self.rope);
        let capacity = rows.len() / hd;
        let mut latent = vec![0f32; hd];
        let mut normed = vec![0f32; hd];
        let mut key = vec![0f32; ihd];
        let mut key_n = vec![0f32; ihd];
        for t in 0..n_tokens {
            let p = pos0 + t;
            let x = &kv[t * hd..(t + 1) * hd];
            if r <= 1 {
                latent.copy_from_slice(x);
            } else {
                let (Some((fk, fs)), Some(g)) = (frontier.as_mut(), gate) else {
                    continue;
                };
                self.put_slot(x, &g[t * hd..(t + 1) * hd], p, fk, fs);
                if (p + 1) % r != 0 {
                    continue;
                }
                for c in 0..hd {
                    let m = (0..r)
                        .map(|s| fs[s * hd + c])
                        .fold(f32::NEG_INFINITY, f32::max);
                    let (mut num, mut den) = (0f32, 0f32);
                    for s in 0..r {
                        let e = (fs[s * hd + c] - m).exp();
                        den += e;
                        num += e * fk[s * hd + c];
                    }
                    latent[c] = num / den;
                }
            }
            let j = p / r.max(1);
            if j >= capacity {
                continue;
            }
            rms_norm(&latent, Some(&w.norm), hd, self.eps, &mut normed);
            for (i, k) in key.iter_mut().enumerate() {
                *k = super::dot(&w.wk[i * hd..(i + 1) * hd], &normed);
            }
            rms_norm(&key, Some(&w.index_norm), ihd, self.eps, &mut key_n);
            let at = (j * r.max(1)) as f64;
            rotate(&mut key_n, &freqs, at, false);
            rotate(&mut normed, &freqs, at, false);
            if self.round_rows {
                small_float::fp4_roundtrip_blocks(&mut key_n, INDEX_FP4_BLOCK);
                small_float::fp4_e4m3_roundtrip_blocks(&mut normed, LATENT_FP4_BLOCK);
            }
            index_rows[j * ihd..(j + 1) * ihd].copy_from_slice(&key_n);
            rows[j * hd..(j + 1) * hd].copy_from_slice(&normed);
        }
    }

    /// Token `p`'s slot of the partial group (ratio > 1): its latent row
    /// and its gate row, as they are.
    pub fn put_slot(
        &self,
        kv_row: &[f32],
        gate_row: &[f32],
        p: usize,
        fk: &mut [f32],
        fs: &mut [f32],
    ) {
        let (hd, slot) = (self.head_dim, p % self.ratio.max(1));
        fk[slot * hd..(slot + 1) * hd].copy_from_slice(kv_row);
        fs[slot * hd..(slot + 1) * hd].copy_from_slice(gate_row);
    }

    /// The partial group after tokens `pos0..pos0 + n` (their rows of `kv`
    /// and `gate`): what [`V41Compress::compute`] leaves in the frontier,
    /// without emitting rows. A speculative step's rollback replays its
    /// accepted rows with it.
    pub fn replay_frontier(
        &self,
        kv: &[f32],
        gate: &[f32],
        pos0: usize,
        n: usize,
        fk: &mut [f32],
        fs: &mut [f32],
    ) {
        let hd = self.head_dim;
        for t in 0..n {
            let rows = t * hd..(t + 1) * hd;
            self.put_slot(&kv[rows.clone()], &gate[rows], pos0 + t, fk, fs);
        }
    }
}

/// `score[t][r] = Σ_h w[t][h] · max(0, q[t][h] · k[r])`, exactly as
/// [`super::indexer::IndexerTopK`] sums it (so the two agree bit for bit).
fn index_score(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    t: usize,
    r: usize,
    nh: usize,
    hd: usize,
) -> f32 {
    let kr = &keys[r * hd..(r + 1) * hd];
    let mut s = 0f32;
    for h in 0..nh {
        let qh = &q[t * nh * hd + h * hd..t * nh * hd + (h + 1) * hd];
        s += w[t * nh + h] * super::dot(qh, kr).max(0.0);
    }
    s
}

/// Level one of the two-level top-k (official `select_candidate_blocks`):
/// over the `v = (p+1)/ratio` visible rows in blocks of `block_size`, the
/// block holding the newest row is always kept and the best `topk_blocks − 1`
/// others by their best row's score join it (ties: lower block). Output:
/// block ids ascending, −1 padded, `[T, topk_blocks]`.
#[derive(Clone, Debug)]
pub struct CandidateBlocks {
    pub q: ValueId,
    pub weights: ValueId,
    pub rows: StateId,
    pub ratio: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub topk_blocks: usize,
    pub block_size: usize,
    pub out: ValueId,
}

impl CandidateBlocks {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write_i32(self.out, |cx, out| {
            self.compute(
                cx.get(self.q),
                cx.get(self.weights),
                cx.state(self.rows),
                pos0,
                n,
                out,
            )
        });
    }

    pub fn compute(
        &self,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        pos0: usize,
        n_tokens: usize,
        out: &mut [i32],
    ) {
        let (kb, bs) = (self.topk_blocks, self.block_size);
        for t in 0..n_tokens {
            let o = &mut out[t * kb..(t + 1) * kb];
            o.fill(-1);
            let v = (pos0 + t + 1) / self.ratio;
            if v == 0 || kb == 0 {
                continue;
            }
            let nb = v.div_ceil(bs);
            let last = (v - 1) / bs;
            let mut best: Vec<(f32, usize)> = (0..nb)
                .filter(|&b| b != last)
                .map(|b| {
                    let m = (b * bs..((b + 1) * bs).min(v))
                        .map(|r| index_score(q, w, keys, t, r, self.n_head, self.head_dim))
                        .fold(f32::NEG_INFINITY, f32::max);
                    (m, b)
                })
                .collect();
            best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut chosen: Vec<usize> = std::iter::once(last)
                .chain(best.iter().map(|&(_, b)| b))
                .take(kb)
                .collect();
            chosen.sort_unstable();
            for (slot, b) in o.iter_mut().zip(chosen) {
                *slot = b as i32;
            }
        }
    }
}

/// Level two (official `Indexer` at index sources above the candidate
/// source): the `top_k` best rows among the visible rows of the candidate
/// blocks only (ties: lower row), all of them when no more than `top_k`.
/// Output as [`super::indexer::IndexerTopK`]'s: rows ascending, −1 padded.
#[derive(Clone, Debug)]
pub struct CandidateTopK {
    pub q: ValueId,
    pub weights: ValueId,
    pub rows: StateId,
    /// `CandidateBlocks`'s output.
    pub blocks: ValueId,
    pub ratio: usize,
    pub top_k: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub topk_blocks: usize,
    pub block_size: usize,
    pub out: ValueId,
}

impl CandidateTopK {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write_i32(self.out, |cx, out| {
            self.compute(
                cx.get(self.q),
                cx.get(self.weights),
                cx.state(self.rows),
                cx.get_i32(self.blocks),
                pos0,
                n,
                out,
            )
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        blocks: &[i32],
        pos0: usize,
        n_tokens: usize,
        out: &mut [i32],
    ) {
        let (k, kb, bs) = (self.top_k, self.topk_blocks, self.block_size);
        let mut cand: Vec<(f32, usize)> = Vec::new();
        for t in 0..n_tokens {
            let o = &mut out[t * k..(t + 1) * k];
            o.fill(-1);
            let v = (pos0 + t + 1) / self.ratio;
            cand.clear();
            for &b in &blocks[t * kb..(t + 1) * kb] {
                if b < 0 {
                    continue;
                }
                let b = b as usize;
                for r in b * bs..((b + 1) * bs).min(v) {
                    cand.push((0.0, r));
                }
            }
            if cand.len() > k {
                for c in cand.iter_mut() {
                    c.0 = index_score(q, w, keys, t, c.1, self.n_head, self.head_dim);
                }
                cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                cand.truncate(k);
            }
            let mut chosen: Vec<usize> = cand.iter().map(|&(_, r)| r).collect();
            chosen.sort_unstable();
            for (slot, r) in o.iter_mut().zip(chosen) {
                *slot = r as i32;
            }
        }
    }
}
