//! The fast CPU backend's prefill GEMM per weight format and kernel path
//! (`cargo bench --bench cpu_gemm`), beside the per-(row, token) expanded-row
//! kernel it replaced, on Flash shapes: a dense Q8_0 projection [4096 → 4096]
//! over 256 and 2,048 tokens, and routed-expert shapes (IQ2_XXS gate [4096 → 2048],
//! Q2_K down [2048 → 4096]) over 6 and 64 tokens (256 prompt tokens × 6 of
//! 256 experts give ~6 tokens per expert).
//!
//! Figures are integer multiply-adds per second of *process CPU time* (not
//! wall time), so that a machine shared with other jobs still gives usable
//! ratios; run with RAYON_NUM_THREADS=1 for per-core figures. Environment:
//! DS4_BENCH_REPS (default 3; the best is reported), DS4_BENCH_ONLY (run
//! the shapes whose name contains it, e.g. `x2048`), DS4_CPU_ISA (one
//! kernel path).

use ds4::backend::cpu::fast::act::{ActKind, Acts};
use ds4::backend::cpu::fast::expand::{expand, expand_isa, offsets, sums16, Expanded};
use ds4::backend::cpu::fast::ktile;
use ds4::backend::cpu::fast::matmul::matmul;
use ds4::backend::cpu::fast::{Isa, Kernels};
use ds4::quant::GgmlType;
use ds4::testmodel::{random_blocks, Rng};

#[path = "support/mod.rs"]
mod support;
use support::best;

/// The replaced prefill loop: rows decoded in tiles of 4, one expanded-row
/// dot product per (row, token).
#[allow(clippy::too_many_arguments)] // the kernel call's own arguments
fn pair_path(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
) {
    let acts = Acts::quantize(ActKind::Q8x32, n_in, x.chunks_exact(n_in));
    let Acts::Q8x32 { blocks, per_row } = &acts else {
        unreachable!()
    };
    let sums = sums16(blocks);
    let rb = w.len() / n_out;
    let mut tile: Vec<Expanded> = (0..4).map(|_| Expanded::new(n_in)).collect();
    for r0 in (0..n_out).step_by(4) {
        let r1 = (r0 + 4).min(n_out);
        for (e, o) in tile.iter_mut().zip(r0..r1) {
            expand(ty, &w[o * rb..(o + 1) * rb], e);
        }
        for t in 0..n_tok {
            let y = &blocks[t * per_row..(t + 1) * per_row];
            for (e, o) in tile.iter().zip(r0..r1) {
                out[t * n_out + o] = (k.expanded)(&e.codes, &e.scale, y)
                    + offsets(e, &sums[2 * t * per_row..2 * (t + 1) * per_row]);
            }
        }
    }
}

fn main() {
    let reps = support::reps(3);
    support::print_machine();
    println!(
        "{:<34} {:>9} {:>16} {:>16} {:>7}",
        "shape", "path", "gemm GMAC/cpu-s", "pair GMAC/cpu-s", "ratio"
    );
    let mut rng = Rng::new(0x6e33);
    let cases = [
        (GgmlType::Q8_0, 4096usize, 4096usize, 256usize, "dense Q8_0"),
        (GgmlType::Q8_0, 4096, 4096, 2048, "dense Q8_0"),
        (GgmlType::Iq2Xxs, 4096, 2048, 6, "expert gate IQ2_XXS"),
        (GgmlType::Q2K, 2048, 4096, 6, "expert down Q2_K"),
        (GgmlType::Iq2Xxs, 4096, 2048, 64, "expert gate IQ2_XXS"),
    ];
    let only = std::env::var("DS4_BENCH_ONLY").unwrap_or_default();
    for (ty, n_in, n_out, n_tok, what) in cases {
        let name = format!("{what} {n_in}->{n_out} x{n_tok}");
        if !name.contains(&only) {
            continue;
        }
        let w = random_blocks(ty, n_in * n_out, &mut rng);
        let x: Vec<f32> = (0..n_in * n_tok)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let mut out = vec![0f32; n_out * n_tok];
        let macs = (n_in * n_out * n_tok) as f64;
        for isa in Isa::available() {
            if std::env::var("DS4_CPU_ISA").is_ok_and(|v| v != isa.name()) {
                continue;
            }
            let k = Kernels::new(isa).expect("available");
            let g = best(reps, || {
                matmul(&k, ty, &w, n_in, n_out, 1, &x, n_tok, &mut out);
            });
            let p = best(reps, || {
                pair_path(&k, ty, &w, n_in, n_out, &x, n_tok, &mut out)
            });
            // The share of the GEMM's time spent decoding rows (once each).
            let rb = w.len() / n_out;
            // (The formats `ktile` handles decode into its rows instead.)
            let mut e = Expanded::new(n_in);
            let mut kr = ktile::KRow::new(n_in);
            let dec = best(reps, || {
                for o in 0..n_out {
                    let row = &w[o * rb..(o + 1) * rb];
                    if ktile::handles(isa, ty) {
                        ktile::decode(ty, row, &mut kr);
                    } else {
                        expand_isa(isa, ty, row, &mut e);
                    }
                }
                std::hint::black_box((&e, &kr));
            });
            println!(
                "{:<34} {:>9} {:>16.2} {:>16.2} {:>6.2}x {:>7.0}%",
                format!("{what} {n_in}->{n_out} x{n_tok}"),
                isa.name(),
                macs / g / 1e9,
                macs / p / 1e9,
                p / g,
                100.0 * dec / g
            );
        }
    }
}
