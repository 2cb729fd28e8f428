//! Hyper-connections (MODEL.md §3.2–3.3, §3.10): the residual stream is kept
//! as `n_hc` parallel streams; each sublayer reads a weighted collapse of them
//! and writes back through a Sinkhorn-normalised mixing matrix.

use super::CpuCx;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ValueId;

/// `out[t][s] = x[t]` for every stream `s` (the embedding enters every stream).
#[derive(Clone, Debug)]
pub struct HcInit {
    pub x: ValueId,
    pub out: ValueId,
    pub n_hc: usize,
    pub dim: usize,
}

impl HcInit {
    /// Output values per token (one GPU thread each).
    pub fn items(&self) -> usize {
        self.n_hc * self.dim
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| self.compute(cx.get(self.x), n, out));
    }

    pub fn compute(&self, x: &[f32], n_tokens: usize, out: &mut [f32]) {
        let (d, n) = (self.dim, self.n_hc);
        for t in 0..n_tokens {
            for s in 0..n {
                out[(t * n + s) * d..(t * n + s + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
            }
        }
    }
}

/// From the mixer logits `m` (`(2+n)·n` per token, or `n` for the output
/// head) to the collapse weights `pre`, the write-back weights `post` and the
/// doubly-stochastic stream mixer `comb` (row-major `n × n`).
#[derive(Clone, Debug)]
pub struct HcMix {
    pub logits: ValueId,
    pub scale: TensorRef,
    pub base: TensorRef,
    pub pre: ValueId,
    /// `None` for the output head, which only collapses.
    pub post: Option<ValueId>,
    pub comb: Option<ValueId>,
    pub n_hc: usize,
    pub sinkhorn_iters: usize,
    pub eps: f32,
}

impl HcMix {
    pub fn mix_dim(&self) -> usize {
        if self.post.is_some() {
            (2 + self.n_hc) * self.n_hc
        } else {
            self.n_hc
        }
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        let mut pre = cx.take(self.pre);
        let mut post = self.post.map(|v| cx.take(v));
        let mut comb = self.comb.map(|v| cx.take(v));
        self.compute(
            cx.file,
            cx.get(self.logits),
            n,
            &mut pre,
            post.as_deref_mut(),
            comb.as_deref_mut(),
        );
        cx.put(self.pre, pre);
        if let (Some(v), Some(b)) = (self.post, post) {
            cx.put(v, b);
        }
        if let (Some(v), Some(b)) = (self.comb, comb) {
            cx.put(v, b);
        }
    }

    pub fn compute(
        &self,
        file: &GgufFile,
        logits: &[f32],
        n_tokens: usize,
        pre: &mut [f32],
        mut post: Option<&mut [f32]>,
        mut comb: Option<&mut [f32]>,
    ) {
        let scale = super::load_f32(file, &self.scale);
        let base = super::load_f32(file, &self.base);
        let n = self.n_hc;
        let w = self.mix_dim();
        for t in 0..n_tokens {
            let m = &logits[t * w..(t + 1) * w];
            for s in 0..n {
                pre[t * n + s] = super::sigmoid(m[s] * scale[0] + base[s]) + self.eps;
            }
            if let Some(post) = post.as_deref_mut() {
                for s in 0..n {
                    post[t * n + s] = 2.0 * super::sigmoid(m[n + s] * scale[1] + base[n + s]);
                }
            }
            if let Some(comb) = comb.as_deref_mut() {
                let c = &mut comb[t * n * n..(t + 1) * n * n];
                for i in 0..n * n {
                    c[i] = m[2 * n + i] * scale[2] + base[2 * n + i];
                }
                sinkhorn(c, n, self.sinkhorn_iters, self.eps);
            }
        }
    }
}

/// Row softmax, then alternating column/row normalisation (MODEL.md §3.2).
pub fn sinkhorn(c: &mut [f32], n: usize, iters: usize, eps: f32) {
    for r in 0..n {
        let row = &mut c[r * n..(r + 1) * n];
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in row.iter_mut() {
            *v = (*v - mx).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v = *v / sum + eps;
        }
    }
    let col_norm = |c: &mut [f32]| {
        for j in 0..n {
            let s: f32 = (0..n).map(|r| c[r * n + j]).sum();
            for r in 0..n {
                c[r * n + j] /= s + eps;
            }
        }
    };
    col_norm(c);
    for _ in 1..iters {
        for r in 0..n {
            let s: f32 = c[r * n..(r + 1) * n].iter().sum();
            for v in &mut c[r * n..(r + 1) * n] {
                *v /= s + eps;
            }
        }
        col_norm(c);
    }
}

/// `out[t] = Σ_s pre[t][s] · state[t][s]`.
#[derive(Clone, Debug)]
pub struct HcCollapse {
    pub state: ValueId,
    pub pre: ValueId,
    pub out: ValueId,
    pub n_hc: usize,
    pub dim: usize,
}

impl HcCollapse {
    /// Output values per token (one GPU thread each).
    pub fn items(&self) -> usize {
        self.dim
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            self.compute(cx.get(self.state), cx.get(self.pre), n, out)
        });
    }

    pub fn compute(&self, state: &[f32], pre: &[f32], n_tokens: usize, out: &mut [f32]) {
        let (n, d) = (self.n_hc, self.dim);
        for t in 0..n_tokens {
            let o = &mut out[t * d..(t + 1) * d];
            o.fill(0.0);
            for s in 0..n {
                let w = pre[t * n + s];
                let st = &state[(t * n + s) * d..(t * n + s + 1) * d];
                for (a, &b) in o.iter_mut().zip(st) {
                    *a += w * b;
                }
            }
        }
    }
}

/// `out[t][k] = post[t][k] · y[t] + Σ_j comb[t][j][k] · state[t][j]`
/// (output stream k takes column k of the mixer).
#[derive(Clone, Debug)]
pub struct HcExpand {
    pub state: ValueId,
    pub y: ValueId,
    pub post: ValueId,
    pub comb: ValueId,
    pub out: ValueId,
    pub n_hc: usize,
    pub dim: usize,
}

impl HcExpand {
    /// Output values per token (one GPU thread each).
    pub fn items(&self) -> usize {
        self.n_hc * self.dim
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            self.compute(
                cx.get(self.state),
                cx.get(self.y),
                cx.get(self.post),
                cx.get(self.comb),
                n,
                out,
            )
        });
    }

    pub fn compute(
        &self,
        state: &[f32],
        y: &[f32],
        post: &[f32],
        comb: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) {
        let (n, d) = (self.n_hc, self.dim);
        for t in 0..n_tokens {
            let yt = &y[t * d..(t + 1) * d];
            let c = &comb[t * n * n..(t + 1) * n * n];
            for k in 0..n {
                let o = &mut out[(t * n + k) * d..(t * n + k + 1) * d];
                let pk = post[t * n + k];
                for (a, &b) in o.iter_mut().zip(yt) {
                    *a = pk * b;
                }
                for j in 0..n {
                    let w = c[j * n + k];
                    let st = &state[(t * n + j) * d..(t * n + j + 1) * d];
                    for (a, &b) in o.iter_mut().zip(st) {
                        *a += w * b;
                    }
                }
            }
        }
    }
}

/// The first sublayer's collapse weights of lagged hyper-connections: stream
/// 0 only (`[1, 0, …]` per token), as the official `make_identity_pre_mix`.
#[derive(Clone, Debug)]
pub struct HcOneHot {
    pub out: ValueId,
    pub n_hc: usize,
}

impl HcOneHot {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |_, out| self.compute(n, out));
    }

    pub fn compute(&self, n_tokens: usize, out: &mut [f32]) {
        for row in out[..n_tokens * self.n_hc].chunks_exact_mut(self.n_hc) {
            row.fill(0.0);
            row[0] = 1.0;
        }
    }
}
