//! Attention over the raw sliding window plus visible compressed rows, with
//! per-head sinks (MODEL.md §3.5.2, §3.6); and the raw-window ring update.

use super::CpuCx;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::{StateId, ValueId};

/// Where a layer's compressed rows are and which of them a query sees.
#[derive(Clone, Copy, Debug)]
pub struct CompressedRows {
    pub rows: StateId,
    pub ratio: usize,
}

/// For token t at position p = pos0 + t: softmax over the raw rows of
/// positions `max(0, p−W+1)..=p` (those before the step from the ring, the
/// others from `kv`), the visible compressed rows (all rows `w` with
/// `(w+1)·ratio ≤ p+1`, or the indexer's `selected` list), and the head's sink
/// logit, which joins the denominator but carries no value. K = V = the row.
///
/// With `block` (a DSpark draft block, docs/SPECULATIVE.md), every row of
/// the step sees the same raw rows: the ring's positions
/// `max(0, pos0−W)..pos0` and all the step's rows, its later ones included
/// (DeepSeek's `DSparkAttention`: no causal mask inside the block).
#[derive(Clone, Debug)]
pub struct Attention {
    pub q: ValueId,
    pub kv: ValueId,
    pub ring: StateId,
    pub window: usize,
    /// A draft block: no causal mask inside the step (above). Window-only.
    pub block: bool,
    pub compressed: Option<CompressedRows>,
    /// Indexer choice per token (`top_k` entries, −1 = unused).
    pub selected: Option<ValueId>,
    pub top_k: usize,
    pub sinks: TensorRef,
    pub n_head: usize,
    pub head_dim: usize,
    pub out: ValueId,
}

pub struct AttentionInputs<'a> {
    pub q: &'a [f32],
    pub kv: &'a [f32],
    pub ring: &'a [f32],
    pub compressed: Option<&'a [f32]>,
    pub selected: Option<&'a [i32]>,
}

impl Attention {
    /// This op's inputs in `cx` (the step's values and the layer's states).
    pub fn inputs<'c>(&self, cx: &'c CpuCx) -> AttentionInputs<'c> {
        AttentionInputs {
            q: cx.get(self.q),
            kv: cx.get(self.kv),
            ring: cx.state(self.ring),
            compressed: self.compressed.map(|c| cx.state(c.rows)),
            selected: self.selected.map(|v| cx.get_i32(v)),
        }
    }

    /// The raw positions token `t` of an `n`-token step starting at `pos0`
    /// attends to, in order: `first..=last`.
    pub fn raw_positions(&self, pos0: usize, n: usize, t: usize) -> (usize, usize) {
        let w = self.window;
        if self.block {
            (pos0.saturating_sub(w), pos0 + n - 1)
        } else {
            let p = pos0 + t;
            (p.saturating_sub(w - 1), p)
        }
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, self.inputs(cx), pos0, n, out)
        });
    }

    /// The rows token `t` of an `n`-token step starting at `pos0` attends
    /// to, in the order its softmax sums them: the raw window (ring rows
    /// before the step, `kv` rows in it; [`Attention::raw_positions`]), then
    /// the visible compressed rows (the indexer's selection when there is
    /// one). `rows` is cleared first.
    pub fn visible_rows<'a>(
        &self,
        inp: &AttentionInputs<'a>,
        pos0: usize,
        n: usize,
        t: usize,
        rows: &mut Vec<&'a [f32]>,
    ) {
        let (hd, w) = (self.head_dim, self.window);
        let p = pos0 + t;
        rows.clear();
        let (first, last) = self.raw_positions(pos0, n, t);
        for s in first..=last {
            rows.push(if s >= pos0 {
                &inp.kv[(s - pos0) * hd..(s - pos0 + 1) * hd]
            } else {
                let r = s % w;
                &inp.ring[r * hd..(r + 1) * hd]
            });
        }
        if let (Some(c), Some(comp)) = (self.compressed, inp.compressed) {
            let n_vis = (p + 1) / c.ratio;
            match inp.selected {
                Some(sel) => {
                    for &r in &sel[t * self.top_k..(t + 1) * self.top_k] {
                        if r >= 0 && (r as usize) < n_vis {
                            let r = r as usize;
                            rows.push(&comp[r * hd..(r + 1) * hd]);
                        }
                    }
                }
                None => {
                    for r in 0..n_vis {
                        rows.push(&comp[r * hd..(r + 1) * hd]);
                    }
                }
            }
        }
    }

    pub fn compute(
        &self,
        file: &GgufFile,
        inp: AttentionInputs<'_>,
        pos0: usize,
        n_tokens: usize,
        out: &mut [f32],
    ) {
        let sinks = super::load_f32(file, &self.sinks);
        let (hd, nh, w) = (self.head_dim, self.n_head, self.window);
        let scale = 1.0 / (hd as f32).sqrt();
        let qw = nh * hd;
        super::parallel::for_rows(
            &mut out[..n_tokens * qw],
            qw,
            qw * (w + 64),
            |first, chunk| {
                let mut rows: Vec<&[f32]> = Vec::new();
                let mut logits: Vec<f32> = Vec::new();
                for (i, o) in chunk.chunks_exact_mut(qw).enumerate() {
                    let t = first + i;
                    self.visible_rows(&inp, pos0, n_tokens, t, &mut rows);
                    for h in 0..nh {
                        let qh = &inp.q[t * qw + h * hd..t * qw + (h + 1) * hd];
                        logits.clear();
                        logits.extend(rows.iter().map(|r| super::dot(qh, r) * scale));
                        let m = logits.iter().cloned().fold(sinks[h], f32::max);
                        let mut den = (sinks[h] - m).exp();
                        let oh = &mut o[h * hd..(h + 1) * hd];
                        oh.fill(0.0);
                        for (l, r) in logits.iter().zip(&rows) {
                            let e = (l - m).exp();
                            den += e;
                            for (a, &b) in oh.iter_mut().zip(r.iter()) {
                                *a += e * b;
                            }
                        }
                        let inv = 1.0 / den;
                        for a in oh.iter_mut() {
                            *a *= inv;
                        }
                    }
                }
            },
        );
    }
}

/// Stores the step's raw KV rows in the ring (slot = position mod window).
#[derive(Clone, Debug)]
pub struct RingWrite {
    pub kv: ValueId,
    pub ring: StateId,
    pub window: usize,
    pub dim: usize,
}

impl RingWrite {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let mut ring = cx.take_state(self.ring);
        self.compute(cx.get(self.kv), cx.p.pos0, cx.n(), &mut ring);
        cx.put_state(self.ring, ring);
    }

    pub fn compute(&self, kv: &[f32], pos0: usize, n_tokens: usize, ring: &mut [f32]) {
        let d = self.dim;
        for t in n_tokens.saturating_sub(self.window)..n_tokens {
            let r = (pos0 + t) % self.window;
            ring[r * d..(r + 1) * d].copy_from_slice(&kv[t * d..(t + 1) * d]);
        }
    }
}
