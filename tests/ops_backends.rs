//! The cross-backend one-op suite: every op of `Op` is recorded alone
//! through `Recorder`, fed seeded random inputs (weights made with the real
//! quantizers) and random state, its outputs poisoned with NaN, run on every
//! backend present and compared with the CPU twin under the per-op
//! tolerance of the harness. The cases and tolerances live in the library
//! (src/app/selfcheck/cases, oneop.rs), where `ds4-bench --check` runs the
//! same ones on a machine without cargo; tests/common/oneop.rs runs them
//! here. Sizes include 1, odd widths and widths that are not a multiple of
//! the 256-thread workgroup.
//!
//! With `CI` set, a missing wgpu adapter fails the suite instead of
//! skipping it.

mod common;
#[path = "common/oneop.rs"]
mod oneop;

use common::rng::Rng;
use oneop::*;

use ds4::app::selfcheck::cases;
use ds4::backend::cpu::CpuBackend;
use ds4::backend::wgpu::{RowRecord, WgpuBackend};
use ds4::backend::Backend;
use ds4::graph::ops::{rope, Op};
use ds4::graph::StepParams;

#[test]
fn elementwise_ops_match_the_cpu() {
    check(cases::elementwise_cases());
}

#[test]
fn embedding_matches_the_cpu_for_every_table_type() {
    check(cases::embed_cases());
}

#[test]
fn rms_norm_matches_the_cpu() {
    check(cases::rms_norm_cases());
}

#[test]
fn hyper_connection_ops_match_the_cpu() {
    check(cases::hc_cases());
}

#[test]
fn rope_matches_the_cpu_at_small_and_large_positions() {
    check(cases::rope_cases());
}

/// The row table: one GPU step whose rows carry unrelated positions (as rows
/// of several sessions would) against the CPU twin run once per row at that
/// row's position (the CPU twins take consecutive positions only). RoPE is
/// the op whose rows are independent; the KV ops need per-session state
/// selection first (docs/ARCHITECTURE.md, "Per-row parameters").
#[test]
fn rope_rows_carry_their_own_positions() {
    let mut rng = Rng(0x70E5);
    let positions = [1_000_003u32, 7, 100_000, 0, 65_537];
    let (heads, hd, n_rot) = (2usize, 24usize, 16usize);
    let n = positions.len();
    for (gpu, inverse) in gpus()
        .into_iter()
        .flat_map(|g| [(g.clone(), false), (g, true)])
    {
        let (f, _) = Weights::default().build();
        let mut b = Builder::new(n, n);
        let x = b.rec.tokens_f32("x", heads * hd);
        let o = b.rec.tokens_f32("out", heads * hd);
        let input = rng.scaled(n * heads * hd, 2.0);
        let op = Op::Rope(rope::Rope {
            x,
            out: o,
            heads,
            head_dim: hd,
            rope: cases::rope_config(n_rot, true),
            inverse,
        });
        let case = b.finish(format!("rope rows inv {inverse}"), f, op, vec![], vec![], 0);
        let mut wg = WgpuBackend::new(gpu.clone(), case.file.clone(), case.layout.clone()).unwrap();
        let h = wg.load_graph(case.graph.clone()).unwrap();
        wg.write_value(h, x, &input).unwrap();
        wg.write_value(h, o, &vec![f32::NAN; n * heads * hd])
            .unwrap();
        let rows: Vec<RowRecord> = positions
            .iter()
            .map(|&pos| RowRecord { pos, state: 0 })
            .collect();
        wg.run_free_positions(h, &vec![0; n], &rows).unwrap();
        let got = wg.read_value(h, o).unwrap();
        let mut cpu = CpuBackend::new(case.file.clone(), case.layout.clone());
        let hc = cpu.load_graph(case.graph.clone()).unwrap();
        let (abs, rel) = tolerance("rope");
        let w = heads * hd;
        for (t, &pos) in positions.iter().enumerate() {
            cpu.write_value(hc, x, &input[t * w..(t + 1) * w]).unwrap();
            let step = StepParams {
                pos0: pos as usize,
                n_tokens: 1,
            };
            cpu.run(hc, &[0], step).unwrap();
            let want = cpu.read_value(hc, o).unwrap();
            for (j, (&g, &e)) in got[t * w..(t + 1) * w].iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= abs + rel * e.abs(),
                    "row {t} at position {pos}, value {j}: wgpu {g} cpu {e} (inverse {inverse})"
                );
            }
        }
    }
}

#[test]
fn rounding_ops_match_the_cpu() {
    check(cases::rounding_cases());
}

#[test]
fn attention_and_ring_writes_match_the_cpu() {
    check(cases::attention_cases());
}

#[test]
fn compressor_matches_the_cpu() {
    check(cases::compressor_cases());
}

#[test]
fn indexer_matches_the_cpu() {
    check(cases::indexer_cases());
}

#[test]
fn router_matches_the_cpu() {
    check(cases::router_cases());
}

#[test]
fn matrix_products_match_the_cpu_for_every_weight_type() {
    check(cases::matmul_cases());
}

/// Every op with a GPU tolerance has cases in the self-check's groups, so
/// `ds4-bench --check` runs every op the suite runs.
#[test]
fn the_self_check_groups_cover_every_op() {
    use ds4::app::selfcheck::oneop::TOLERANCE;
    let mut seen: Vec<&str> = cases::GROUPS
        .iter()
        .flat_map(|(_, make)| make().into_iter().map(|c| c.op_name))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    for (op, _, _) in TOLERANCE {
        assert!(
            seen.contains(op),
            "no case of {op} in selfcheck::cases::GROUPS"
        );
    }
    assert_eq!(
        seen.len(),
        TOLERANCE.len(),
        "ops without a tolerance: {seen:?}"
    );
}

/// The tensor-core prefill kernels (`mma_<type>`, off by default) against
/// the CPU, on the device or on the emulator's software `mma.sync`, on
/// prefill-sized cases (≥ 32 tokens, the tensor-core threshold, and one
/// step below it) under `oneop::TENSOR_CORE_TOLERANCE`.
#[cfg(feature = "cuda")]
#[test]
fn tensor_core_prefill_matches_the_cpu() {
    cuda_half::check_tensor_cores(
        &cases::prefill_matmul_cases(),
        ds4::app::selfcheck::oneop::TENSOR_CORE_TOLERANCE,
    );
}

#[cfg(feature = "cuda")]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;
