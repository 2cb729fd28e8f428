//! Every one-op case, once: the cross-backend suite (tests/ops_backends.rs,
//! tests/v41_ops_backends.rs) and `ds4-bench --check` run these lists with
//! the tolerances of [`super::oneop`]. Each group builds its cases from its
//! own seed, so a group's inputs do not depend on which others run.

mod attention;
mod basic;
mod matmul;
mod v41;

pub use attention::{attention_cases, compressor_cases, indexer_cases, router_cases};
pub use basic::{
    elementwise_cases, embed_cases, hc_cases, rms_norm_cases, rope_cases, rope_config,
    rounding_cases,
};
pub use matmul::{matmul_case, matmul_cases, prefill_matmul_cases};
pub use v41::{
    candidate_blocks_cases, candidate_topk_cases, compressor_case, engram_gate_cases,
    hc_one_hot_cases, source_compressor_cases, v41_rope, CompressShape,
};

use super::oneop::Case;

/// A named group of one-op cases and the function that makes them.
pub type Group = (&'static str, fn() -> Vec<Case>);

/// The groups of cases every backend runs, by name, in the suite's order
/// (the tensor-core cases are CUDA's own: [`prefill_matmul_cases`]).
pub const GROUPS: &[Group] = &[
    ("elementwise", elementwise_cases),
    ("embed", embed_cases),
    ("rms_norm", rms_norm_cases),
    ("hyper-connections", hc_cases),
    ("rope", rope_cases),
    ("rounding", rounding_cases),
    ("attention+ring", attention_cases),
    ("compressor", compressor_cases),
    ("indexer", indexer_cases),
    ("router", router_cases),
    ("matmul+moe", matmul_cases),
    ("v41 hc_one_hot", hc_one_hot_cases),
    ("v41 engram_gate", engram_gate_cases),
    ("v41 compressor", source_compressor_cases),
    ("v41 candidate_blocks", candidate_blocks),
    ("v41 candidate_topk", candidate_topk_cases),
];

fn candidate_blocks() -> Vec<Case> {
    candidate_blocks_cases().0
}
