//! The one-op cases of the matrix products (MatMul, MoeExperts) for every
//! weight type, and the prefill-sized ones of CUDA's tensor-core kernels.

use crate::app::selfcheck::oneop::{Builder, Case, Weights};
use crate::app::selfcheck::rng::Rng;
use crate::graph::ops::{matmul, moe, Op};
use crate::quant::GgmlType;

/// One `MatMul` case: an `n_out × n_in` weight of type `ty` made by the
/// real quantizer, `groups` grouped projections, `n` tokens (graph capacity
/// `cap`), seeded inputs.
#[allow(clippy::too_many_arguments)]
pub fn matmul_case(
    rng: &mut Rng,
    label: &str,
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
    groups: usize,
    n: usize,
    cap: usize,
) -> Case {
    let mut w = Weights::default();
    w.random(rng, "w", &[n_in, n_out], ty, 1.0);
    let (f, r) = w.build();
    let mut b = Builder::new(cap, n);
    let x = b.rec.tokens_f32("x", groups * n_in);
    let o = b.rec.tokens_f32("out", n_out);
    let inputs = vec![(x, rng.scaled(n * groups * n_in, 1.0))];
    let op = Op::MatMul(matmul::MatMul {
        w: r[0].clone(),
        x,
        out: o,
        groups,
        rows: crate::graph::ops::Rows::value(b.rec.value(o)),
    });
    b.finish(
        format!("{label} {ty} {n_in}→{n_out} g{groups} n {n}"),
        f,
        op,
        inputs,
        vec![],
        0,
    )
}

/// The matrix products (MatMul, MoeExperts) for every weight type.
pub fn matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x3A7);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 7usize),
        (GgmlType::F16, 33),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(1usize, 1usize, 1usize), (17, 1, 5), (6, 3, 2)] {
            cases.push(matmul_case(
                &mut rng, "matmul", ty, n_in, n_out, groups, n, 6,
            ));
        }
    }
    // Gate and up of one type take the fused gate+up kernel on CUDA; the
    // mixed cases (F16 gate, BF16 up; Q8_0 gate, Q4_K up) the unfused path.
    for &(ty_g, ty_u, ty_d, d, ff, e, k, n) in &[
        (
            GgmlType::F32,
            GgmlType::F32,
            GgmlType::F32,
            16usize,
            8usize,
            4usize,
            2usize,
            1usize,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            64,
            32,
            5,
            2,
            4,
        ),
        (
            GgmlType::Iq2Xxs,
            GgmlType::Iq2Xxs,
            GgmlType::Q2K,
            256,
            256,
            4,
            3,
            3,
        ),
        (
            GgmlType::Q4K,
            GgmlType::Q4K,
            GgmlType::Q4K,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            GgmlType::Mxfp4,
            96,
            64,
            4,
            2,
            3,
        ),
        (
            GgmlType::Q2K,
            GgmlType::Q2K,
            GgmlType::Iq2Xxs,
            256,
            256,
            3,
            2,
            2,
        ),
        (
            GgmlType::F16,
            GgmlType::Bf16,
            GgmlType::F16,
            40,
            24,
            3,
            2,
            3,
        ),
        (
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q8_0,
            256,
            64,
            3,
            2,
            2,
        ),
    ] {
        // V4.1 model numerics (w2's input through FP8) on the fused gate/up
        // path and on the separate one, ff 24 a short FP8 block.
        let mids: &[bool] = if matches!(ty_g, GgmlType::Q4K | GgmlType::F16) {
            &[false, true]
        } else {
            &[false]
        };
        for &mid_fp8 in mids {
            let mut w = Weights::default();
            w.random(&mut rng, "gate", &[d, ff, e], ty_g, 1.0);
            w.random(&mut rng, "up", &[d, ff, e], ty_u, 1.0);
            w.random(&mut rng, "down", &[ff, d, e], ty_d, 1.0);
            let (f, r) = w.build();
            let mut b = Builder::new(6, n);
            let x = b.rec.tokens_f32("x", d);
            let sel = b.rec.tokens_i32("sel", k);
            let wts = b.rec.tokens_f32("w", k);
            let o = b.rec.tokens_f32("out", d);
            let picks: Vec<f32> = (0..n)
                .flat_map(|t| (0..k).map(move |i| ((t + 2 * i) % e) as f32))
                .collect();
            let inputs = vec![
                (x, rng.scaled(n * d, 1.0)),
                (sel, picks),
                (wts, rng.scaled(n * k, 1.0)),
            ];
            let op = Op::MoeExperts(moe::MoeExperts {
                x,
                selected: sel,
                weights: wts,
                gate: r[0].clone(),
                up: r[1].clone(),
                down: r[2].clone(),
                clamp: 7.0,
                k,
                out: o,
                mid_fp8,
            });
            cases.push(b.finish(
            format!("moe_experts {ty_g}+{ty_u}/{ty_d} d{d} ff{ff} e{e} k{k} n {n} mid_fp8 {mid_fp8}"),
            f,
            op,
            inputs,
            vec![],
            0,
        ));
        }
    }
    cases
}

/// Prefill-sized matmuls (≥ 32 tokens, the tensor-core threshold, and one
/// step below it) for every weight type, 64-row tiles that end mid-tile
/// and a grouped product.
pub fn prefill_matmul_cases() -> Vec<Case> {
    let mut rng = Rng(0x7C0);
    let mut cases = Vec::new();
    for &(ty, n_in) in &[
        (GgmlType::F32, 64usize),
        (GgmlType::F16, 96),
        (GgmlType::Bf16, 64),
        (GgmlType::Q8_0, 128),
        (GgmlType::Q2K, 256),
        (GgmlType::Q4K, 512),
        (GgmlType::Iq2Xxs, 256),
        (GgmlType::Mxfp4, 64),
    ] {
        for &(n_out, groups, n) in &[(70usize, 1usize, 33usize), (128, 2, 40), (20, 1, 5)] {
            cases.push(matmul_case(&mut rng, "mma", ty, n_in, n_out, groups, n, 40));
        }
    }
    cases
}
