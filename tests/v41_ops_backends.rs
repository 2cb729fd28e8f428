//! The DeepSeek V4.1 ops (`Op::V41`) in the cross-backend one-op
//! harness (tests/common/oneop.rs): each op alone, seeded random inputs and
//! state, outputs poisoned, run on the fast CPU backend, on wgpu (lavapipe
//! in CI) and on CUDA (the host emulator without a GPU) against its CPU
//! twin. The cases live in the library (src/app/selfcheck/cases/v41.rs),
//! where `ds4-bench --check` runs them too; the chunked-state runs are
//! this file's own.
//!
//! EngramHash and EngramLookup have no GPU kernels by design (the host
//! hashes and reads the rows; docs/V41.md); tests/v41_gpu_fidelity.rs
//! checks that the GPU backends refuse them with the way out named.

mod common;
#[cfg(feature = "cuda")]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;
#[allow(dead_code)]
#[path = "common/oneop.rs"]
mod oneop;

use common::rng::Rng;
use oneop::*;

use ds4::app::selfcheck::cases::{
    candidate_blocks_cases, candidate_topk_cases, compressor_case, engram_gate_cases,
    hc_one_hot_cases, source_compressor_cases, CompressShape,
};

#[test]
fn hc_one_hot_matches_the_cpu() {
    check(hc_one_hot_cases());
}

#[test]
fn engram_gate_matches_the_cpu() {
    check(engram_gate_cases());
}

#[test]
fn source_compressor_matches_the_cpu() {
    check(source_compressor_cases());
}

/// The compressor with its rows and index keys split over several
/// bindings (chunks of `cap` bytes): the step writes rows on both sides of
/// chunk boundaries, odd widths, decode, a capacity the step overruns; the
/// frontier (`ratio` rows) still fits one chunk. Bit-identical to whole
/// bindings and within tolerance of the CPU.
#[test]
fn source_compressor_over_chunked_state_matches_the_cpu() {
    let mut rng = Rng(0xC0C4);
    // (shape, bytes per chunk, (row chunks, key chunks)).
    let shapes: [(CompressShape, u64, (usize, usize)); 6] = [
        // Rows 35..43 of 46: chunks of 7 rows of 33 and 13 keys of 17.
        ((1, 33, 17, 8, 9, 35, 0), 7 * 33 * 4, (7, 4)),
        // Rows 10..13 of 16 (groups of 2 across the step): 3 rows, 6 keys.
        ((2, 32, 16, 8, 9, 20, 0), 3 * 32 * 4, (6, 3)),
        // Rows past 256 threads: 3 rows of 300 (8 chunks), 6 keys of 130.
        ((1, 300, 130, 64, 3, 17, 0), 3 * 300 * 4, (8, 4)),
        // Ratio 4: rows in 2 chunks of 4, keys whole; frontier one chunk.
        ((4, 40, 24, 8, 13, 6, 0), 4 * 40 * 4, (2, 1)),
        // Decode, ratio 2, the frontier exactly one chunk.
        ((2, 64, 32, 16, 1, 9, 0), 2 * 64 * 4, (4, 2)),
        // Capacity 3 overrun by a 6-token step.
        ((1, 16, 8, 4, 6, 0, 3), 16 * 4, (3, 2)),
    ];
    let cases: Vec<(Case, u64)> = shapes
        .iter()
        .map(|&(shape, cap, _)| (compressor_case(&mut rng, shape), cap))
        .collect();
    // A cap below the frontier (4 rows of 40: 640 bytes): refused with the
    // reason, not run wrong.
    let small = compressor_case(&mut rng, (4, 40, 24, 8, 13, 6, 0));
    for g in gpus() {
        let chunks = check_chunked_on_gpu(&g, &cases);
        for ((_, _, want), got) in shapes.iter().zip(&chunks) {
            assert_eq!((got[0], got[1]), *want, "rows and keys chunks");
            assert!(got[2..].iter().all(|&c| c == 1), "frontier in one chunk");
        }
        let opts = ds4::backend::BackendOptions {
            state_chunk_cap: Some(320),
            ..Default::default()
        };
        let mut b = ds4::backend::wgpu::WgpuBackend::with_options(
            g.clone(),
            small.file.clone(),
            small.layout.clone(),
            &opts,
        )
        .unwrap();
        let err = run_case(&small, &mut b).unwrap_err().to_string();
        eprintln!("frontier over two bindings: {err}");
        assert!(
            err.contains("comp_state_kv") && err.contains("independent of the context"),
            "{err}"
        );
    }
}

#[test]
fn candidate_blocks_match_the_cpu() {
    let (cases, ties_at_cut) = candidate_blocks_cases();
    assert!(ties_at_cut > 0, "no grid case ties at the cut");
    check(cases);
}

#[test]
fn candidate_topk_matches_the_cpu() {
    check(candidate_topk_cases());
}

/// Both selections with the index keys split over several bindings: chunks
/// of an odd number of rows (so candidate blocks straddle boundaries), at
/// most 7 per state; every case of SELECT_CASES (ties included) must be
/// bit-identical to whole bindings and equal to the CPU's.
#[test]
fn candidate_selections_over_chunked_keys_match_the_cpu() {
    let cases: Vec<(Case, u64)> = candidate_blocks_cases()
        .0
        .into_iter()
        .chain(candidate_topk_cases())
        .map(|c| {
            let keys = c.layout.get(ds4::graph::StateId(0));
            let rows = keys.rows.div_ceil(7) | 1;
            let cap = (rows * keys.cols * 4) as u64;
            (c, cap)
        })
        .collect();
    for g in gpus() {
        let chunks = check_chunked_on_gpu(&g, &cases);
        for ((c, _), n) in cases.iter().zip(&chunks) {
            assert!(n[0] >= 2, "{}: keys in {} chunk(s)", c.label, n[0]);
        }
    }
}
