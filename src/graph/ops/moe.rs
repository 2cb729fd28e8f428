//! Mixture of experts (MODEL.md §3.7–3.8): router, routed experts with a
//! clamped SwiGLU, and the SwiGLU of the shared expert.

use super::matmul::matmul_rows;
use super::CpuCx;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ValueId;

/// Smallest routing-weight denominator (ds4's guard, 2⁻¹⁴).
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// `s_e = sqrt(softplus(logit_e))`; experts chosen by the hash table (first
/// layers) or as the `k` largest `s_e + bias_e` (ties to the lower index);
/// weights `s / Σ s · scale`.
#[derive(Clone, Debug)]
pub struct Router {
    pub logits: ValueId,
    pub tokens: ValueId,
    pub bias: Option<TensorRef>,
    pub tid2eid: Option<TensorRef>,
    pub selected: ValueId,
    pub weights: ValueId,
    pub n_expert: usize,
    pub k: usize,
    pub scale: f32,
    pub normalize: bool,
}

/// ds4's softplus: exact at both ends where `ln(1+eˣ)` loses precision.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else if x < -20.0 {
        x.exp()
    } else {
        x.exp().ln_1p()
    }
}

impl Router {
    /// Entries per row of the hash table (`tid2eid`, one row per token id);
    /// 0 without one.
    pub fn table_cols(&self) -> usize {
        self.tid2eid.as_ref().map_or(0, |t| t.ne[0] as usize)
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        let mut sel = cx.take(self.selected);
        let mut w = cx.take(self.weights);
        self.compute(
            cx.file,
            cx.get(self.logits),
            cx.get_i32(self.tokens),
            n,
            bytemuck::cast_slice_mut(&mut sel),
            &mut w,
        );
        cx.put(self.selected, sel);
        cx.put(self.weights, w);
    }

    pub fn compute(
        &self,
        file: &GgufFile,
        logits: &[f32],
        tokens: &[i32],
        n_tokens: usize,
        sel: &mut [i32],
        w: &mut [f32],
    ) {
        let bias = self.bias.as_ref().map(|b| super::load_f32(file, b));
        let table = self
            .tid2eid
            .as_ref()
            .map(|t| (t.bytes(file), self.table_cols()));
        let (e, k) = (self.n_expert, self.k);
        let mut order: Vec<(f32, usize)> = Vec::with_capacity(e);
        for t in 0..n_tokens {
            let s: Vec<f32> = logits[t * e..(t + 1) * e]
                .iter()
                .map(|&x| softplus(x).sqrt())
                .collect();
            let chosen = &mut sel[t * k..(t + 1) * k];
            match table {
                Some((bytes, row)) => {
                    let base = tokens[t] as usize * row * 4;
                    for (i, c) in chosen.iter_mut().enumerate() {
                        let b = &bytes[base + 4 * i..base + 4 * i + 4];
                        // Entries were range-checked when the session was created.
                        *c = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
                None => {
                    order.clear();
                    order.extend(
                        s.iter()
                            .enumerate()
                            .map(|(i, &v)| (v + bias.as_ref().map_or(0.0, |b| b[i]), i)),
                    );
                    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    for (c, &(_, i)) in chosen.iter_mut().zip(order.iter()) {
                        *c = i as i32;
                    }
                }
            }
            let sum: f32 = chosen.iter().map(|&i| s[i as usize]).sum();
            let denom = if self.normalize {
                sum.max(MIN_WEIGHT_SUM)
            } else {
                1.0
            };
            for (wi, &i) in w[t * k..(t + 1) * k].iter_mut().zip(chosen.iter()) {
                *wi = s[i as usize] / denom * self.scale;
            }
        }
    }
}

/// `h = silu(min(g, c)) · clamp(u, −c, c)`; no clamp when `c ≤ 1e-6`.
pub fn swiglu(g: f32, u: f32, clamp: f32) -> f32 {
    if clamp > 1e-6 {
        super::silu(g.min(clamp)) * u.clamp(-clamp, clamp)
    } else {
        super::silu(g) * u
    }
}

/// Element-wise clamped SwiGLU (the shared expert).
#[derive(Clone, Debug)]
pub struct SwiGlu {
    pub gate: ValueId,
    pub up: ValueId,
    pub out: ValueId,
    pub clamp: f32,
    /// Values per token (the output's columns).
    pub cols: usize,
}

impl SwiGlu {
    pub fn cpu(&self, cx: &mut CpuCx) {
        let len = cx.n() * self.cols;
        cx.write(self.out, |cx, out| {
            self.compute(
                &cx.get(self.gate)[..len],
                &cx.get(self.up)[..len],
                &mut out[..len],
            )
        });
    }

    pub fn compute(&self, g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, &a), &b) in out.iter_mut().zip(g).zip(u) {
            *o = swiglu(a, b, self.clamp);
        }
    }
}

/// `out[t] = Σ_i w[t][i] · down_e(swiglu(gate_e · x[t], up_e · x[t]))` with
/// `e = selected[t][i]`. Tokens are grouped by expert so each expert slab is
/// read once per step; per-token sums run in selection order.
#[derive(Clone, Debug)]
pub struct MoeExperts {
    pub x: ValueId,
    pub selected: ValueId,
    pub weights: ValueId,
    pub gate: TensorRef,
    pub up: TensorRef,
    pub down: TensorRef,
    pub clamp: f32,
    pub k: usize,
    pub out: ValueId,
    /// DeepSeek V4.1 under `--numerics model`: the weighted SwiGLU row (the
    /// official expert multiplies the route weight in before `w2`) goes
    /// through the FP8 round trip of `w2`'s input (blocks of 32, UE8M0
    /// scales).
    pub mid_fp8: bool,
}

/// The block of the FP8 round trip of an expert's `w2` input.
pub const MID_FP8_BLOCK: usize = 32;

/// Expert slabs a backend's expert cache holds for one pass (SSD
/// streaming, `backend::experts`): the bytes of `t`'s slab of expert `e`
/// exactly as stored in the GGUF, or `None` when this set lacks it.
pub trait PinnedSlabs: Send + Sync {
    fn slab(&self, t: &TensorRef, e: usize) -> Option<&[u8]>;
}

/// Where an expert pass reads its slabs: the mapped file, or the slices an
/// expert cache pinned for this pass (the same bytes, read from disk).
#[derive(Clone, Copy)]
pub enum SlabSource<'a> {
    File(&'a GgufFile),
    Pinned(&'a GgufFile, &'a dyn PinnedSlabs),
}

impl<'a> From<&'a GgufFile> for SlabSource<'a> {
    fn from(f: &'a GgufFile) -> Self {
        SlabSource::File(f)
    }
}

/// A shared file, as the one-op tests hold it.
impl<'a> From<&'a std::sync::Arc<GgufFile>> for SlabSource<'a> {
    fn from(f: &'a std::sync::Arc<GgufFile>) -> Self {
        SlabSource::File(f)
    }
}

/// The geometry of a layer's expert tensors: `gate` and `up` are
/// `n_expert` slabs of `hidden × dim`, `down` of `dim × hidden`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertDims {
    /// Model width (each token's input and output row).
    pub dim: usize,
    /// Expert hidden width.
    pub hidden: usize,
    pub n_expert: usize,
}

impl MoeExperts {
    /// Widths and expert count, from the gate tensor.
    pub fn dims(&self) -> ExpertDims {
        ExpertDims {
            dim: self.gate.ne[0] as usize,
            hidden: self.gate.ne[1] as usize,
            n_expert: self.gate.ne[2] as usize,
        }
    }

    /// `gate` and `up` share one type and shape, so a kernel may read both
    /// rows in one pass (CUDA's fused gate/up launch).
    pub fn gate_up_alike(&self) -> bool {
        self.gate.ty == self.up.ty && self.gate.ne == self.up.ne
    }

    /// Expert `e`'s slab of `t` (one of `gate`, `up`, `down`) as stored.
    pub fn expert_slab<'f>(&self, file: &'f GgufFile, t: &TensorRef, e: usize) -> &'f [u8] {
        let bytes = t.bytes(file);
        let n = bytes.len() / self.dims().n_expert;
        &bytes[e * n..(e + 1) * n]
    }

    /// Expert `e`'s slab of `t` from `src`: the pinned cache slice when
    /// there is one, else the mapping (a full layer; the bytes are equal).
    pub fn slab_from<'f>(&self, src: SlabSource<'f>, t: &TensorRef, e: usize) -> &'f [u8] {
        match src {
            SlabSource::File(f) => self.expert_slab(f, t, e),
            SlabSource::Pinned(f, p) => p.slab(t, e).unwrap_or_else(|| self.expert_slab(f, t, e)),
        }
    }

    /// The (token · k + slot) entries of a step's selection that chose
    /// expert `e`, in order.
    pub fn users(&self, sel: &[i32], n_tokens: usize, e: usize) -> Vec<usize> {
        (0..n_tokens * self.k)
            .filter(|&i| sel[i] as usize == e)
            .collect()
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let n = cx.n();
        cx.write(self.out, |cx, out| {
            let (x, sel, w) = (
                cx.get(self.x),
                cx.get_i32(self.selected),
                cx.get(self.weights),
            );
            self.compute(cx.expert_source(), x, sel, w, n, out)
        });
    }

    /// The rows expert `e`'s `down` slab multiplies, one per row of `xs`
    /// (`n × dim`, the tokens routed to `e`, with route weights `wts`):
    /// `wt · swiglu(gate_e · x, up_e · x)` with the op's clamp, and under
    /// `mid_fp8` the FP8 round trip; `n × hidden`. The CPU twin's own mid
    /// rows (imatrix collection reads them too, `app::imatrix`).
    pub fn mid_rows(&self, src: SlabSource<'_>, e: usize, xs: &[f32], wts: &[f32]) -> Vec<f32> {
        let ExpertDims {
            dim: d, hidden: ff, ..
        } = self.dims();
        let n = wts.len();
        let mut g = vec![0f32; n * ff];
        let mut u = vec![0f32; n * ff];
        let gate = self.slab_from(src, &self.gate, e);
        let up = self.slab_from(src, &self.up, e);
        matmul_rows(self.gate.ty, gate, d, ff, 1, &xs[..n * d], n, &mut g);
        matmul_rows(self.up.ty, up, d, ff, 1, &xs[..n * d], n, &mut u);
        for (j, &wt) in wts.iter().enumerate() {
            for f in 0..ff {
                g[j * ff + f] = wt * swiglu(g[j * ff + f], u[j * ff + f], self.clamp);
            }
        }
        if self.mid_fp8 {
            for row in g.chunks_exact_mut(ff) {
                crate::quant::small_float::fp8_roundtrip(row, MID_FP8_BLOCK);
            }
        }
        g
    }

    pub fn compute<'f>(
        &self,
        src: impl Into<SlabSource<'f>>,
        x: &[f32],
        sel: &[i32],
        w: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) {
        let ExpertDims {
            dim: d,
            hidden: ff,
            n_expert,
        } = self.dims();
        let k = self.k;
        let src = src.into();
        let slab = |t: &TensorRef, e: usize| self.slab_from(src, t, e);
        // One contribution per (token, slot), summed in slot order below.
        let mut contrib = vec![0f32; n_tokens * k * d];
        for e in 0..n_expert {
            let users: Vec<(usize, usize)> = self
                .users(sel, n_tokens, e)
                .into_iter()
                .map(|i| (i / k, i))
                .collect();
            if users.is_empty() {
                continue;
            }
            let n = users.len();
            let mut xs = vec![0f32; n * d];
            for (j, &(t, _)) in users.iter().enumerate() {
                xs[j * d..(j + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
            }
            let wts: Vec<f32> = users.iter().map(|&(_, slot)| w[slot]).collect();
            let g = self.mid_rows(src, e, &xs, &wts);
            let mut y = vec![0f32; n * d];
            matmul_rows(self.down.ty, slab(&self.down, e), ff, d, 1, &g, n, &mut y);
            for (j, &(_, slot)) in users.iter().enumerate() {
                contrib[slot * d..(slot + 1) * d].copy_from_slice(&y[j * d..(j + 1) * d]);
            }
        }
        for t in 0..n_tokens {
            let o = &mut out[t * d..(t + 1) * d];
            o.fill(0.0);
            for i in 0..k {
                for (a, &b) in o
                    .iter_mut()
                    .zip(&contrib[(t * k + i) * d..(t * k + i + 1) * d])
                {
                    *a += b;
                }
            }
        }
    }
}
