//! Measures the machine's memory read bandwidth: the ceiling that decode
//! speed is reported against (bytes moved per token ÷ bandwidth).

use rayon::prelude::*;
use std::time::Instant;

/// Best-of-`reps` read bandwidth in bytes/s over a `bytes`-sized buffer,
/// read by every rayon thread in parallel (sum of u64 words, so the loads
/// cannot be elided).
pub fn read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let words = bytes / 8;
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut best = 0f64;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, |a, b| a.wrapping_add(b));
        let dt = t.elapsed().as_secs_f64();
        sink ^= s;
        best = best.max((words * 8) as f64 / dt);
    }
    std::hint::black_box(sink);
    best
}
