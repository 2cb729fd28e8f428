//! The KV compressor (MODEL.md §3.5.3): every `ratio` tokens, a gated softmax
//! pool of their projected rows becomes one compressed row. Overlapped (CSA)
//! compressors pool over two windows: the previous window's first half and the
//! current window's second half of each projected row.

use super::rope;
use super::CpuCx;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ops::rope::RopeConfig;
use crate::graph::{StateId, ValueId};
use crate::quant::small_float;

/// Score of an empty slot (ds4's initial state; weight 0 after softmax).
pub const EMPTY_SCORE: f32 = -1e30;

/// How an emitted row is rounded before it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowRounding {
    None,
    /// Attention rows: FP8 on the non-rotary dims, then f16.
    Fp8F16,
    /// Indexer rows: Hadamard + FP4, then f16.
    HadamardFp4F16,
}

/// Sequential compressor step over the tokens of a step. State: `state_kv` and
/// `state_score` hold `coff·ratio` slots of `width` values (for overlapped
/// compressors slots `0..ratio` are the previous window, `ratio..2·ratio` the
/// current one); emitted rows go to `rows[w]`.
#[derive(Clone, Debug)]
pub struct Compress {
    pub kv: ValueId,
    pub gate: ValueId,
    pub ape: TensorRef,
    pub norm: TensorRef,
    pub state_kv: StateId,
    pub state_score: StateId,
    pub rows: StateId,
    pub ratio: usize,
    pub head_dim: usize,
    pub overlapped: bool,
    pub rope: RopeConfig,
    pub rounding: RowRounding,
    pub eps: f32,
}

pub struct CompressState<'a> {
    pub kv: &'a mut [f32],
    pub score: &'a mut [f32],
    pub rows: &'a mut [f32],
}

impl Compress {
    pub fn width(&self) -> usize {
        if self.overlapped {
            2 * self.head_dim
        } else {
            self.head_dim
        }
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let mut kv = cx.take_state(self.state_kv);
        let mut score = cx.take_state(self.state_score);
        let mut rows = cx.take_state(self.rows);
        self.compute(
            cx.file,
            cx.get(self.kv),
            cx.get(self.gate),
            cx.p.pos0,
            cx.n(),
            CompressState {
                kv: &mut kv,
                score: &mut score,
                rows: &mut rows,
            },
        );
        cx.put_state(self.state_kv, kv);
        cx.put_state(self.state_score, score);
        cx.put_state(self.rows, rows);
    }

    pub fn compute(
        &self,
        file: &GgufFile,
        kv: &[f32],
        gate: &[f32],
        pos0: usize,
        n_tokens: usize,
        st: CompressState<'_>,
    ) {
        let ape = super::load_f32(file, &self.ape);
        let norm = super::load_f32(file, &self.norm);
        let freqs = rope::frequencies(&self.rope);
        let (m, c, hd) = (self.ratio, self.width(), self.head_dim);
        let mut pooled = vec![0f32; hd];
        for t in 0..n_tokens {
            let p = pos0 + t;
            self.put_slot(
                &ape,
                &kv[t * c..(t + 1) * c],
                &gate[t * c..(t + 1) * c],
                p,
                st.kv,
                st.score,
            );
            if (p + 1) % m != 0 {
                continue;
            }
            let w = (p + 1) / m - 1;
            self.pool(st.kv, st.score, &mut pooled);
            let mut row = vec![0f32; hd];
            super::norm::rms_norm(&pooled, Some(&norm), hd, self.eps, &mut row);
            rope::rotate(&mut row, &freqs, (w * m) as f64, false);
            match self.rounding {
                RowRounding::None => {}
                RowRounding::Fp8F16 => {
                    super::round::round_row(&mut row, self.rope.n_rot, true, true)
                }
                RowRounding::HadamardFp4F16 => {
                    small_float::hadamard_fp4_roundtrip(&mut row);
                    super::round::round_f16(&mut row);
                }
            }
            st.rows[w * hd..(w + 1) * hd].copy_from_slice(&row);
            self.close_window(st.kv, st.score);
        }
    }

    /// Token `p`'s frontier slot: its projected row `kv_row` and its scores
    /// `gate_row + ape[p mod ratio]` (`ape`: the whole `ape` tensor).
    pub fn put_slot(
        &self,
        ape: &[f32],
        kv_row: &[f32],
        gate_row: &[f32],
        p: usize,
        kv: &mut [f32],
        score: &mut [f32],
    ) {
        let (m, c) = (self.ratio, self.width());
        let i = p % m;
        let slot = if self.overlapped { m } else { 0 } + i;
        kv[slot * c..(slot + 1) * c].copy_from_slice(kv_row);
        for j in 0..c {
            score[slot * c + j] = gate_row[j] + ape[i * c + j];
        }
    }

    /// After a window is pooled: the finished window becomes the previous
    /// one (overlapped) and the current slots are reset, so the state only
    /// ever holds written or empty slots.
    pub fn close_window(&self, kv: &mut [f32], score: &mut [f32]) {
        let (m, c) = (self.ratio, self.width());
        let cur = if self.overlapped { m } else { 0 };
        if self.overlapped {
            kv.copy_within(m * c..2 * m * c, 0);
            score.copy_within(m * c..2 * m * c, 0);
        }
        kv[cur * c..(cur + m) * c].fill(0.0);
        score[cur * c..(cur + m) * c].fill(EMPTY_SCORE);
    }

    /// The frontier after tokens `pos0..pos0 + n` (their rows of `kv` and
    /// `gate`) from frontier `kv_state`/`score_state`: exactly what
    /// [`Compress::compute`] leaves there, without pooling the windows
    /// (the emitted rows are not written). A speculative step's rollback
    /// replays its accepted rows with it.
    #[allow(clippy::too_many_arguments)]
    pub fn replay_frontier(
        &self,
        ape: &[f32],
        kv: &[f32],
        gate: &[f32],
        pos0: usize,
        n: usize,
        kv_state: &mut [f32],
        score_state: &mut [f32],
    ) {
        let c = self.width();
        for t in 0..n {
            let p = pos0 + t;
            let (k, g) = (&kv[t * c..(t + 1) * c], &gate[t * c..(t + 1) * c]);
            self.put_slot(ape, k, g, p, kv_state, score_state);
            if (p + 1) % self.ratio == 0 {
                self.close_window(kv_state, score_state);
            }
        }
    }

    /// Per-dim softmax over the candidate slots, then the weighted sum.
    fn pool(&self, kv: &[f32], score: &[f32], out: &mut [f32]) {
        let (m, c, hd) = (self.ratio, self.width(), self.head_dim);
        // Candidates: (slot, column offset). Overlapped: previous window's
        // first half, current window's second half.
        let cands: Vec<(usize, usize)> = if self.overlapped {
            (0..m)
                .map(|i| (i, 0))
                .chain((0..m).map(|i| (m + i, hd)))
                .collect()
        } else {
            (0..m).map(|i| (i, 0)).collect()
        };
        for (j, o) in out.iter_mut().enumerate() {
            let mx = cands
                .iter()
                .map(|&(s, off)| score[s * c + off + j])
                .fold(f32::NEG_INFINITY, f32::max);
            let (mut num, mut den) = (0f32, 0f32);
            for &(s, off) in &cands {
                let e = (score[s * c + off + j] - mx).exp();
                den += e;
                num += e * kv[s * c + off + j];
            }
            *o = if den > 0.0 { num / den } else { 0.0 };
        }
    }
}
