//! The fast CPU backend's direct (decode) products over several one-row
//! session pieces (`cargo bench --bench cpu_decode_rows`): what a batched
//! decode step of `m` sessions costs per weight matrix, on Flash shapes —
//! a dense Q8_0 projection [4096 → 4096] and the q2 mix's routed-expert
//! matrices (IQ2_XXS gate [4096 → 2048], Q2_K down [2048 → 4096]) — for
//! m = 1, 2, 4, 8, 16 rows, per kernel path.
//!
//! Figures are per second of *process CPU time* (not wall time), so that a
//! machine shared with other jobs still gives usable ratios; run with
//! RAYON_NUM_THREADS=1 for per-core figures. `GB/cpu-s` counts weight bytes
//! (each read once per call); `ns/row·KiB` is CPU time per activation row per
//! KiB of weights (what one more session costs). Environment:
//! DS4_BENCH_REPS (default 5; the best is reported), DS4_BENCH_ROWS (e.g.
//! `1,8`).

use ds4::backend::cpu::fast::matmul::matmul_segments;
use ds4::backend::cpu::fast::{Isa, Kernels};
use ds4::graph::Segment;
use ds4::quant::GgmlType;
use ds4::testmodel::{random_blocks, Rng};

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = cpu_seconds();
            f();
            cpu_seconds() - t
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let reps: usize = std::env::var("DS4_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let rows: Vec<usize> = std::env::var("DS4_BENCH_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    println!(
        "threads {}; load {}",
        rayon::current_num_threads(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "{:<28} {:>9} {:>4} {:>10} {:>10} {:>12}",
        "shape", "path", "rows", "ms/cpu", "GB/cpu-s", "ns/row·KiB"
    );
    let mut rng = Rng::new(0x6465_636f);
    let cases = [
        (GgmlType::Q8_0, 4096usize, 4096usize, "dense Q8_0"),
        (GgmlType::Iq2Xxs, 4096, 2048, "expert gate IQ2_XXS"),
        (GgmlType::Q2K, 2048, 4096, "expert down Q2_K"),
    ];
    for (ty, n_in, n_out, what) in cases {
        let w = random_blocks(ty, n_in * n_out, &mut rng);
        let m_max = rows.iter().copied().max().unwrap_or(1);
        let x: Vec<f32> = (0..n_in * m_max)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let mut out = vec![0f32; n_out * m_max];
        for isa in Isa::available() {
            let k = Kernels::new(isa).expect("available");
            for &m in &rows {
                let segs: Vec<Segment> = (0..m)
                    .map(|t| Segment {
                        row0: t,
                        n: 1,
                        pos0: 0,
                        state: t,
                    })
                    .collect();
                let s = best(reps, || {
                    matmul_segments(&k, ty, &w, n_in, n_out, 1, &x, &segs, &mut out);
                });
                println!(
                    "{:<28} {:>9} {:>4} {:>10.3} {:>10.2} {:>12.2}",
                    format!("{what} {n_in}->{n_out}"),
                    isa.name(),
                    m,
                    s * 1e3,
                    w.len() as f64 / s / 1e9,
                    s * 1e9 / m as f64 / (w.len() as f64 / 1024.0)
                );
            }
        }
    }
}
