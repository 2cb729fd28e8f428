//! The fast CPU backend's direct (decode) products over several one-row
//! session pieces (`cargo bench --bench cpu_decode_rows`): what a batched
//! decode step of `m` sessions costs per weight matrix, on Flash shapes —
//! a dense Q8_0 projection [4096 → 4096] and the q2 mix's routed-expert
//! matrices (IQ2_XXS gate [4096 → 2048], Q2_K down [2048 → 4096]) — for
//! m = 1, 2, 4, 8, 16 rows, per kernel path.
//!
//! Three figures per case: `product` is the whole direct product
//! (`matmul_segments` over m one-row pieces: activations quantised, rows
//! split over the pool, [`Kernels::dot_many`] per weight row); `many` and
//! `1-row` are the kernels alone on one thread, every weight row against
//! the m activation rows through `dot_many` or through m calls of the
//! 1-row `dot` (what a path without a multi-row kernel does; the two give
//! the same bits). On x86-64 with AVX2 an extra line times the IQ2_XXS
//! 1-row kernel against its table-lookup twin (`avx2::iq2xxs_lookup`).
//!
//! Figures are *process CPU time* (not wall time), so that a machine shared
//! with other jobs still gives usable ratios; run with RAYON_NUM_THREADS=1
//! for per-core figures. GB/s counts weight bytes per CPU-second (each
//! weight row read once per call). Environment:
//! DS4_BENCH_REPS (default 5; the best is reported), DS4_BENCH_ROWS (e.g.
//! `1,8`).

use ds4::backend::cpu::fast::act::Acts;
use ds4::backend::cpu::fast::matmul::matmul_segments;
use ds4::backend::cpu::fast::{Isa, Kernels};
use ds4::graph::Segment;
use ds4::quant::GgmlType;
use ds4::testmodel::{random_blocks, Rng};

#[path = "support/mod.rs"]
mod support;
use support::best;

fn main() {
    let reps = support::reps(5);
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
        "{:<28} {:>9} {:>4} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "shape", "path", "rows", "product ms", "many ms", "1-row ms", "many GB/s", "1row GB/s"
    );
    let mut rng = Rng::new(0x6465_636f);
    let cases = [
        (GgmlType::Q8_0, 4096usize, 4096usize, "dense Q8_0"),
        (GgmlType::Iq2Xxs, 4096, 2048, "expert gate IQ2_XXS"),
        (GgmlType::Q2K, 2048, 4096, "expert down Q2_K"),
    ];
    for (ty, n_in, n_out, what) in cases {
        let w = random_blocks(ty, n_in * n_out, &mut rng);
        let rb = w.len() / n_out;
        let m_max = rows.iter().copied().max().unwrap_or(1);
        let x: Vec<f32> = (0..n_in * m_max)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let acts = Acts::quantize(
            Kernels::act_kind(ty).expect("a fast format"),
            n_in,
            x.chunks_exact(n_in),
        );
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
                let product = best(reps, || {
                    matmul_segments(&k, ty, &w, n_in, n_out, 1, &x, &segs, &mut out);
                });
                let idx: Vec<usize> = (0..m).collect();
                let mut vals = vec![0f32; m];
                let many = best(reps, || {
                    for o in 0..n_out {
                        k.dot_many(ty, &w[o * rb..(o + 1) * rb], &acts, &idx, &mut vals);
                        std::hint::black_box(&vals);
                    }
                });
                let one = best(reps, || {
                    for o in 0..n_out {
                        for (v, &r) in vals.iter_mut().zip(&idx) {
                            *v = k.dot(ty, &w[o * rb..(o + 1) * rb], &acts, r);
                        }
                        std::hint::black_box(&vals);
                    }
                });
                println!(
                    "{:<28} {:>9} {:>4} {:>11.3} {:>11.3} {:>11.3} {:>9.2} {:>9.2}",
                    format!("{what} {n_in}->{n_out}"),
                    isa.name(),
                    m,
                    product * 1e3,
                    many * 1e3,
                    one * 1e3,
                    w.len() as f64 / many / 1e9,
                    w.len() as f64 / one / 1e9,
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        if ty == GgmlType::Iq2Xxs && Isa::Avx2.supported() {
            use ds4::backend::cpu::fast::avx2;
            let Acts::Q8K { blocks, per_row } = &acts else {
                unreachable!("IQ2_XXS reads Q8_K")
            };
            let y = &blocks[..*per_row];
            let time = |f: unsafe fn(&[u8], &[ds4::quant::q8_k::BlockQ8K]) -> f32| {
                best(reps, || {
                    for o in 0..n_out {
                        // SAFETY: AVX2/FMA/F16C checked above.
                        std::hint::black_box(unsafe { f(&w[o * rb..(o + 1) * rb], y) });
                    }
                })
            };
            let (computed, table) = (time(avx2::iq2xxs), time(avx2::iq2xxs_lookup));
            println!(
                "{:<28} avx2 1-row: computed signs {:.3} ms ({:.2} GB/s), table route {:.3} ms ({:.2} GB/s)",
                format!("{what} {n_in}->{n_out}"),
                computed * 1e3,
                w.len() as f64 / computed / 1e9,
                table * 1e3,
                w.len() as f64 / table / 1e9,
            );
        }
    }
}
