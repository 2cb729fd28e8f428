//! The one-op cases' generator (xorshift64): uniform values in [-1, 1),
//! indices and selections. A case's inputs depend only on its seed, so a
//! failing case reruns identically, here and in the tests
//! (tests/common/rng.rs re-exports it).

/// xorshift64 (13, 7, 17). The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// The next raw 64-bit state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1) (24 bits).
    pub fn f(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
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
        (self.next_u64() % n.max(1) as u64) as usize
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
