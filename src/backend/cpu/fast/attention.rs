//! The fast twin of `ops::attention::Attention`: the same rows, sinks and
//! softmax, with the query·row dots and the weighted row sums through the
//! path's f32 kernels (FMA) instead of the reference's fixed-order sums.
//! Prefill splits the tokens across threads; decode (fewer tokens than
//! threads) splits each token's heads instead, so a long context's
//! compressed rows are read by every core.

use super::Kernels;
use crate::gguf::GgufFile;
use crate::graph::ops::attention::{Attention, AttentionInputs};

pub fn attention(
    kern: &Kernels,
    o: &Attention,
    file: &GgufFile,
    inp: AttentionInputs<'_>,
    pos0: usize,
    n_tokens: usize,
    out: &mut [f32],
) {
    let sinks = crate::graph::ops::load_f32(file, &o.sinks);
    let (hd, nh, w) = (o.head_dim, o.n_head, o.window);
    let scale = 1.0 / (hd as f32).sqrt();
    let qw = nh * hd;
    let split_heads = n_tokens < rayon::current_num_threads();
    crate::graph::ops::parallel::for_rows(
        &mut out[..n_tokens * qw],
        qw,
        qw * (w + 64),
        |first, chunk| {
            let mut rows: Vec<&[f32]> = Vec::new();
            let mut logits: Vec<f32> = Vec::new();
            for (i, ot) in chunk.chunks_exact_mut(qw).enumerate() {
                let t = first + i;
                o.visible_rows(&inp, pos0, n_tokens, t, &mut rows);
                let head = |h: usize, oh: &mut [f32], logits: &mut Vec<f32>| {
                    let qh = &inp.q[t * qw + h * hd..t * qw + (h + 1) * hd];
                    logits.clear();
                    logits.extend(
                        rows.iter()
                            .map(|r| kern.dot_f32(bytemuck::cast_slice(r), qh) * scale),
                    );
                    let m = logits.iter().cloned().fold(sinks[h], f32::max);
                    let mut den = (sinks[h] - m).exp();
                    oh.fill(0.0);
                    for (l, r) in logits.iter().zip(&rows) {
                        let e = (l - m).exp();
                        den += e;
                        (kern.axpy)(e, r, oh);
                    }
                    let inv = 1.0 / den;
                    for a in oh.iter_mut() {
                        *a *= inv;
                    }
                };
                if split_heads && nh > 1 && rows.len() * hd >= 1 << 14 {
                    use rayon::prelude::*;
                    ot.par_chunks_mut(hd)
                        .enumerate()
                        .for_each_init(Vec::new, |lg, (h, oh)| head(h, oh, lg));
                } else {
                    for (h, oh) in ot.chunks_exact_mut(hd).enumerate() {
                        head(h, oh, &mut logits);
                    }
                }
            }
        },
    );
}
