//! The tests' seeded generators, in one place. Inputs depend only on the
//! seed, so a failing case reruns identically. Two generators, kept apart
//! because the existing tests' inputs (and so their measured errors) come
//! from them exactly:
//! - [`Rng`], xorshift64: uniform values in [-1, 1), indices, bytes (the
//!   library's, src/app/selfcheck/rng.rs: the one-op cases live there);
//! - [`Normal`], SplitMix64 with Box–Muller: normally distributed values,
//!   as the quantizer and matrix-kernel tests draw them.

#[allow(unused_imports)]
pub use ds4::app::selfcheck::rng::Rng;

/// SplitMix64, with Box–Muller normals.
pub struct Normal(pub u64);

impl Normal {
    /// A generator for the case `name` under `seed` (FNV-1a of the name).
    pub fn for_name(seed: u64, name: &str) -> Normal {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Normal(seed ^ h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) (53 bits).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal value.
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// [`Normal::normal`] as f32.
    pub fn gauss(&mut self) -> f32 {
        self.normal() as f32
    }

    /// `n` normal values of standard deviation `sigma`.
    pub fn gauss_vec(&mut self, n: usize, sigma: f32) -> Vec<f32> {
        (0..n).map(|_| sigma * self.gauss()).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
