//! Activation rows quantised for the integer dot products.
//!
//! Two int8 formats, chosen by the weight format they meet:
//! * Q8_K (256 values, one f32 scale, 16-value sums) for the K-quants and
//!   IQ2_XXS, whose 256-value super-blocks it matches (the sums carry the
//!   Q2_K/Q4_K min terms);
//! * [`BlockQ8x32`] (32 values, one f32 scale) for Q8_0 and MXFP4, whose
//!   blocks are 32 values and whose rows need not be 256-aligned.
//!
//! F32/F16/BF16 weights meet the activations unquantised (f32).

use bytemuck::{Pod, Zeroable};

use crate::quant::q8_k::{quantize_block, BlockQ8K, QK_K};

/// 32 int8 codes with an f32 scale: value = d·qs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8x32 {
    pub d: f32,
    pub qs: [i8; 32],
}

/// Quantises 32 values: the largest magnitude maps to ±127, rounding half
/// away from zero.
pub fn quantize_q8x32(x: &[f32]) -> BlockQ8x32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut b = BlockQ8x32::zeroed();
    if amax == 0.0 {
        return b;
    }
    let d = amax / 127.0;
    let id = 1.0 / d;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    b.d = d;
    b
}

/// Which activation format a weight type reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    Q8K,
    Q8x32,
    F32,
}

/// `rows` activation rows of `n` values each, quantised as `kind`.
pub enum Acts {
    Q8K {
        blocks: Vec<BlockQ8K>,
        per_row: usize,
    },
    Q8x32 {
        blocks: Vec<BlockQ8x32>,
        per_row: usize,
    },
    F32 {
        values: Vec<f32>,
        per_row: usize,
    },
}

impl Acts {
    /// Quantises the `rows` given by `row(i)` (each `n` long).
    pub fn quantize<'a>(kind: ActKind, n: usize, rows: impl Iterator<Item = &'a [f32]>) -> Acts {
        match kind {
            ActKind::Q8K => {
                let per_row = n / QK_K;
                let mut blocks = Vec::new();
                for r in rows {
                    blocks.extend(r[..n].chunks_exact(QK_K).map(quantize_block));
                }
                Acts::Q8K { blocks, per_row }
            }
            ActKind::Q8x32 => {
                let per_row = n / 32;
                let mut blocks = Vec::new();
                for r in rows {
                    blocks.extend(r[..n].chunks_exact(32).map(quantize_q8x32));
                }
                Acts::Q8x32 { blocks, per_row }
            }
            ActKind::F32 => {
                let mut values = Vec::new();
                for r in rows {
                    values.extend_from_slice(&r[..n]);
                }
                Acts::F32 { values, per_row: n }
            }
        }
    }

    /// [`Acts::quantize`] of `rows`, the rows spread over the rayon pool
    /// when there are many (a 2,048-token prompt's rows were quantised on
    /// one thread while the other waited). The same blocks either way: each
    /// row is quantised on its own.
    pub fn quantize_par(kind: ActKind, n: usize, rows: &[&[f32]]) -> Acts {
        use rayon::prelude::*;
        if rows.len() < 64 || rayon::current_num_threads() < 2 {
            return Acts::quantize(kind, n, rows.iter().copied());
        }
        fn fill<B: Copy + Send + Zeroable>(
            rows: &[&[f32]],
            n: usize,
            per_row: usize,
            block: usize,
            q: impl Fn(&[f32]) -> B + Sync,
        ) -> Vec<B> {
            let mut out = vec![B::zeroed(); rows.len() * per_row];
            out.par_chunks_mut(per_row)
                .zip(rows.par_iter())
                .for_each(|(dst, r)| {
                    for (b, x) in dst.iter_mut().zip(r[..n].chunks_exact(block)) {
                        *b = q(x);
                    }
                });
            out
        }
        match kind {
            ActKind::Q8K => Acts::Q8K {
                blocks: fill(rows, n, n / QK_K, QK_K, quantize_block),
                per_row: n / QK_K,
            },
            ActKind::Q8x32 => Acts::Q8x32 {
                blocks: fill(rows, n, n / 32, 32, quantize_q8x32),
                per_row: n / 32,
            },
            ActKind::F32 => Acts::quantize(kind, n, rows.iter().copied()),
        }
    }

    /// A new set made of rows `idx` of this one (tokens gathered per expert).
    pub fn gather(&self, idx: impl Iterator<Item = usize>) -> Acts {
        fn pick<T: Copy>(v: &[T], per: usize, idx: impl Iterator<Item = usize>) -> Vec<T> {
            let mut out = Vec::new();
            for i in idx {
                out.extend_from_slice(&v[i * per..(i + 1) * per]);
            }
            out
        }
        match self {
            Acts::Q8K { blocks, per_row } => Acts::Q8K {
                blocks: pick(blocks, *per_row, idx),
                per_row: *per_row,
            },
            Acts::Q8x32 { blocks, per_row } => Acts::Q8x32 {
                blocks: pick(blocks, *per_row, idx),
                per_row: *per_row,
            },
            Acts::F32 { values, per_row } => Acts::F32 {
                values: pick(values, *per_row, idx),
                per_row: *per_row,
            },
        }
    }
}
