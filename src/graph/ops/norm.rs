//! RMS normalisation, weighted or not, over rows of `dim` values.

use super::{CpuCx, Rows};
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ValueId;

/// `out = x / sqrt(mean(x²) + eps) (⊙ w)` for every `dim`-wide row of `x`.
/// Sums of squares are accumulated in f64 (as ds4 does) so the norm does not
/// depend on the summation order.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub x: ValueId,
    pub out: ValueId,
    pub dim: usize,
    pub weight: Option<TensorRef>,
    pub eps: f32,
    /// `dim`-wide rows per step (`Rows::of(out, dim)`).
    pub rows: Rows,
}

impl RmsNorm {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let len = self.rows.at(cx.n()) * self.dim;
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, &cx.get(self.x)[..len], &mut out[..len])
        });
    }

    pub fn compute(&self, file: &GgufFile, x: &[f32], out: &mut [f32]) {
        let w = self.weight.as_ref().map(|t| super::load_f32(file, t));
        rms_norm(x, w.as_deref(), self.dim, self.eps, out);
    }
}

pub fn rms_norm(x: &[f32], w: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / dim as f64 + eps as f64).sqrt()) as f32;
        match w {
            Some(w) => {
                for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                    *o = v * scale * g;
                }
            }
            None => {
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = v * scale;
                }
            }
        }
    }
}
