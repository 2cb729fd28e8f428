//! Matrix × activations with weights dequantised on the fly.

use super::parallel::for_rows;
use super::{CpuCx, Rows};
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ValueId;
use crate::quant;

/// `out[t][o] = Σ_i W[o][i] · x[t][g·in + i]` for weight rows `o` of group `g`.
///
/// `W` has ne `[in, out]` (or a slab `expert` of a 3-D tensor). With
/// `groups > 1` the weight rows split into `groups` equal blocks and block `g`
/// reads the g-th `in`-wide slice of each activation row (the grouped
/// low-rank output projection).
#[derive(Clone, Debug)]
pub struct MatMul {
    pub w: TensorRef,
    pub x: ValueId,
    pub out: ValueId,
    pub groups: usize,
    /// Activation rows per step (`Rows::of(out, out_dim)`: one per token,
    /// or a fixed count for the last-token head).
    pub rows: Rows,
}

impl MatMul {
    pub fn in_dim(&self) -> usize {
        self.w.ne[0] as usize
    }

    pub fn out_dim(&self) -> usize {
        self.w.ne[1] as usize
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let rows = self.rows.at(cx.n());
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, cx.get(self.x), rows, out)
        });
    }

    pub fn compute(&self, file: &GgufFile, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let bytes = self.w.bytes(file);
        matmul_rows(
            self.w.ty,
            bytes,
            self.in_dim(),
            self.out_dim(),
            self.groups,
            x,
            n_tokens,
            out,
        );
    }
}

/// The CPU kernel shared by dense matmuls and expert slabs: `w` holds
/// `n_out` rows of `n_in` values of type `ty`; `x` is `n_tokens` rows of
/// `groups · n_in`; `out` is `n_tokens` rows of `n_out`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    ty: quant::GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) {
    let rb = w.len() / n_out.max(1);
    let rows_per_group = n_out / groups.max(1);
    let x_stride = groups * n_in;
    // Computed weight-row-major (each weight row dequantised once and applied
    // to every token), then transposed into token-major `out`.
    let mut tmp = vec![0f32; n_out * n_tokens];
    for_rows(&mut tmp, n_tokens, n_in * n_tokens, |first, chunk| {
        let mut wrow = vec![0f32; n_in];
        for (i, o_row) in chunk.chunks_exact_mut(n_tokens).enumerate() {
            let o = first + i;
            quant::dequantize_row(ty, &w[o * rb..(o + 1) * rb], &mut wrow)
                .expect("validated tensor type");
            let g = o / rows_per_group;
            for (t, dst) in o_row.iter_mut().enumerate() {
                let xs = &x[t * x_stride + g * n_in..t * x_stride + (g + 1) * n_in];
                *dst = super::dot(&wrow, xs);
            }
        }
    });
    for t in 0..n_tokens {
        for o in 0..n_out {
            out[t * n_out + o] = tmp[o * n_tokens + t];
        }
    }
}
