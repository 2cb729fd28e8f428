//! The tests' seeded generators, in one place. Inputs depend only on the
//! seed, so a failing case reruns identically. Two generators, kept apart
//! because the existing tests' inputs (and so their measured errors) come
//! from them exactly:
//! - [`Rng`], xorshift64: uniform values in [-1, 1), indices, bytes;
//! - [`Normal`], SplitMix64 with Box–Muller: normally distributed values,
//!   as the quantizer and matrix-kernel tests draw them.

/// xorshift64 (13, 7, 17). The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1) (24 bits).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` values of [`Rng::f`].
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }

    /// `n` values of [`Rng::f`] times `scale`.
    pub fn scaled(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }

    /// Uniform in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `len` indexer selections (as f32) of rows below `cap`: every fourth
    /// unused (-1), the others random, so some are not yet visible.
    pub fn selection(&mut self, len: usize, cap: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                if i % 4 == 3 {
                    -1.0
                } else {
                    self.below(cap) as f32
                }
            })
            .collect()
    }
}

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
