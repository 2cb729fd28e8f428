//! The fast CPU kernels against the reference, on every instruction-set path
//! this machine can run plus the portable one: dense matmuls per weight
//! format (several sizes, odd token counts, grouped projections) and the
//! routed experts, on fresh seeded random inputs with the output poisoned
//! with NaN first.
//!
//! Tolerances (docs/CPU_FAST.md): the fast path quantises activations to
//! int8 per block, so an output may differ from the f32 reference by up to
//! `REL · Σ_i |w_i·x_i|` — the error budget of int8 rounding (half a step of
//! 1/127 of the block maximum per value). Paths that quantise the
//! activations alike differ only in f32 summation order: `PATH_REL · Σ|w·x|`
//! between any two of them.

mod common;
use common::rng::Rng;

use std::sync::Arc;

use ds4::backend::cpu::fast::matmul::{matmul, moe_experts};
use ds4::backend::cpu::fast::{Isa, Kernels};
use ds4::gguf::TensorRef;
use ds4::gguf::{GgufFile, GgufWriter};
use ds4::graph::ops::matmul::matmul_rows;
use ds4::graph::ops::moe::MoeExperts;
use ds4::graph::ValueId;
use ds4::quant::{self, GgmlType};

/// Per weight format: the bound on |fast − reference| / Σ|w·x|.
const REL: &[(GgmlType, f32)] = &[
    (GgmlType::F32, 1e-5),
    (GgmlType::F16, 1e-5),
    (GgmlType::Bf16, 1e-5),
    (GgmlType::Q8_0, 3e-3),
    (GgmlType::Mxfp4, 3e-3),
    (GgmlType::Q2K, 3e-3),
    (GgmlType::Q4K, 3e-3),
    (GgmlType::Iq2Xxs, 3e-3),
];
const PATH_REL: f32 = 1e-5;

/// Every kernel set this machine runs, the portable one first: each
/// available path, plus AVX-512's BW variant (no `vpdpbusd`) beside the
/// VNNI one that `Kernels::new` picks on a VNNI CPU, and plain NEON beside
/// the dotprod one on a dotprod CPU.
fn all_kernels() -> Vec<(String, Kernels)> {
    let mut v: Vec<(String, Kernels)> = Isa::available()
        .into_iter()
        .map(|isa| (isa.name().to_string(), Kernels::new(isa).unwrap()))
        .collect();
    if let (Some(_), Some(bw)) = (Kernels::avx512(true), Kernels::avx512(false)) {
        v.push(("avx512-bw".to_string(), bw));
    }
    if let (Some(_), Some(plain)) = (Kernels::neon(true), Kernels::neon(false)) {
        v.push(("neon-plain".to_string(), plain));
    }
    v
}

fn quantize(ty: GgmlType, values: &[f32], row: usize) -> Vec<u8> {
    let rb = ty.row_bytes(row as u64).unwrap() as usize;
    let mut out = vec![0u8; values.len() / row * rb];
    for (s, d) in values.chunks_exact(row).zip(out.chunks_exact_mut(rb)) {
        quant::quantize_row(ty, s, d, None).unwrap();
    }
    out
}

/// Σ|w·x| per output of a matmul (the scale the errors are measured in).
#[allow(clippy::too_many_arguments)]
fn abs_scale(
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    n_tok: usize,
) -> Vec<f32> {
    let rb = w.len() / n_out;
    let mut wrow = vec![0f32; n_in];
    let mut out = vec![0f32; n_tok * n_out];
    for o in 0..n_out {
        quant::dequantize_row(ty, &w[o * rb..(o + 1) * rb], &mut wrow).unwrap();
        let g = o / (n_out / groups);
        for t in 0..n_tok {
            let xs = &x[t * groups * n_in + g * n_in..][..n_in];
            out[t * n_out + o] = wrow.iter().zip(xs).map(|(a, b)| (a * b).abs()).sum();
        }
    }
    out
}

fn check(label: &str, got: &[f32], want: &[f32], scale: &[f32], rel: f32) -> f32 {
    let mut worst = 0f32;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{label}: output {i} is {g}");
        let r = (g - w).abs() / s.max(1e-20);
        assert!(
            r <= rel,
            "{label}: output {i}: {g} vs {w} (|Δ| = {r:e}·Σ|w·x|, bound {rel:e})"
        );
        worst = worst.max(r);
    }
    worst
}

#[test]
fn matmul_matches_the_reference_on_every_path() {
    let mut rng = Rng(0x5eed_1234_abcd);
    let paths = all_kernels();
    eprintln!(
        "paths: {:?}",
        paths.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    for &(ty, rel) in REL {
        let block = ty.block_elems();
        // (n_in, n_out, groups, tokens): odd rows and token counts, a grouped
        // projection, a row that is not a multiple of 256 where the format allows.
        let mut shapes = vec![
            (512, 37, 1, 1),
            (256, 64, 2, 3),
            (1024, 19, 1, 7),
            (256, 50, 2, 9),
        ];
        if block == 32 {
            shapes.push((96, 33, 1, 5));
        } else if block == 1 {
            shapes.push((13, 9, 1, 2));
            // f32 activations: few rows (the tokens split over the pool,
            // two parts) and enough rows for the row split with byte-sized
            // tiles.
            shapes.push((64, 24, 1, 40));
            shapes.push((512, 300, 1, 9));
        }
        for &(n_in, n_out, groups, n_tok) in &shapes {
            let wv = rng.vec(n_in * n_out);
            let w = quantize(ty, &wv, n_in);
            let x: Vec<f32> = rng
                .vec(n_tok * groups * n_in)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let mut want = vec![f32::NAN; n_tok * n_out];
            matmul_rows(ty, &w, n_in, n_out, groups, &x, n_tok, &mut want);
            let scale = abs_scale(ty, &w, n_in, n_out, groups, &x, n_tok);
            let mut outs = Vec::new();
            for (name, k) in &paths {
                let mut got = vec![f32::NAN; n_tok * n_out];
                assert!(matmul(k, ty, &w, n_in, n_out, groups, &x, n_tok, &mut got));
                let label = format!("{ty} {n_in}x{n_out} g{groups} t{n_tok} {name}");
                let e = check(&label, &got, &want, &scale, rel);
                eprintln!("{label:<40} max |Δ|/Σ|w·x| = {e:.2e}");
                outs.push(got);
            }
            // Paths that quantise the activations alike differ only in f32
            // summation order. (IQ2_XXS and Q2_K products of many tokens
            // keep Q8_K activations on AVX2, `ktile`, and take Q8x32 on the
            // other sets; each is held to the reference above, and the AVX2
            // one to its 1-row kernel bit for bit further down.)
            let kind = |k: &Kernels| k.act_kind_for(ty, n_tok);
            for (i, o) in outs.iter().enumerate().skip(1) {
                let Some(j) = (0..i).find(|&j| kind(&paths[j].1) == kind(&paths[i].1)) else {
                    continue;
                };
                let label = format!("{ty} {n_in}x{n_out} {} vs {}", paths[i].0, paths[j].0);
                check(&label, o, &outs[j], &scale, PATH_REL);
            }
        }
    }
}

fn tensor(w: &mut GgufWriter, name: &str, ne: &[u64], ty: GgmlType, bytes: Vec<u8>) {
    w.add_tensor(name, ne, ty, bytes).unwrap();
}

fn tref(f: &GgufFile, name: &str, ty: GgmlType, ne: [u64; 4]) -> TensorRef {
    let info = f.tensor_info(name).unwrap();
    TensorRef {
        name: name.into(),
        ty,
        ne,
        offset: f.data_offset() + info.offset,
        n_bytes: info.n_bytes,
    }
}

#[test]
fn routed_experts_match_the_reference_on_every_path() {
    let mut rng = Rng(0x0e4e_77a1);
    // (gate/up type, down type): ds4's q2 mix, the q4 and mxfp4 variants, Q8_0.
    let mixes = [
        (GgmlType::Iq2Xxs, GgmlType::Q2K),
        (GgmlType::Q4K, GgmlType::Q4K),
        (GgmlType::Mxfp4, GgmlType::Mxfp4),
        (GgmlType::Q8_0, GgmlType::Q8_0),
    ];
    let (d, ff, n_exp, k) = (256usize, 512usize, 5usize, 3usize);
    for (gu, dn) in mixes {
        // mid_fp8: V4.1's model numerics round the weighted w2 input.
        for (n_tok, mid_fp8) in [
            (1usize, false),
            (1, true),
            (4, false),
            (9, false),
            (9, true),
        ] {
            let mut wr = GgufWriter::new();
            // Rows of `d` inputs for gate and up, of `ff` for down.
            for (name, ty, [n_in, n_out]) in [
                ("gate", gu, [d, ff]),
                ("up", gu, [d, ff]),
                ("down", dn, [ff, d]),
            ] {
                let ne = [n_in as u64, n_out as u64, n_exp as u64];
                tensor(
                    &mut wr,
                    name,
                    &ne,
                    ty,
                    quantize(ty, &rng.vec(d * ff * n_exp), n_in),
                );
            }
            let f = GgufFile::from_vec(wr.to_bytes().unwrap()).unwrap();
            let op = MoeExperts {
                x: ValueId(0),
                selected: ValueId(1),
                weights: ValueId(2),
                gate: tref(&f, "gate", gu, [d as u64, ff as u64, n_exp as u64, 1]),
                up: tref(&f, "up", gu, [d as u64, ff as u64, n_exp as u64, 1]),
                down: tref(&f, "down", dn, [ff as u64, d as u64, n_exp as u64, 1]),
                clamp: 7.0,
                k,
                out: ValueId(3),
                mid_fp8,
            };
            let x = rng.vec(n_tok * d);
            // Distinct experts per token, some experts unused.
            let sel: Vec<i32> = (0..n_tok)
                .flat_map(|t| (0..k).map(move |i| ((t * 2 + i) % n_exp) as i32))
                .collect();
            let wts: Vec<f32> = (0..n_tok * k).map(|_| rng.f().abs() + 0.1).collect();
            let mut want = vec![f32::NAN; n_tok * d];
            op.compute(&f, &x, &sel, &wts, n_tok, &mut want);
            if mid_fp8 {
                // The rounding is there: the twin without it differs.
                let mut plain = vec![f32::NAN; n_tok * d];
                let off = MoeExperts {
                    mid_fp8: false,
                    ..op.clone()
                };
                off.compute(&f, &x, &sel, &wts, n_tok, &mut plain);
                assert_ne!(plain, want, "{gu}/{dn} t{n_tok}: mid_fp8 changed nothing");
            }
            let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
            let f = Arc::new(f);
            for (name, kern) in all_kernels() {
                let mut got = vec![f32::NAN; n_tok * d];
                assert!(moe_experts(&kern, &op, &f, &x, &sel, &wts, n_tok, &mut got));
                // Two quantised layers (x, then the SwiGLU output): the error
                // is measured against the largest output.
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| {
                        assert!(a.is_finite(), "{gu}/{dn} {name}: non-finite output");
                        (a - b).abs() / scale
                    })
                    .fold(0f32, f32::max);
                eprintln!(
                    "moe {gu}/{dn} t{n_tok} mid_fp8 {mid_fp8} {name:<9} max |Δ|/max|y| = {worst:.2e}"
                );
                // mid_fp8 adds a third rounding: a hidden value that the
                // fast path's quantised activations put on the other side of
                // an E4M3 boundary from the twin's moves by a whole step (up
                // to 1/8 of it), so its bound is wider (measured: at most
                // 1.5e-2 without, 2.3e-2 with, over these mixes and paths).
                let bound = if mid_fp8 { 3e-2 } else { 2e-2 };
                assert!(
                    worst < bound,
                    "{gu}/{dn} t{n_tok} mid_fp8 {mid_fp8} {name}: {worst:e}"
                );
            }
        }
    }
}

#[test]
fn isa_names_and_detection() {
    assert!(Isa::available().contains(&Isa::Portable));
    assert_eq!(Isa::parse("avx2"), Some(Isa::Avx2));
    assert_eq!(Isa::parse("avx512"), Some(Isa::Avx512));
    for isa in Isa::available() {
        assert_eq!(Isa::parse(isa.name()), Some(isa));
        assert_eq!(Kernels::new(isa).map(|k| k.isa), Some(isa));
    }
    assert_eq!(Isa::parse("portable"), Some(Isa::Portable));
    assert_eq!(Isa::parse("sse9"), None);
    assert!(Isa::available().contains(&Isa::detect()));
}

/// The prefill path decodes each 2/4-bit row into int8 codes, scales and
/// offsets; those must reproduce the format's values (up to the order of
/// the f32 products: Q2_K computes d·(sc·q) where gguf-py has (d·sc)·q).
#[test]
fn expanded_rows_reproduce_the_dequantised_values() {
    use ds4::backend::cpu::fast::expand::{expand, expandable, Expanded};
    let mut rng = Rng(0xe7a9_0001);
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q4K,
        GgmlType::Iq2Xxs,
        GgmlType::Mxfp4,
        GgmlType::Q8_0,
    ] {
        assert!(expandable(ty));
        for n in [256usize, 768] {
            let v: Vec<f32> = rng.vec(n).iter().map(|x| x * 4.0).collect();
            let row = quantize(ty, &v, n);
            let mut want = vec![0f32; n];
            quant::dequantize_row(ty, &row, &mut want).unwrap();
            let mut e = Expanded::new(n);
            e.codes.fill(99);
            expand(ty, &row, &mut e);
            // Every path's decoder writes the same bytes as the scalar one.
            for isa in Isa::available() {
                let mut f = Expanded::new(n);
                f.codes.fill(-99);
                f.scale.fill(f32::NAN);
                f.off.fill(f32::NAN);
                ds4::backend::cpu::fast::expand::expand_isa(isa, ty, &row, &mut f);
                assert_eq!(f.codes, e.codes, "{ty} n={n} {} codes", isa.name());
                assert_eq!(f.has_off, e.has_off);
                assert_eq!(f.scale, e.scale, "{ty} n={n} {} scales", isa.name());
                if e.has_off {
                    assert_eq!(f.off, e.off, "{ty} n={n} {} offsets", isa.name());
                }
            }
            let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (i, &w) in want.iter().enumerate().take(n) {
                let off = if e.has_off { e.off[i / 16] } else { 0.0 };
                let got = e.scale[i / 32] * e.codes[i] as f32 + off;
                assert!(
                    (got - w).abs() <= 1e-6 * amax,
                    "{ty} n={n} element {i}: {got} vs {w}"
                );
            }
        }
    }
}

/// The prefill GEMM's micro-kernels (`gemm::tile`: up to MR rows × nr
/// tokens per call) against the per-(row, token) kernel of the same path and
/// against the f32 reference, on every path: odd row and token counts, one
/// token, tokens not a multiple of nr, rows not a multiple of MR, widths with
/// a half (32-value) last step.
#[test]
fn gemm_tiles_match_the_pair_kernel_and_the_reference() {
    use ds4::backend::cpu::fast::act::{ActKind, Acts};
    use ds4::backend::cpu::fast::expand::{expand, Expanded};
    use ds4::backend::cpu::fast::gemm::{self, Packed, MR, NR_MAX};
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    eprintln!("seed {seed:#x}");
    let mut rng = Rng(seed);
    for &(ty, _) in REL {
        if !ds4::backend::cpu::fast::expand::expandable(ty) {
            continue;
        }
        let widths: &[usize] = if ty.block_elems() == 32 {
            &[32, 96, 544]
        } else {
            &[256, 768]
        };
        for &n_in in widths {
            for &(n_out, n_tok) in &[(1usize, 1usize), (7, 1), (5, 3), (9, 6), (4, 4), (13, 11)] {
                let wv = rng.vec(n_in * n_out);
                let w = quantize(ty, &wv, n_in);
                let rb = w.len() / n_out;
                let x: Vec<f32> = rng.vec(n_tok * n_in).iter().map(|v| v * 3.0).collect();
                let mut want = vec![f32::NAN; n_tok * n_out];
                matmul_rows(ty, &w, n_in, n_out, 1, &x, n_tok, &mut want);
                let scale = abs_scale(ty, &w, n_in, n_out, 1, &x, n_tok);
                // The rigorous int8 budget: each activation is off by at most
                // half a step (block max / 254), so |Δ| ≤ Σ_b max_b/254 · Σ_b|w|
                // (plus f32 rounding): the bound holds for any seed.
                let mut budget = vec![0f32; n_tok * n_out];
                let mut wrow = vec![0f32; n_in];
                for o in 0..n_out {
                    quant::dequantize_row(ty, &w[o * rb..(o + 1) * rb], &mut wrow).unwrap();
                    for t in 0..n_tok {
                        let xt = &x[t * n_in..(t + 1) * n_in];
                        let mut b = 1e-5 * scale[t * n_out + o];
                        for (wb, xb) in wrow.chunks_exact(32).zip(xt.chunks_exact(32)) {
                            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                            b += amax / 254.0 * wb.iter().map(|v| v.abs()).sum::<f32>() * 1.001;
                        }
                        budget[t * n_out + o] = b;
                    }
                }
                let acts = Acts::quantize(ActKind::Q8x32, n_in, x.chunks_exact(n_in));
                let Acts::Q8x32 { blocks, per_row } = &acts else {
                    unreachable!()
                };
                let sums = ds4::backend::cpu::fast::expand::sums16(blocks);
                let rows: Vec<Expanded> = (0..n_out)
                    .map(|o| {
                        let mut e = Expanded::new(n_in);
                        expand(ty, &w[o * rb..(o + 1) * rb], &mut e);
                        e
                    })
                    .collect();
                let offset = |o: usize, t: usize| {
                    ds4::backend::cpu::fast::expand::offsets(
                        &rows[o],
                        &sums[2 * t * per_row..2 * (t + 1) * per_row],
                    )
                };
                for isa in Isa::available() {
                    let k = Kernels::new(isa).unwrap();
                    let mut packed = Packed::default();
                    packed.pack(isa, blocks, *per_row);
                    let nr = gemm::nr(isa);
                    let mut got = vec![f32::NAN; n_tok * n_out];
                    let mut pair = vec![f32::NAN; n_tok * n_out];
                    for r0 in (0..n_out).step_by(MR) {
                        let r1 = (r0 + MR).min(n_out);
                        for t0 in (0..n_tok).step_by(nr) {
                            let t1 = (t0 + nr).min(n_tok);
                            let toks: Vec<usize> = (t0..t1).collect();
                            let mut out = [[f32::NAN; NR_MAX]; MR];
                            gemm::tile(isa, &rows[r0..r1], &packed, &toks, &mut out);
                            for o in r0..r1 {
                                for t in t0..t1 {
                                    got[t * n_out + o] = out[o - r0][t - t0] + offset(o, t);
                                }
                            }
                        }
                    }
                    for o in 0..n_out {
                        for t in 0..n_tok {
                            let y = &blocks[t * per_row..(t + 1) * per_row];
                            pair[t * n_out + o] =
                                (k.expanded)(&rows[o].codes, &rows[o].scale, y) + offset(o, t);
                        }
                    }
                    let label = format!("gemm {ty} {n_in}x{n_out} t{n_tok} {}", isa.name());
                    let e = check(&label, &got, &want, &scale, f32::INFINITY);
                    check(
                        &format!("{label} vs int8 budget"),
                        &got,
                        &want,
                        &budget,
                        1.0,
                    );
                    check(
                        &format!("{label} vs pair kernel"),
                        &got,
                        &pair,
                        &scale,
                        PATH_REL,
                    );
                    eprintln!("{label:<40} max |Δ|/Σ|w·x| = {e:.2e}");
                }
            }
        }
    }
}

/// The f32 kernels attention and the indexer use directly: the dot product
/// and `y += a·x`, against plain f64 sums, on lengths around every vector
/// width (tails of 1..15 lanes), output poisoned where it must be written.
#[test]
fn f32_dot_and_axpy_on_every_path() {
    let mut rng = Rng(0xf32d_07a9);
    for n in [1usize, 7, 8, 15, 16, 17, 31, 33, 64, 100, 513] {
        let w = rng.vec(n);
        let x = rng.vec(n);
        let want: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let y0 = rng.vec(n);
        let a = rng.f();
        for (name, k) in all_kernels() {
            let got = k.dot_f32(bytemuck::cast_slice(&w), &x);
            assert!(
                ((got as f64) - want).abs() <= 1e-6 * mag + 1e-30,
                "{name} dot n={n}: {got} vs {want}"
            );
            let mut y = y0.clone();
            y.push(f32::NAN); // past the end: must stay untouched
            (k.axpy)(a, &x, &mut y[..n]);
            for i in 0..n {
                let e = y0[i] + a * x[i];
                assert!(
                    (y[i] - e).abs() <= 1e-6 * (e.abs() + 1.0),
                    "{name} axpy n={n} i={i}"
                );
            }
            assert!(y[n].is_nan(), "{name} axpy n={n} wrote past the end");
        }
    }
}

/// The multi-row direct kernels (issue 18: a batched decode step meets each
/// weight row once for all its rows) against the 1-row kernel, bit for bit:
/// `Kernels::dot_many` over 1..=16 activation rows, and the direct product
/// over 1..=17 one-row session pieces (`matmul_segments`: tiles, token
/// groups and the thread split) against each row's own 1-token product.
/// Odd block counts, odd output counts, a grouped projection, outputs
/// poisoned with NaN.
#[test]
fn multi_row_direct_kernels_match_the_one_row_kernel_bit_for_bit() {
    use ds4::backend::cpu::fast::act::Acts;
    use ds4::backend::cpu::fast::matmul::matmul_segments;
    use ds4::backend::cpu::fast::MANY_MAX;
    use ds4::graph::Segment;

    let mut rng = Rng(0x6d75_6c74_6972_6f77);
    for (name, k) in all_kernels() {
        for &(ty, _) in REL {
            let block = ty.block_elems();
            let n_in = match block {
                32 => 32 * (1 + 2 * rng.below(70)), // odd block counts up to 139
                1 => 1 + 2 * rng.below(300),
                _ => 256 * (1 + rng.below(9)),
            };
            let kind = Kernels::act_kind(ty).unwrap();
            // dot_many against dot.
            let n_rows = 1 + rng.below(MANY_MAX);
            let w = quantize(ty, &rng.vec(n_in), n_in);
            let xs: Vec<Vec<f32>> = (0..MANY_MAX + 3).map(|_| rng.scaled(n_in, 3.0)).collect();
            let acts = Acts::quantize(kind, n_in, xs.iter().map(|v| v.as_slice()));
            for m in 1..=n_rows {
                let rows: Vec<usize> = (0..m).map(|_| rng.below(xs.len())).collect();
                let mut got = vec![f32::NAN; m];
                k.dot_many(ty, &w, &acts, &rows, &mut got);
                for (j, &r) in rows.iter().enumerate() {
                    let want = k.dot(ty, &w, &acts, r);
                    assert_eq!(
                        got[j].to_bits(),
                        want.to_bits(),
                        "{name} {ty} n_in {n_in}: dot_many of {m} rows, row {j}: {} vs {want}",
                        got[j]
                    );
                }
            }
            // The direct product over one-row pieces against each row alone.
            let groups = 1 + rng.below(2);
            let n_out = groups * (1 + rng.below(150));
            let w = quantize(ty, &rng.vec(n_in * n_out), n_in);
            for n_tok in [1, 2, 3, 5, 8, 9, 16, 17] {
                let width = groups * n_in;
                let x = rng.scaled(n_tok * width, 3.0);
                let segs = Segment::one_row_each(n_tok);
                let mut got = vec![f32::NAN; n_tok * n_out];
                assert!(matmul_segments(
                    &k, ty, &w, n_in, n_out, groups, &x, &segs, &mut got
                ));
                for t in 0..n_tok {
                    let mut want = vec![f32::NAN; n_out];
                    let xt = &x[t * width..(t + 1) * width];
                    assert!(matmul(&k, ty, &w, n_in, n_out, groups, xt, 1, &mut want));
                    for o in 0..n_out {
                        assert_eq!(
                            got[t * n_out + o].to_bits(),
                            want[o].to_bits(),
                            "{name} {ty} {n_in}x{n_out} g{groups}: {n_tok} pieces, row {t} out {o}"
                        );
                    }
                }
            }
        }
    }
}

/// The many-token product of the formats `ktile` handles (IQ2_XXS and Q2_K
/// on AVX2: Q8_K activations, tiles of 4 rows × 2 tokens) gives each value
/// bit for bit as the 1-row kernel does, so prefill and decode agree on
/// these rows. Raw random blocks (every grid index, sign pattern, sub-block
/// scale and minimum occurs), row counts that leave partial tiles and row
/// blocks, odd token counts, a grouped product, outputs poisoned; on every
/// kernel set (where `ktile` does not handle the format, the many-token
/// product of Q8_K activations must agree with the 1-row kernel too). And
/// the AVX2 Q8_0 tile (`gemm`, even and odd blocks summed apart, scale
/// products made ahead) against the direct AVX2 Q8_0 kernel, bit for bit.
#[test]
fn many_token_products_match_the_one_row_kernel_bit_for_bit() {
    use ds4::backend::cpu::fast::act::{ActKind, Acts};
    use ds4::backend::cpu::fast::ktile;
    use ds4::backend::cpu::fast::matmul::matmul_acts;
    use ds4::testmodel::random_blocks;

    let mut rng = Rng(0x6b74_696c_6562_6974);
    let mut brng = ds4::testmodel::Rng::new(0x6b74);
    for (name, k) in all_kernels() {
        for ty in [GgmlType::Iq2Xxs, GgmlType::Q2K] {
            for (n_in, n_out, groups, n_tok) in [
                (256usize, 1usize, 1usize, 4usize),
                (512, 7, 1, 5),
                (768, 37, 1, 9),
                (256, 22, 2, 7),
                (1024, 64, 1, 4),
            ] {
                let w = random_blocks(ty, n_in * n_out, &mut brng);
                let width = groups * n_in;
                let x = rng.scaled(n_tok * width, 3.0);
                let acts = Acts::quantize(ActKind::Q8K, n_in, x.chunks_exact(n_in));
                let mut got = vec![f32::NAN; n_out * n_tok];
                matmul_acts(&k, ty, &w, n_out, groups, &acts, n_tok, true, &mut got);
                let rb = w.len() / n_out;
                for o in 0..n_out {
                    let g = o / (n_out / groups);
                    for t in 0..n_tok {
                        let want = k.dot(ty, &w[o * rb..(o + 1) * rb], &acts, t * groups + g);
                        assert_eq!(
                            got[o * n_tok + t].to_bits(),
                            want.to_bits(),
                            "{name} {ty} {n_in}x{n_out} g{groups} t{n_tok} (ktile {}): row {o} token {t}: {} vs {want}",
                            ktile::handles(k.isa, ty),
                            got[o * n_tok + t]
                        );
                    }
                }
            }
        }
        if k.isa != Isa::Avx2 {
            continue;
        }
        let ty = GgmlType::Q8_0;
        for (n_in, n_out, groups, n_tok) in [
            (32usize, 3usize, 1usize, 4usize),
            (96, 5, 1, 5),
            (2080, 9, 1, 7),
            (4128, 6, 2, 4),
            (4096, 17, 1, 9),
            (256, 70, 1, 37), // the output transposed in squares of 32: partial ones
        ] {
            let w = quantize(ty, &rng.vec(n_in * n_out), n_in);
            let width = groups * n_in;
            let x = rng.scaled(n_tok * width, 3.0);
            let mut got = vec![f32::NAN; n_tok * n_out];
            assert!(matmul(&k, ty, &w, n_in, n_out, groups, &x, n_tok, &mut got));
            for t in 0..n_tok {
                let mut want = vec![f32::NAN; n_out];
                let xt = &x[t * width..(t + 1) * width];
                assert!(matmul(&k, ty, &w, n_in, n_out, groups, xt, 1, &mut want));
                for o in 0..n_out {
                    assert_eq!(
                        got[t * n_out + o].to_bits(),
                        want[o].to_bits(),
                        "{name} Q8_0 {n_in}x{n_out} g{groups} t{n_tok}: token {t} out {o}: {} vs {}",
                        got[t * n_out + o],
                        want[o]
                    );
                }
            }
        }
    }
}

/// The AVX2 IQ2_XXS kernel computes its sign bytes (index plus parity bit)
/// instead of looking them up; it must give the table route's results bit
/// for bit. Raw random blocks (every byte random but the f16 scale), so
/// every grid index, sign index and sub-block scale occurs, including the
/// group words whose top bits mix sign index 3 with the scale; odd and
/// even block counts; the multi-row kernel (which shares the decode)
/// against the same twin.
#[test]
fn avx2_iq2xxs_computed_signs_match_the_table_route() {
    #[cfg(target_arch = "x86_64")]
    {
        use ds4::backend::cpu::fast::avx2;
        use ds4::quant::q8_k::{quantize_block, BlockQ8K};
        if !Isa::Avx2.supported() {
            eprintln!("no AVX2 here: nothing to compare");
            return;
        }
        let mut rng = Rng(0x7369_676e_7331);
        let mut seen = [false; 128];
        for case in 0..200 {
            let nb = 1 + case % 9;
            let mut row = vec![0u8; 66 * nb];
            for (i, v) in row.iter_mut().enumerate() {
                *v = rng.next_u64() as u8;
                if i % 66 == 1 {
                    // A finite f16 scale (exponent below 31).
                    *v &= 0xfb;
                }
            }
            for b in 0..nb {
                for g in 0..8 {
                    let o = 66 * b + 2 + 8 * g + 4;
                    let a = u32::from_le_bytes(row[o..o + 4].try_into().unwrap());
                    for k in 0..4 {
                        seen[((a >> (7 * k)) & 127) as usize] = true;
                    }
                }
            }
            let ys: Vec<Vec<BlockQ8K>> = (0..3)
                .map(|_| {
                    (0..nb)
                        .map(|_| quantize_block(&rng.scaled(256, 2.0)))
                        .collect()
                })
                .collect();
            for y in &ys {
                // SAFETY: AVX2/FMA/F16C checked above.
                let (got, want) = unsafe { (avx2::iq2xxs(&row, y), avx2::iq2xxs_lookup(&row, y)) };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{nb} blocks: {got} vs {want}"
                );
            }
            let refs: Vec<&[BlockQ8K]> = ys.iter().map(|y| y.as_slice()).collect();
            let mut many = [f32::NAN; 3];
            // SAFETY: as above.
            unsafe { avx2::iq2xxs_many(&row, &refs, &mut many) };
            for (j, y) in ys.iter().enumerate() {
                // SAFETY: as above.
                let want = unsafe { avx2::iq2xxs_lookup(&row, y) };
                assert_eq!(many[j].to_bits(), want.to_bits(), "{nb} blocks, row {j}");
            }
        }
        assert!(seen.iter().all(|&s| s), "every sign index occurred");
    }
}

/// The many-token products' serial parts spread over the pool give what
/// the one-thread versions give: the activations quantised in parallel
/// (`Acts::quantize_par`, from 64 rows on) equal `Acts::quantize` byte for
/// byte, and the tiles' packing in runs (from 4,096 blocks on) holds every
/// block's codes and scale in order.
#[test]
fn parallel_quantisation_and_packing_equal_the_serial_ones() {
    use ds4::backend::cpu::fast::act::{ActKind, Acts};
    use ds4::backend::cpu::fast::gemm::Packed;
    let mut rng = Rng(0x7061_7261_6c6c);
    let n = 512;
    let x = rng.scaled(150 * n, 3.0);
    let rows: Vec<&[f32]> = x.chunks_exact(n).collect();
    for kind in [ActKind::Q8K, ActKind::Q8x32, ActKind::F32] {
        let a = Acts::quantize(kind, n, rows.iter().copied());
        let b = Acts::quantize_par(kind, n, &rows);
        let bytes = |a: &Acts| -> Vec<u8> {
            match a {
                Acts::Q8K { blocks, .. } => bytemuck::cast_slice(blocks).to_vec(),
                Acts::Q8x32 { blocks, .. } => bytemuck::cast_slice(blocks).to_vec(),
                Acts::F32 { values, .. } => bytemuck::cast_slice(values).to_vec(),
            }
        };
        assert_eq!(bytes(&a), bytes(&b), "{kind:?}");
    }
    let x = rng.scaled(40 * 4096, 3.0);
    let acts = Acts::quantize_par(
        ActKind::Q8x32,
        4096,
        &x.chunks_exact(4096).collect::<Vec<_>>(),
    );
    let Acts::Q8x32 { blocks, per_row } = &acts else {
        unreachable!()
    };
    assert!(blocks.len() >= 4 * 1024, "the parallel packing path");
    for isa in Isa::available() {
        let mut p = Packed::default();
        p.pack(isa, blocks, *per_row);
        assert_eq!(p.n, 4096);
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(
                &p.qs[32 * i..32 * i + 32],
                &b.qs[..],
                "{} block {i}",
                isa.name()
            );
            assert_eq!(p.d[i].to_bits(), b.d.to_bits(), "{} block {i}", isa.name());
        }
    }
}

#[test]
fn simd_activation_quantisers_equal_the_scalar_ones_bit_for_bit() {
    use ds4::backend::cpu::fast::act::{q8k, q8x32, quantize_q8x32};
    use ds4::quant::q8_k::quantize_block;
    let mut rng = Rng(0x7175_616e_7473);
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for scale in [1e-3f32, 0.7, 3.0, 250.0] {
        for _ in 0..64 {
            blocks.push(rng.scaled(256, scale));
        }
    }
    // Exact halves after scaling, both signs: the largest magnitude is 127
    // (Q8x32: d = 1) or −127 (Q8_K: iscale = 1), so every x.5 is a tie.
    let ties: Vec<f32> = (0..256)
        .map(|i| match i {
            0 => -127.0,
            _ => ((i % 200) as f32 - 100.0) + if i % 2 == 0 { 0.5 } else { -0.5 },
        })
        .collect();
    blocks.push(ties.clone());
    blocks.push(ties.iter().map(|v| -v).collect());
    // The largest magnitude twice with both signs (the first one counts).
    let mut both = rng.scaled(256, 1.0);
    both[7] = 4.0;
    both[9] = -4.0;
    blocks.push(both.clone());
    blocks.push(both.iter().map(|v| -v).collect());
    // Zeros, negative zeros, denormals (the scale underflows), NaN and
    // infinities among ordinary values.
    blocks.push(vec![0.0; 256]);
    blocks.push(
        (0..256)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect(),
    );
    blocks.push((0..256).map(|i| (i % 5) as f32 * 1e-45).collect());
    blocks.push((0..256).map(|i| (i % 7) as f32 * -1e-39).collect());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut b = rng.scaled(256, 2.0);
        b[5] = bad;
        b[200] = bad;
        blocks.push(b);
    }
    let mut checked = 0;
    for (i, b) in blocks.iter().enumerate() {
        let (want, got) = (quantize_block(b), q8k(b));
        assert_eq!(
            bytemuck::bytes_of(&want),
            bytemuck::bytes_of(&got),
            "Q8_K block {i}"
        );
        for (j, x) in b.chunks_exact(32).enumerate() {
            let (want, got) = (quantize_q8x32(x), q8x32(x));
            assert_eq!(
                bytemuck::bytes_of(&want),
                bytemuck::bytes_of(&got),
                "Q8x32 block {i}.{j}"
            );
            checked += 1;
        }
    }
    assert!(checked > 2000);
}

#[test]
fn row_ops_over_the_pool_equal_the_reference_bit_for_bit() {
    use ds4::backend::cpu::fast::rows;
    use ds4::graph::ops::norm::{rms_norm, RmsNorm};
    use ds4::graph::ops::rope::{Rope, RopeConfig, Yarn};
    use ds4::graph::ops::Rows;
    let mut rng = Rng(0x726f_7773);
    // Row counts below, at and above the 8 side-by-side sums and the
    // per-task split; rows of odd widths.
    for (dim, n_rows) in [
        (7usize, 3usize),
        (300, 8),
        (500, 87),
        (4096, 41),
        (64, 1500),
    ] {
        let x = rng.scaled(dim * n_rows, 5.0);
        let w = rng.scaled(dim, 1.5);
        for weighted in [false, true] {
            let op = RmsNorm {
                x: ValueId(0),
                out: ValueId(1),
                dim,
                weight: None,
                eps: 1e-6,
                rows: Rows {
                    per_token: n_rows,
                    fixed: 0,
                },
            };
            let w = weighted.then_some(&w[..]);
            let mut want = vec![f32::NAN; x.len()];
            rms_norm(&x, w, dim, op.eps, &mut want);
            let mut got = vec![f32::NAN; x.len()];
            rows::rms_norm(&op, w, &x, &mut got);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "rms_norm {dim}×{n_rows} w {weighted}"
            );
        }
    }
    for (heads, head_dim, n_rot, n_tokens, pos0, inverse) in [
        (1usize, 8usize, 8usize, 1usize, 0usize, false),
        (4, 64, 16, 150, 3, false),
        (64, 512, 64, 70, 1_000_003, true),
    ] {
        let op = Rope {
            x: ValueId(0),
            out: ValueId(1),
            heads,
            head_dim,
            rope: RopeConfig {
                base: 10000.0,
                yarn: Some(Yarn {
                    factor: 16.0,
                    original_context: 65536,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                }),
                n_rot,
            },
            inverse,
        };
        let x = rng.scaled(n_tokens * heads * head_dim, 2.0);
        let mut want = vec![f32::NAN; x.len()];
        op.compute(&x, pos0, n_tokens, &mut want);
        let mut got = vec![f32::NAN; x.len()];
        rows::rope(&op, &x, pos0, n_tokens, &mut got);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "rope {heads}×{head_dim} t{n_tokens} pos {pos0}"
        );
    }
}
