//! The ops only DeepSeek V4.1 needs (docs/V41.md) travel in the graph as
//! one [`Op::V41`](super::Op::V41) variant, whose match is here. Each op
//! lives with its concept, with its CPU twin: [`super::hc::HcOneHot`],
//! [`super::engram`], [`super::source_compress`], [`super::candidate`].
//! Everything whose math is V4's (norms, matmuls, RoPE, the HC mixer,
//! collapse and expand, attention with sinks, the indexer's own top-k, the
//! router and experts) is shared with V4 and not repeated.

use super::candidate::{CandidateBlocks, CandidateTopK};
use super::engram::{EngramGate, EngramHash, EngramLookup};
use super::hc::HcOneHot;
use super::source_compress::SourceCompress;
use super::CpuCx;
use crate::gguf::TensorRef;
use crate::graph::{StateId, ValueId};

/// The V4.1-only ops.
#[derive(Clone, Debug)]
pub enum V41Op {
    HcOneHot(HcOneHot),
    EngramHash(EngramHash),
    EngramLookup(EngramLookup),
    EngramGate(EngramGate),
    SourceCompress(SourceCompress),
    CandidateBlocks(CandidateBlocks),
    CandidateTopK(CandidateTopK),
}

impl V41Op {
    pub fn inputs(&self) -> Vec<ValueId> {
        match self {
            V41Op::HcOneHot(_) => vec![],
            V41Op::EngramHash(o) => vec![o.tokens],
            V41Op::EngramLookup(o) => vec![o.rows],
            V41Op::EngramGate(o) => vec![o.state, o.kv],
            V41Op::SourceCompress(o) => {
                let mut v = vec![o.kv];
                v.extend(o.gate);
                v
            }
            V41Op::CandidateBlocks(o) => vec![o.q, o.weights],
            V41Op::CandidateTopK(o) => vec![o.q, o.weights, o.blocks],
        }
    }

    pub fn outputs(&self) -> Vec<ValueId> {
        match self {
            V41Op::HcOneHot(o) => vec![o.out],
            V41Op::EngramHash(o) => vec![o.out],
            V41Op::EngramLookup(o) => vec![o.out],
            V41Op::EngramGate(o) => vec![o.out],
            V41Op::SourceCompress(_) => vec![],
            V41Op::CandidateBlocks(o) => vec![o.out],
            V41Op::CandidateTopK(o) => vec![o.out],
        }
    }

    pub fn states(&self) -> Vec<StateId> {
        match self {
            V41Op::EngramHash(o) => vec![o.history],
            V41Op::SourceCompress(o) => {
                let mut v = vec![o.rows, o.index_rows];
                v.extend(o.frontier.map(|f| f.kv));
                v.extend(o.frontier.map(|f| f.score));
                v
            }
            V41Op::CandidateBlocks(o) => vec![o.rows],
            V41Op::CandidateTopK(o) => vec![o.rows],
            _ => vec![],
        }
    }

    /// Weights to upload. The Engram table is deliberately absent.
    pub fn weights(&self) -> Vec<&TensorRef> {
        match self {
            V41Op::EngramGate(o) => vec![&o.q_weight, &o.k_weight],
            V41Op::SourceCompress(o) => vec![&o.index_wk, &o.norm, &o.index_norm],
            _ => vec![],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            V41Op::HcOneHot(_) => "hc_one_hot",
            V41Op::EngramHash(_) => "engram_hash",
            V41Op::EngramLookup(_) => "engram_lookup",
            V41Op::EngramGate(_) => "engram_gate",
            V41Op::SourceCompress(_) => "source_compress",
            V41Op::CandidateBlocks(_) => "candidate_blocks",
            V41Op::CandidateTopK(_) => "candidate_topk",
        }
    }

    pub fn cpu(&self, cx: &mut CpuCx) {
        match self {
            V41Op::HcOneHot(o) => o.cpu(cx),
            V41Op::EngramHash(o) => o.cpu(cx),
            V41Op::EngramLookup(o) => o.cpu(cx),
            V41Op::EngramGate(o) => o.cpu(cx),
            V41Op::SourceCompress(o) => o.cpu(cx),
            V41Op::CandidateBlocks(o) => o.cpu(cx),
            V41Op::CandidateTopK(o) => o.cpu(cx),
        }
    }
}
