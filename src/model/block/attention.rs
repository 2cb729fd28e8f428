//! The attention sublayer (MODEL.md §3.4–3.6) as both families record it:
//! the low-rank query, the one shared K=V row with its RoPE, attention over
//! the sliding window plus the compressed rows the layer may read, the ring
//! write, the inverse RoPE and the grouped output projection.
//!
//! What differs is passed in. [`AttnOptions`]: V4 normalises each query
//! head and, under model numerics, rounds the window row to FP8/f16 before
//! it is stored; V4.1 under model numerics rounds the whole window row to
//! FP8 and the inputs of its FP8 GEMMs (`act_quant`). The *sparse part* (which compressed rows the layer reads
//! and which of them the indexer selects) is a closure run between the
//! projections and the attention: V4 runs each layer's own compressor and
//! indexer, V4.1 reads them from its kv-source and index-source layers.

use super::{Builder, ACT_BLOCK};
use crate::gguf::TensorRef;
use crate::graph::ops::attention::{Attention, CompressedRows, RingWrite};
use crate::graph::ops::basic::Scale;
use crate::graph::ops::round::{BlockFormat, HadamardFp4, KvRound};
use crate::graph::ops::Op;
use crate::graph::{StateId, ValueId};
use crate::model::weights::AttnWeights;

/// How a family's dense attention path differs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnOptions {
    /// RMS-normalise each query head before its RoPE (V4; not V4.1).
    pub q_head_norm: bool,
    /// How the window row is rounded after its RoPE.
    pub kv_round: KvRounding,
    /// FP8 round trip of the inputs of the FP8 GEMMs `wq_a`, `wkv`, `wq_b`
    /// (and the indexer's `wq_b`, through [`Projected::qr`]) and `wo_b`
    /// (V4.1 model numerics; `wo_a` and the compressor read plain values).
    pub act_fp8: bool,
    /// A DSpark draft block: the step's rows see each other and the ring
    /// (no causal mask) and are not written to the ring, which holds the
    /// target positions' rows ([`Builder::seed_ring`]).
    pub draft_block: bool,
}

/// The rounding of the window KV row after its RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KvRounding {
    None,
    /// V4 model numerics (MODEL.md §3.5.1): FP8 on the non-rotary dims in
    /// blocks of 64, then f16 storage.
    Fp8NonRotaryF16,
    /// V4.1 model numerics: FP8 of the whole row, RoPE tail included, in
    /// blocks of 32.
    Fp8Row,
}

/// The rounding of the indexer's roped query heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IndexRounding {
    None,
    /// V4 model numerics: Walsh–Hadamard rotation, then FP4 in blocks of 32.
    HadamardFp4,
    /// V4.1 model numerics: FP4 in blocks of 32 (UE8M0 scales).
    Fp4,
}

/// The projections a layer's sparse part reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Projected {
    /// The normed sublayer input (D).
    pub xn: ValueId,
    /// The normed low-rank query (QL), as the FP8 GEMMs read it (rounded
    /// under [`AttnOptions::act_fp8`]).
    pub qr: ValueId,
}

/// What the sparse part hands the attention.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sparse {
    /// Compressed rows the layer attends to, with their ratio.
    pub compressed: Option<CompressedRows>,
    /// The indexer's top-k among them (all of them when `None`).
    pub selected: Option<ValueId>,
}

impl Builder<'_> {
    /// The attention sublayer of layer `l` on the collapsed `x` (D); the
    /// window ring is `ring`. Returns y (D).
    pub fn attention(
        &mut self,
        l: usize,
        w: &AttnWeights,
        ring: StateId,
        opts: AttnOptions,
        x: ValueId,
        sparse: impl FnOnce(&mut Self, Projected) -> Sparse,
    ) -> ValueId {
        let cfg = self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.n_head);
        let xn = self.rms_norm("attn_norm", x, cfg.n_embd, Some(&w.norm)); // D
        let xq = self.gemm_input("attn_norm_fp8", xn, opts.act_fp8);
        let qa = self.matmul("q_a", &w.q_a, xq); // QL
        let qr = self.rms_norm("q_a_norm", qa, cfg.q_lora_rank, Some(&w.q_a_norm)); // QL
        let qr = self.gemm_input("q_a_norm_fp8", qr, opts.act_fp8);
        let mut q = self.matmul("q", &w.q_b, qr); // H·HD
        if opts.q_head_norm {
            q = self.rms_norm("q_head_norm", q, hd, None); // H·HD, per-head RMS
        }
        let q = self.rope("q_rope", q, nh, hd, l, false);
        let kv = self.window_row(l, w, opts, xq);

        // Compressors run before attention: a row completed by token p is
        // visible to p itself.
        let s = sparse(self, Projected { xn, qr });

        let o = self.r.tokens_f32("attn_heads", nh * hd); // H·HD
        self.r.op(Op::Attention(Attention {
            q,
            kv,
            ring,
            window: cfg.sliding_window,
            block: opts.draft_block,
            compressed: s.compressed,
            selected: s.selected,
            top_k: cfg.indexer_top_k,
            sinks: w.sinks.clone(),
            n_head: nh,
            head_dim: hd,
            out: o,
        }));
        if !opts.draft_block {
            self.ring_write(kv, ring);
        }
        let o = self.rope("attn_heads_unrope", o, nh, hd, l, true);
        let low = self.grouped_matmul("attn_low", &w.output_a, o, cfg.o_groups); // OG·OL
        let low = self.gemm_input("attn_low_fp8", low, opts.act_fp8);
        self.matmul("attn_out", &w.output_b, low) // D
    }

    /// The window row of each token (HD): `kv_norm(wkv · xq)`, its RoPE at
    /// the token's position, rounded as `opts` says; `xq` is the normed
    /// sublayer input as the FP8 GEMMs read it.
    fn window_row(&mut self, l: usize, w: &AttnWeights, opts: AttnOptions, xq: ValueId) -> ValueId {
        let cfg = self.cfg;
        let hd = cfg.head_dim;
        let kv = self.matmul("kv_proj", &w.kv, xq); // HD
        let kv = self.rms_norm("kv_norm", kv, hd, Some(&w.kv_norm));
        let kv = self.rope("kv_rope", kv, 1, hd, l, false);
        match opts.kv_round {
            KvRounding::None => kv,
            KvRounding::Fp8NonRotaryF16 => {
                let out = self.r.tokens_f32("kv", hd);
                self.r.op(Op::KvRound(KvRound {
                    x: kv,
                    out,
                    dim: hd,
                    n_rot: cfg.n_rot,
                    fp8: true,
                    f16: true,
                }));
                out
            }
            KvRounding::Fp8Row => self.round_blocks("kv", kv, hd, BlockFormat::Fp8, ACT_BLOCK),
        }
    }

    fn ring_write(&mut self, kv: ValueId, ring: StateId) {
        self.r.op(Op::RingWrite(RingWrite {
            kv,
            ring,
            window: self.cfg.sliding_window,
            dim: self.cfg.head_dim,
        }));
    }

    /// Writes the window rows of `x` (D, already normed: DSpark's `main_x`)
    /// into layer `l`'s ring `ring`, at the step's positions: what a DSpark
    /// stage's attention keys on (`DSparkAttention`'s `main_kv`).
    pub fn seed_ring(
        &mut self,
        l: usize,
        w: &AttnWeights,
        ring: StateId,
        opts: AttnOptions,
        x: ValueId,
    ) -> ValueId {
        let xq = self.gemm_input("main_x_fp8", x, opts.act_fp8);
        let kv = self.window_row(l, w, opts, xq);
        self.ring_write(kv, ring);
        kv
    }

    /// The indexer's query heads and head weights (MODEL.md §3.6): `q` (IH·IHD,
    /// roped, then rounded as `rounding` says) and the weights (IH, scaled by
    /// 1/√(IHD·IH)).
    pub fn indexer_query(
        &mut self,
        l: usize,
        q_b: &TensorRef,
        proj: &TensorRef,
        p: Projected,
        rounding: IndexRounding,
    ) -> (ValueId, ValueId) {
        let (ih, ihd) = (self.cfg.indexer_heads, self.cfg.indexer_head_dim);
        let qi = self.matmul("index_q", q_b, p.qr); // IH·IHD
        let mut qi = self.rope("index_q_rope", qi, ih, ihd, l, false);
        match rounding {
            IndexRounding::None => {}
            IndexRounding::HadamardFp4 => {
                let out = self.r.tokens_f32("index_q_fp4", ih * ihd);
                self.r.op(Op::HadamardFp4(HadamardFp4 {
                    x: qi,
                    out,
                    cols: ih * ihd,
                    head_dim: ihd,
                }));
                qi = out;
            }
            IndexRounding::Fp4 => {
                qi = self.round_blocks("index_q_fp4", qi, ihd, BlockFormat::Fp4, ACT_BLOCK)
            }
        }
        let wi = self.matmul("index_weights_raw", proj, p.xn); // IH
        let wis = self.r.tokens_f32("index_weights", ih);
        self.r.op(Op::Scale(Scale {
            x: wi,
            out: wis,
            factor: 1.0 / ((ihd * ih) as f32).sqrt(),
            cols: self.r.value(wis).cols,
        }));
        (qi, wis)
    }
}
