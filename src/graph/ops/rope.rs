//! Partial rotary embedding on the tail of each head, interleaved pairs, with
//! YaRN frequency blending on compressed layers (MODEL.md §3.4.1).

use super::CpuCx;
use crate::graph::ValueId;

/// YaRN frequency interpolation used by compressed layers (MODEL.md §3.4.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_context: u64,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// The RoPE variant of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub base: f32,
    pub yarn: Option<Yarn>,
    /// Rotated dims (the tail of each head).
    pub n_rot: usize,
}

/// Rotates the last `n_rot` dims of every `head_dim`-wide head of token `t`
/// by its absolute position `pos0 + t` (or back, with `inverse`).
#[derive(Clone, Debug)]
pub struct Rope {
    pub x: ValueId,
    pub out: ValueId,
    pub heads: usize,
    pub head_dim: usize,
    pub rope: RopeConfig,
    pub inverse: bool,
}

impl Rope {
    /// Values per token (one GPU thread each).
    pub fn items(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        let (pos0, n) = (cx.p.pos0, cx.n());
        cx.write(self.out, |cx, out| {
            self.compute(cx.get(self.x), pos0, n, out)
        });
    }

    pub fn compute(&self, x: &[f32], pos0: usize, n_tokens: usize, out: &mut [f32]) {
        let freqs = frequencies(&self.rope);
        let w = self.heads * self.head_dim;
        let mut turns = Vec::new();
        for (t, (xr, or)) in x[..n_tokens * w]
            .chunks_exact(w)
            .zip(out[..n_tokens * w].chunks_exact_mut(w))
            .enumerate()
        {
            self.token(&freqs, (pos0 + t) as f64, &mut turns, xr, or);
        }
    }

    /// One token's row `x` at position `pos` into `out`: the angles' sines
    /// and cosines made once (into `turns`) for all its heads.
    pub fn token(
        &self,
        freqs: &[f64],
        pos: f64,
        turns: &mut Vec<(f64, f64)>,
        x: &[f32],
        out: &mut [f32],
    ) {
        turns.clear();
        turns.extend(freqs.iter().map(|&f| turn(pos, f, self.inverse)));
        out.copy_from_slice(x);
        for head in out.chunks_exact_mut(self.head_dim) {
            rotate_by(head, turns);
        }
    }
}

/// Per-pair angular frequency, in f64 (the reference path keeps angles exact;
/// f32 angle error at position 1M would be ~0.1 rad).
pub fn frequencies(r: &RopeConfig) -> Vec<f64> {
    let n = r.n_rot;
    let theta = r.base as f64;
    let base: Vec<f64> = (0..n / 2)
        .map(|k| theta.powf(-2.0 * k as f64 / n as f64))
        .collect();
    let Some(y) = r.yarn else { return base };
    let corr = |beta: f64| {
        n as f64 * (y.original_context as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let lo = corr(y.beta_fast as f64).floor().max(0.0);
    let hi = corr(y.beta_slow as f64).ceil().min(n as f64 - 1.0);
    let s = y.factor as f64;
    base.iter()
        .enumerate()
        .map(|(k, &b)| {
            let ramp = ((k as f64 - lo) / (hi - lo).max(0.001)).clamp(0.0, 1.0);
            b * (1.0 - ramp) + (b / s) * ramp
        })
        .collect()
}

/// Rotates the tail `2·freqs.len()` dims of `head` by angle `pos · freq`.
pub fn rotate(head: &mut [f32], freqs: &[f64], pos: f64, inverse: bool) {
    let turns: Vec<(f64, f64)> = freqs.iter().map(|&f| turn(pos, f, inverse)).collect();
    rotate_by(head, &turns);
}

/// `(sin, cos)` of the angle `pos · freq` (the sine negated for `inverse`).
pub fn turn(pos: f64, freq: f64, inverse: bool) -> (f64, f64) {
    let (s, c) = (pos * freq).sin_cos();
    (if inverse { -s } else { s }, c)
}

/// Rotates the tail `2·turns.len()` dims of `head` pair by pair.
pub fn rotate_by(head: &mut [f32], turns: &[(f64, f64)]) {
    let tail = head.len() - 2 * turns.len();
    for (k, &(s, c)) in turns.iter().enumerate() {
        let (x0, x1) = (head[tail + 2 * k] as f64, head[tail + 2 * k + 1] as f64);
        head[tail + 2 * k] = (x0 * c - x1 * s) as f32;
        head[tail + 2 * k + 1] = (x0 * s + x1 * c) as f32;
    }
}
