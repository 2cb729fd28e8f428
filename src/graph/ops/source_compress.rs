//! DeepSeek V4.1's compressor of kv-source layers (docs/V41.md): one
//! compressor writes both the compressed latent rows and the index keys.

use super::norm::rms_norm;
use super::rope::{frequencies, rotate, RopeConfig};
use super::CpuCx;
use crate::gguf::TensorRef;
use crate::graph::{StateId, ValueId};
use crate::quant::small_float::{self};

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
pub struct SourceCompress {
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

impl SourceCompress {
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
    /// and `gate`): what [`SourceCompress::compute`] leaves in the frontier,
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
