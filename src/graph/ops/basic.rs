//! Small ops: embedding lookup, element-wise add and scale, last-row select.

use super::CpuCx;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ValueId;
use crate::quant;

/// `out[t] = table[tokens[t]]` (table ne `[D, V]`).
#[derive(Clone, Debug)]
pub struct Embed {
    pub table: TensorRef,
    pub tokens: ValueId,
    pub out: ValueId,
}

impl Embed {
    /// Values per embedding row (and per token of `out`).
    pub fn dim(&self) -> usize {
        self.table.ne[0] as usize
    }

    /// Rows of the table (the vocabulary size).
    pub fn vocab(&self) -> usize {
        self.table.ne[1] as usize
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            self.compute(cx.file, &cx.get_i32(self.tokens)[..n], out)
        });
    }

    pub fn compute(&self, file: &GgufFile, tokens: &[i32], out: &mut [f32]) {
        let d = self.dim();
        let rb = self.table.row_bytes();
        let bytes = self.table.bytes(file);
        for (t, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
            let r = *t as usize;
            // Token ids are checked against the vocabulary by the session.
            quant::dequantize_row(self.table.ty, &bytes[r * rb..(r + 1) * rb], row)
                .expect("validated tensor type");
        }
    }
}

/// `out = a + b` over the live tokens' `cols` values each.
#[derive(Clone, Debug)]
pub struct Add {
    pub a: ValueId,
    pub b: ValueId,
    pub out: ValueId,
    /// Values per token (the output's columns).
    pub cols: usize,
}

impl Add {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let len = cx.n() * self.cols;
        cx.write(self.out, |cx, out| {
            self.compute(
                &cx.get(self.a)[..len],
                &cx.get(self.b)[..len],
                &mut out[..len],
            )
        });
    }

    pub fn compute(&self, a: &[f32], b: &[f32], out: &mut [f32]) {
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    }
}

/// `out = x · factor` over the live tokens' `cols` values each.
#[derive(Clone, Debug)]
pub struct Scale {
    pub x: ValueId,
    pub out: ValueId,
    pub factor: f32,
    /// Values per token (the output's columns).
    pub cols: usize,
}

impl Scale {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let len = cx.n() * self.cols;
        cx.write(self.out, |cx, out| {
            self.compute(&cx.get(self.x)[..len], &mut out[..len])
        });
    }

    pub fn compute(&self, x: &[f32], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(x) {
            *o = v * self.factor;
        }
    }
}

/// Copies the last live token row of `x` into `out` (one row).
#[derive(Clone, Debug)]
pub struct TakeLast {
    pub x: ValueId,
    pub out: ValueId,
    pub cols: usize,
}

impl TakeLast {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let c = self.cols;
        out[..c].copy_from_slice(&x[(n_tokens - 1) * c..n_tokens * c]);
    }
}
