//! Routed-expert matvec speed per weight type (`cargo bench --bench expert_matvec`).
//!
//! One decode step's routed-expert work for one layer of Flash: 6 experts ×
//! gate [4096 → 2048], up [4096 → 2048] and down [2048 → 4096], one token,
//! through the CPU backend's kernel (`ops::matmul::matmul_rows`: each weight
//! row dequantised to f32, then an f32 dot). Reported per type as GB/s of
//! weight bytes read and as a fraction of the read bandwidth measured in the
//! same run, beside Q2_K / IQ2_XXS / Q4_K / Q8_0.
//!
//! Weights are random valid blocks (`testmodel::random_blocks`); the speed of
//! a decoder does not depend on the values. Environment: DS4_BENCH_REPS
//! (default 5 timed repetitions after one warm-up; the best is reported).

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use ds4::graph::ops::matmul::matmul_rows;
use ds4::quant::GgmlType;
use ds4::testmodel::{random_blocks, Rng};

const D: usize = 4096;
const FF: usize = 2048;
const USED: usize = 6;

struct Slabs {
    gate: Vec<Vec<u8>>,
    up: Vec<Vec<u8>>,
    down: Vec<Vec<u8>>,
}

fn slabs(ty: GgmlType, rng: &mut Rng) -> Slabs {
    let mut make = || (0..USED).map(|_| random_blocks(ty, D * FF, rng)).collect();
    Slabs {
        gate: make(),
        up: make(),
        down: make(),
    }
}

/// One token through 6 experts: gate/up matvecs, SwiGLU-shaped mix, down.
fn step(ty: GgmlType, s: &Slabs, x: &[f32], g: &mut [f32], u: &mut [f32], y: &mut [f32]) {
    for e in 0..USED {
        matmul_rows(ty, &s.gate[e], D, FF, 1, x, 1, g);
        matmul_rows(ty, &s.up[e], D, FF, 1, x, 1, u);
        for (a, b) in g.iter_mut().zip(u.iter()) {
            *a = *a / (1.0 + (-*a).exp()) * b;
        }
        matmul_rows(ty, &s.down[e], FF, D, 1, g, 1, y);
    }
}

fn main() {
    let reps = support::reps(5);
    let threads = rayon::current_num_threads();
    eprintln!("measuring read bandwidth ...");
    let bw = ds4::backend::bandwidth::read_bandwidth(1 << 30, 5);
    println!("threads        {threads}");
    println!("read bandwidth {:.2} GB/s (best of 5 over 1 GiB)", bw / 1e9);
    println!(
        "work           one layer's routed experts for one token: {USED} × (gate + up [{D}→{FF}], down [{FF}→{D}])"
    );
    println!();
    println!("| type | bits/weight | bytes read | best time | GB/s | of read bandwidth |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut rng = Rng::for_name(7, "expert_matvec");
    let x: Vec<f32> = (0..D).map(|_| rng.normal() as f32).collect();
    let (mut g, mut u, mut y) = (vec![0f32; FF], vec![0f32; FF], vec![0f32; D]);
    for ty in [
        GgmlType::Q2K,
        GgmlType::Iq2Xxs,
        GgmlType::Q4K,
        GgmlType::Mxfp4,
        GgmlType::Q8_0,
    ] {
        let s = slabs(ty, &mut rng);
        let bytes: usize = [&s.gate, &s.up, &s.down]
            .iter()
            .flat_map(|v| v.iter())
            .map(|b| b.len())
            .sum();
        step(ty, &s, &x, &mut g, &mut u, &mut y); // warm-up: page in, caches
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = Instant::now();
            step(ty, &s, &x, &mut g, &mut u, &mut y);
            best = best.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(&y);
        let gbs = bytes as f64 / best / 1e9;
        println!(
            "| {ty} | {:.4} | {:.1} MiB | {:.1} ms | {gbs:.2} | {:.1} % |",
            ty.block_bytes() as f64 * 8.0 / ty.block_elems() as f64,
            bytes as f64 / (1u64 << 20) as f64,
            best * 1e3,
            100.0 * gbs * 1e9 / bw
        );
    }
}
