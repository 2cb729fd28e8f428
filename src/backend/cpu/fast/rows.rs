//! Row-wise ops of the graph over the pool: RMS norm and RoPE. Each row is
//! computed exactly as the reference twin computes it (the same f64 sums in
//! the same order, the same sines and cosines), so the values are the
//! reference's bit for bit; only the rows are spread over the threads. At
//! 2,048 prompt tokens the two ran on one thread for ~4 % of a prefill.

use rayon::prelude::*;

use crate::graph::ops::norm::RmsNorm;
use crate::graph::ops::rope::{frequencies, Rope};

/// Values per task (below this a call stays on the calling thread).
const TASK_VALUES: usize = 1 << 15;

/// Rows whose f64 sums of squares are accumulated side by side: each row's
/// sum is still one sequential chain, but the chains of different rows
/// overlap instead of waiting on each other's add latency.
const LANES: usize = 8;

/// [`RmsNorm::compute`] over `x` (rows of `o.dim`), rows spread over the
/// pool.
pub fn rms_norm(o: &RmsNorm, w: Option<&[f32]>, x: &[f32], out: &mut [f32]) {
    let dim = o.dim;
    assert!(dim > 0 && x.len() == out.len() && x.len() % dim == 0);
    let rows_per_task = (TASK_VALUES / dim).max(LANES).next_multiple_of(LANES);
    let run = |(x, out): (&[f32], &mut [f32])| norm_rows(x, w, dim, o.eps, out);
    if x.len() <= rows_per_task * dim {
        return run((x, out));
    }
    x.par_chunks(rows_per_task * dim)
        .zip(out.par_chunks_mut(rows_per_task * dim))
        .for_each(run);
}

/// `graph::ops::norm::rms_norm` of the rows of `x`, [`LANES`] rows at a
/// time.
fn norm_rows(x: &[f32], w: Option<&[f32]>, dim: usize, eps: f32, out: &mut [f32]) {
    for (xs, outs) in x.chunks(LANES * dim).zip(out.chunks_mut(LANES * dim)) {
        let rows = xs.len() / dim;
        // `Iterator::sum` of f64 squares: 0, then each square in order.
        let mut ss = [0f64; LANES];
        for i in 0..dim {
            for (r, s) in ss.iter_mut().enumerate().take(rows) {
                let v = xs[r * dim + i] as f64;
                *s += v * v;
            }
        }
        for (r, (xr, or)) in xs
            .chunks_exact(dim)
            .zip(outs.chunks_exact_mut(dim))
            .enumerate()
        {
            let scale = (1.0 / (ss[r] / dim as f64 + eps as f64).sqrt()) as f32;
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
}

/// [`Rope::compute`], tokens spread over the pool.
pub fn rope(o: &Rope, x: &[f32], pos0: usize, n_tokens: usize, out: &mut [f32]) {
    let freqs = frequencies(&o.rope);
    let w = o.heads * o.head_dim;
    let (x, out) = (&x[..n_tokens * w], &mut out[..n_tokens * w]);
    let per_task = (TASK_VALUES / w.max(1)).max(1);
    out.par_chunks_mut(per_task * w)
        .zip(x.par_chunks(per_task * w))
        .enumerate()
        .for_each(|(i, (out, x))| {
            let mut turns = Vec::new();
            for (t, (xr, or)) in x.chunks_exact(w).zip(out.chunks_exact_mut(w)).enumerate() {
                let pos = (pos0 + i * per_task + t) as f64;
                o.token(&freqs, pos, &mut turns, xr, or);
            }
        });
}
