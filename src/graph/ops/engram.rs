//! DeepSeek V4.1's Engram (docs/V41.md, research §2.5): the n-gram hash
//! of the token ids, the table lookup by row and the gate that adds the
//! looked-up value to every hyper-connection stream. The table is read
//! through the file by row (`GgufFile::raw_bytes`), never listed among an
//! op's weights: a backend must not upload or map it whole.

use std::sync::Arc;

use super::CpuCx;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::{StateId, ValueId};
use crate::quant::small_float::{e4m3_decode, e8m0_decode};

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
