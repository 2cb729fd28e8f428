//! The sub-steps both model families are built from (MODEL.md §3): a
//! [`Builder`] over the recorder and the core configuration, with the
//! hyper-connection mixes (`hc.rs`), the attention sublayer (`attention.rs`),
//! the MoE sublayer (`moe.rs`) and the output head (here).
//!
//! Each family's forward (`model::forward` for V4, `model::v41::forward`)
//! reads top to bottom and calls these; what differs between the families
//! is passed in as arguments (the kv source and its compressor, the lagged
//! mix, Engram), so a change to a shared sub-step is made once.

pub mod attention;
pub mod hc;
pub mod moe;

use crate::gguf::TensorRef;
use crate::graph::ops::basic::{Embed, TakeLast};
use crate::graph::ops::gather::GatherLast;
use crate::graph::ops::hc::HcInit;
use crate::graph::ops::matmul::MatMul;
use crate::graph::ops::norm::RmsNorm;
use crate::graph::ops::rope::Rope;
use crate::graph::ops::round::{BlockFormat, BlockRound};
use crate::graph::ops::{Op, Rows};
use crate::graph::{Graph, Recorder, ValueId, ValueName};
use crate::model::config::CoreConfig;
use crate::model::logits::Logits;

/// The official V4.1 activation block (`fp8_block_size`, `fp4_block_size`).
pub(crate) const ACT_BLOCK: usize = 32;

/// A graph being recorded for one model: the recorder, the core
/// configuration and the step's token ids.
pub(crate) struct Builder<'a> {
    pub r: Recorder,
    pub cfg: &'a CoreConfig,
    /// The step's token ids (`[T, 1]` i32).
    pub tokens: ValueId,
}

impl<'a> Builder<'a> {
    /// A recorder for steps of up to `max_tokens` tokens, with its `tokens` input.
    pub fn new(cfg: &'a CoreConfig, max_tokens: usize) -> Builder<'a> {
        let mut r = Recorder::new(max_tokens);
        let tokens = r.tokens_i32("tokens", 1);
        Builder { r, cfg, tokens }
    }

    /// `x` rounded through `format` in blocks of `block` along each head
    /// of `head` values (the official graph's simulated quantisation of an
    /// activation).
    pub fn round_blocks(
        &mut self,
        name: &str,
        x: ValueId,
        head: usize,
        format: BlockFormat,
        block: usize,
    ) -> ValueId {
        let cols = self.r.value(x).cols;
        let out = self.r.tokens_f32(name, cols);
        self.r.op(Op::BlockRound(BlockRound {
            x,
            out,
            cols,
            head,
            block,
            format,
        }));
        out
    }

    /// The input of an FP8 or FP4 GEMM under the official numerics
    /// (`act_quant`: FP8 in blocks of 32 with UE8M0 scales) when `fp8`,
    /// else `x` itself.
    pub fn gemm_input(&mut self, name: &str, x: ValueId, fp8: bool) -> ValueId {
        if fp8 {
            let cols = self.r.value(x).cols;
            self.round_blocks(name, x, cols, BlockFormat::Fp8, ACT_BLOCK)
        } else {
            x
        }
    }

    /// `w · x` for every token, out = `w.ne[1]` columns.
    pub fn matmul(&mut self, name: &str, w: &TensorRef, x: ValueId) -> ValueId {
        self.grouped_matmul(name, w, x, 1)
    }

    /// `w · x` block-diagonal in `groups` groups.
    pub fn grouped_matmul(
        &mut self,
        name: &str,
        w: &TensorRef,
        x: ValueId,
        groups: usize,
    ) -> ValueId {
        let out = self.r.tokens_f32(name, w.ne[1] as usize);
        self.r.op(Op::MatMul(MatMul {
            w: w.clone(),
            x,
            out,
            groups,
            rows: Rows::value(self.r.value(out)),
        }));
        out
    }

    /// RMS norm of `x` in rows of `dim`, optionally weighted.
    pub fn rms_norm(
        &mut self,
        name: &str,
        x: ValueId,
        dim: usize,
        weight: Option<&TensorRef>,
    ) -> ValueId {
        let cols = self.r.value(x).cols;
        let out = self.r.tokens_f32(name, cols);
        self.r.op(Op::RmsNorm(RmsNorm {
            x,
            out,
            dim,
            weight: weight.cloned(),
            eps: self.cfg.rms_eps,
            rows: Rows::of(self.r.value(out), dim),
        }));
        out
    }

    /// RoPE of layer `l` (or its inverse) on `heads` heads of `head_dim`.
    pub fn rope(
        &mut self,
        name: &str,
        x: ValueId,
        heads: usize,
        head_dim: usize,
        l: usize,
        inverse: bool,
    ) -> ValueId {
        let out = self.r.tokens_f32(name, heads * head_dim);
        self.r.op(Op::Rope(Rope {
            x,
            out,
            heads,
            head_dim,
            rope: self.cfg.rope(l),
            inverse,
        }));
        out
    }

    /// The token embedding, copied into each of the n HC streams: the
    /// initial n·D state.
    pub fn embed(&mut self, table: &TensorRef) -> ValueId {
        let e = self.embed_row(table); // D
        self.hc_init("hc_state", e)
    }

    /// The step's token embeddings (D).
    pub fn embed_row(&mut self, table: &TensorRef) -> ValueId {
        let e = self.r.tokens_f32("embed", self.cfg.n_embd);
        self.r.op(Op::Embed(Embed {
            table: table.clone(),
            tokens: self.tokens,
            out: e,
        }));
        e
    }

    /// `x` (D) copied into each of the n HC streams (n·D).
    pub fn hc_init(&mut self, name: &str, x: ValueId) -> ValueId {
        let (n, d) = (self.cfg.hc_count, self.cfg.n_embd);
        let state = self.r.tokens_f32(name, n * d);
        self.r.op(Op::HcInit(HcInit {
            x,
            out: state,
            n_hc: n,
            dim: d,
        }));
        state
    }

    /// Output norm and projection of the collapsed `x` (D) to logits
    /// (MODEL.md §3.10): every row, or only the last row (of each session).
    pub fn head(
        &mut self,
        x: ValueId,
        output_norm: &TensorRef,
        output: &TensorRef,
        logits: Logits,
    ) -> ValueId {
        let (d, eps) = (self.cfg.n_embd, self.cfg.rms_eps);
        let rows = match logits {
            Logits::All => {
                let xn = self.rms_norm("out_norm", x, d, Some(output_norm));
                return self.matmul("logits", output, xn);
            }
            Logits::Last => 1,
            Logits::LastPerState(n) => n.max(1),
        };
        let r = &mut self.r;
        let last = r.fixed_f32("out_last", rows, d);
        r.op(match logits {
            Logits::LastPerState(_) => Op::GatherLast(GatherLast {
                x,
                out: last,
                cols: d,
                states: rows,
            }),
            _ => Op::TakeLast(TakeLast {
                x,
                out: last,
                cols: d,
            }),
        });
        let xn = r.fixed_f32("out_norm", rows, d);
        r.op(Op::RmsNorm(RmsNorm {
            x: last,
            out: xn,
            dim: d,
            weight: Some(output_norm.clone()),
            eps,
            rows: Rows::of(r.value(xn), d),
        }));
        let out = r.fixed_f32("logits", rows, self.cfg.n_vocab);
        r.op(Op::MatMul(MatMul {
            w: output.clone(),
            x: xn,
            out,
            groups: 1,
            rows: Rows::value(r.value(out)),
        }));
        out
    }

    /// Ends the recording: `inputs` are host-fed values, `keep` the values
    /// to keep readable after a step (`--dump NAME@LAYER`).
    pub fn finish(self, logits: ValueId, inputs: Vec<ValueId>, keep: &[ValueName]) -> Graph {
        let mut g = self.r.finish(self.tokens, logits, inputs);
        let keep: Vec<ValueId> = keep.iter().filter_map(|n| g.find(n)).collect();
        g.keep.extend(keep);
        g.keep.sort();
        g.keep.dedup();
        g
    }
}
