//! Token sampling as ds4 does it (SERVER.md §12): greedy below temperature 0;
//! otherwise temperature softmax with min-p, top-p and top-k filters in ds4's
//! order, drawn with a seeded xorshift64* generator.

/// Sampling parameters with ds4's defaults. A turn in thinking mode samples
/// with the defaults whatever the request asked: [`SamplerConfig::for_thinking`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.05,
        }
    }
}

impl SamplerConfig {
    /// The sampler a turn runs with: `self` (what the request asked), or,
    /// when the turn `thinks`, the defaults in its place: temperature 1,
    /// top-p 1, no top-k, min-p 0.05. DeepSeek V4's thinking mode is meant
    /// to be sampled at temperature 1 / top-p 1: the official API fixes
    /// those values for it and ds4 does the same, so a request's own
    /// sampling fields do not apply while the mode thinks (SERVER.md §4.3,
    /// "Thinking mode overrides"; the request parsers call this).
    pub fn for_thinking(self, thinks: bool) -> SamplerConfig {
        if thinks {
            SamplerConfig::default()
        } else {
            self
        }
    }
}

/// Largest top-k ds4 honours.
pub const MAX_TOP_K: usize = 1024;

/// ds4's xorshift64* generator; `U` has 24 bits of resolution.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = if self.state == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            self.state
        };
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) & 0xFF_FFFF) as f32 / 16_777_216.0
    }
}

/// First index of the maximum (NaN never wins).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best
}

pub fn sample(logits: &[f32], cfg: &SamplerConfig, rng: &mut Rng) -> usize {
    if cfg.temperature.is_nan() || cfg.temperature <= 0.0 || logits.is_empty() {
        return argmax(logits);
    }
    let t = cfg.temperature;
    let top_p = if cfg.top_p > 0.0 && cfg.top_p <= 1.0 {
        cfg.top_p
    } else {
        1.0
    };
    let min_p = cfg.min_p.max(0.0);
    if cfg.top_k > 0 {
        let k = (cfg.top_k as usize).min(MAX_TOP_K).min(logits.len());
        let mut idx: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        idx.truncate(k);
        return draw_sorted(logits, &idx, t, top_p, min_p, rng);
    }
    let lmax = logits
        .iter()
        .cloned()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !lmax.is_finite() {
        return argmax(logits);
    }
    if top_p >= 1.0 {
        // Walk in vocabulary order: no sort needed when top-p is off.
        let w = |l: f32| {
            if l.is_finite() {
                ((l - lmax) / t).exp()
            } else {
                0.0
            }
        };
        let total: f32 = logits.iter().map(|&l| w(l)).filter(|&x| x >= min_p).sum();
        let mut r = rng.uniform() * total;
        let mut last = argmax(logits);
        for (i, &l) in logits.iter().enumerate() {
            let wi = w(l);
            if wi < min_p || wi == 0.0 {
                continue;
            }
            last = i;
            r -= wi;
            if r <= 0.0 {
                return i;
            }
        }
        return last;
    }
    let mut idx: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    draw_sorted(logits, &idx, t, top_p, min_p, rng)
}

/// min-p / top-p over candidates sorted by descending logit, then a draw.
fn draw_sorted(
    logits: &[f32],
    idx: &[usize],
    t: f32,
    top_p: f32,
    min_p: f32,
    rng: &mut Rng,
) -> usize {
    if idx.is_empty() {
        return argmax(logits);
    }
    let l0 = logits[idx[0]];
    let w: Vec<f32> = idx.iter().map(|&i| ((logits[i] - l0) / t).exp()).collect();
    let total: f32 = w.iter().sum();
    let p0 = w[0] / total;
    let mut kept = 1;
    let mut mass = p0;
    while kept < w.len() && mass < top_p {
        let p = w[kept] / total;
        if p < p0 * min_p {
            break;
        }
        mass += p;
        kept += 1;
    }
    let sum: f32 = w[..kept].iter().sum();
    let mut r = rng.uniform() * sum;
    for (j, &wj) in w[..kept].iter().enumerate() {
        r -= wj;
        if r <= 0.0 {
            return idx[j];
        }
    }
    idx[kept - 1]
}

/// The log-softmax of one row of logits as ds4 reports it (`ds4
/// --dump-logprobs`, the server's `logprobs`): `logit − log Σ exp(logit)` in
/// f64 over the finite logits, max-shifted. One definition, so the CLI dump
/// and the server give the same numbers bit for bit.
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    lse: f64,
}

impl LogSoftmax {
    pub fn new(logits: &[f32]) -> LogSoftmax {
        let m = logits
            .iter()
            .cloned()
            .filter(|v| v.is_finite())
            .fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| (v as f64 - m).exp())
            .sum::<f64>()
            .ln();
        LogSoftmax { lse }
    }

    /// The log-probability of a token whose logit is `logit`.
    pub fn of(&self, logit: f32) -> f64 {
        logit as f64 - self.lse
    }
}

/// The ids of the `k` largest logits, largest first; equal logits in id
/// order (a total order, so a partial selection gives the full sort's head).
pub fn top_ids(logits: &[f32], k: usize) -> Vec<usize> {
    let order = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_by(order);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freqs(logits: &[f32], cfg: SamplerConfig, n: usize) -> Vec<f64> {
        let mut rng = Rng::new(42);
        let mut c = vec![0usize; logits.len()];
        for _ in 0..n {
            c[sample(logits, &cfg, &mut rng)] += 1;
        }
        c.iter().map(|&x| x as f64 / n as f64).collect()
    }

    #[test]
    fn greedy_takes_first_maximum() {
        let cfg = SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(sample(&[1.0, 3.0, 3.0, -1.0], &cfg, &mut Rng::new(1)), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN, 0.5]), 2);
    }

    #[test]
    fn temperature_one_matches_softmax() {
        // p ∝ (1, 2, 4, 1): ln weights.
        let logits = [0.0f32, 2f32.ln(), 4f32.ln(), 0.0];
        let cfg = SamplerConfig {
            min_p: 0.0,
            ..Default::default()
        };
        let f = freqs(&logits, cfg, 200_000);
        for (got, want) in f.iter().zip([0.125, 0.25, 0.5, 0.125]) {
            assert!((got - want).abs() < 0.005, "{f:?}");
        }
    }

    #[test]
    fn temperature_sharpens() {
        // At T = 0.5 weights square: (1, 4, 16, 1) / 22.
        let logits = [0.0f32, 2f32.ln(), 4f32.ln(), 0.0];
        let cfg = SamplerConfig {
            temperature: 0.5,
            min_p: 0.0,
            ..Default::default()
        };
        let f = freqs(&logits, cfg, 200_000);
        for (got, want) in f
            .iter()
            .zip([1.0 / 22.0, 4.0 / 22.0, 16.0 / 22.0, 1.0 / 22.0])
        {
            assert!((got - want).abs() < 0.005, "{f:?}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // Probabilities (0.5, 0.3, 0.15, 0.05); min_p 0.2 keeps p ≥ 0.1.
        let p = [0.5f32, 0.3, 0.15, 0.05];
        let logits: Vec<f32> = p.iter().map(|x| x.ln()).collect();
        let cfg = SamplerConfig {
            min_p: 0.2,
            ..Default::default()
        };
        let f = freqs(&logits, cfg, 200_000);
        assert_eq!(f[3], 0.0);
        for (got, want) in f.iter().zip([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95]) {
            assert!((got - want).abs() < 0.005, "{f:?}");
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // Sorted (0.5, 0.3, 0.15, 0.05): top_p 0.75 keeps 0.5 + 0.3.
        let p = [0.15f32, 0.5, 0.05, 0.3];
        let logits: Vec<f32> = p.iter().map(|x| x.ln()).collect();
        let cfg = SamplerConfig {
            top_p: 0.75,
            min_p: 0.0,
            ..Default::default()
        };
        let f = freqs(&logits, cfg, 200_000);
        assert_eq!((f[0], f[2]), (0.0, 0.0));
        assert!(
            (f[1] - 0.625).abs() < 0.005 && (f[3] - 0.375).abs() < 0.005,
            "{f:?}"
        );
    }

    #[test]
    fn top_k_limits_candidates() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, 2.0];
        let cfg = SamplerConfig {
            top_k: 2,
            min_p: 0.0,
            ..Default::default()
        };
        let f = freqs(&logits, cfg, 100_000);
        // Top two: index 3 (logit 3) and index 2 (first of the tied 2.0s).
        assert_eq!((f[0], f[1], f[4]), (0.0, 0.0, 0.0));
        let want = 1.0 / (1.0 + (-1f64).exp());
        assert!((f[3] - want).abs() < 0.01, "{f:?}");
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let cfg = SamplerConfig::default();
        let a: Vec<usize> = {
            let mut r = Rng::new(7);
            (0..50).map(|_| sample(&logits, &cfg, &mut r)).collect()
        };
        let b: Vec<usize> = {
            let mut r = Rng::new(7);
            (0..50).map(|_| sample(&logits, &cfg, &mut r)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn zero_seed_uses_the_fixed_constant() {
        let mut a = Rng::new(0);
        let mut b = Rng::new(0x9E37_79B9_7F4A_7C15);
        for _ in 0..4 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let u: Vec<f32> = (0..1000).map(|_| a.uniform()).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    }
}
