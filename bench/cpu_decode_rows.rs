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
//! `1,8`), DS4_BENCH_DRAM (set: two more cases larger than any cache, read
//! from DRAM as a decode step reads its weights).

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
    support::print_machine();
    println!(
        "{:<28} {:>9} {:>4} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "shape", "path", "rows", "product ms", "many ms", "1-row ms", "many GB/s", "1row GB/s"
    );
    let mut rng = Rng::new(0x6465_636f);
    let mut cases = vec![
        (GgmlType::Q8_0, 4096usize, 4096usize, "dense Q8_0"),
        (GgmlType::Iq2Xxs, 4096, 2048, "expert gate IQ2_XXS"),
        (GgmlType::Q2K, 2048, 4096, "expert down Q2_K"),
    ];
    // The cases above fit the last-level cache, so repeats read them from
    // there; in a decode step every weight comes from DRAM once. These two
    // are larger than any cache: a head-sized Q8_0 matrix (276 MiB) and 64
    // IQ2_XXS expert gates back to back (132 MiB).
    if std::env::var_os("DS4_BENCH_DRAM").is_some() {
        cases.push((GgmlType::Q8_0, 4096, 65536, "DRAM head Q8_0"));
        cases.push((GgmlType::Iq2Xxs, 4096, 131072, "DRAM gates IQ2_XXS"));
    }
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
                let segs = Segment::one_row_each(m);
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
        if ty == GgmlType::Q8_0 && n_out == 4096 && Isa::Avx2.supported() {
            let iters = 1usize << 22;
            let t = best(reps, || {
                // SAFETY: AVX2/FMA checked above.
                std::hint::black_box(unsafe { q8_0_register_ceiling(iters) });
            });
            println!(
                "{:<28} avx2 multi-row kernel's operations on registers only: {:.3} ns per row and block",
                format!("{what} {n_in}->{n_out}"),
                t / (iters * 8) as f64 * 1e9
            );
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

/// The AVX2 Q8_0 multi-row kernel's work per weight block and activation
/// row (sign, maddubs, madd, convert, scale product, fma) for 8 rows, with
/// every operand in registers: what the core's vector pipes allow when no
/// byte has to come from memory, to set beside the kernel's figure per row
/// and block (`many ms` ÷ (rows × blocks)).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_register_ceiling(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    let mut w = _mm256_set1_epi8(3);
    let x: [__m256i; 8] = std::array::from_fn(|t| _mm256_set1_epi8(t as i8 + 1));
    let d: [f32; 8] = std::array::from_fn(|t| t as f32 + 1.0);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 8];
    for _ in 0..iters {
        // A new weight block and scale each time, so nothing is hoisted.
        w = black_box(w);
        let aw = _mm256_sign_epi8(w, w);
        let dw = _mm256_set1_ps(black_box(0.5f32));
        for t in 0..8 {
            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[t], w));
            let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(d[t])), p, acc[t]);
        }
    }
    let mut sum = _mm256_setzero_ps();
    for a in acc {
        sum = _mm256_add_ps(sum, a);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
    lanes.iter().sum()
}
