//! V4 Flash's MTP draft block (MODEL.md §6), written as a recorded graph.
//!
//! One draft step for a token `t` at position `p`, given an n·D
//! hyper-connection state `H` (the target's state after its last layer at
//! the position before, or the block's own output of the step before):
//!
//! ```text
//! S[s]   = e_proj · rmsnorm(embed(t), enorm) + h_proj · rmsnorm(H[s], hnorm)
//! S      = one V4 block (`forward::block`) with the mtp.0.* tensors, as a
//!          window-only layer over its own ring: plain RoPE, top-k routing
//! logits = output head with mtp.0.hc_head_* and mtp.0.norm, the main
//!          `output` projection
//! ```
//!
//! The block is layer `n_layer` of a configuration with one more
//! window-only layer ([`mtp_config`]). A step is one token: the state
//! input `H` is a value of n fixed rows of D, so `h_proj` is the same
//! n-row product as the output head's, on every backend.

use super::block::Builder;
use super::config::CoreConfig;
use super::forward::{self, Numerics};
use super::logits::Logits;
use super::state::LayerState;
use super::{ModelConfig, MtpWeights, Weights};
use crate::graph::ops::basic::Add;
use crate::graph::ops::matmul::MatMul;
use crate::graph::ops::norm::RmsNorm;
use crate::graph::ops::{Op, Rows};
use crate::graph::{Graph, StateId, ValueId};

/// A recorded MTP step and the values the host feeds and reads.
#[derive(Clone, Debug)]
pub struct MtpGraph {
    pub graph: Graph,
    /// The n·D state the step drafts from (host-written, n rows of D).
    pub hprev: ValueId,
    /// The block's output state (n·D): `hprev` of the next draft step.
    pub state: ValueId,
    /// The block's raw window ring (its own, beside the model's).
    pub ring: StateId,
}

/// The MTP block's configuration: the model's, with one more layer (index
/// `n_layer`) that is window-only and clamps like the last layer.
pub fn mtp_config(cfg: &CoreConfig) -> CoreConfig {
    cfg.with_draft_layers(1)
}

/// Records one MTP draft step (one token) over the ring `ring`; with
/// `head`, the draft logits too.
pub fn record(
    cfg: &ModelConfig,
    w: &Weights,
    mtp: &MtpWeights,
    ring: StateId,
    numerics: Numerics,
    head: bool,
) -> MtpGraph {
    let core = mtp_config(cfg);
    let (n, d, l) = (core.hc_count, core.n_embd, cfg.n_layer);
    let mut b = Builder::new(&core, 1);
    b.r.set_layer(Some(l));

    // The token's half: e_proj · enorm(embed(t)), entering every stream.
    let e = b.embed_row(&w.token_embd); // D
    let en = b.rms_norm("mtp_enorm", e, d, Some(&mtp.enorm));
    let ep = b.matmul("mtp_e_proj", &mtp.e_proj, en); // D
    let ep = b.hc_init("mtp_e_streams", ep); // n·D

    // The state's half: h_proj · hnorm(H[s]) for each stream s, as n rows.
    let hprev = b.r.fixed_f32("mtp_hprev", n, d);
    let hn = b.r.fixed_f32("mtp_hnorm", n, d);
    b.r.op(Op::RmsNorm(RmsNorm {
        x: hprev,
        out: hn,
        dim: d,
        weight: Some(mtp.hnorm.clone()),
        eps: core.rms_eps,
        rows: Rows::of(b.r.value(hn), d),
    }));
    let hp = b.r.fixed_f32("mtp_h_proj", n, d);
    b.r.op(Op::MatMul(MatMul {
        w: mtp.h_proj.clone(),
        x: hn,
        out: hp,
        groups: 1,
        rows: Rows::value(b.r.value(hp)),
    }));
    let state = b.r.tokens_f32("mtp_in", n * d);
    b.r.op(Op::Add(Add {
        a: ep,
        b: hp,
        out: state,
        cols: n * d,
    }));

    let st = LayerState {
        ring,
        compressor: None,
        indexer: None,
    };
    let state = forward::block(&mut b, l, &mtp.block, &st, numerics, state);
    b.r.set_layer(None);
    let out = if head {
        let pre = b.hc_head_mix(
            "mtp_out",
            state,
            &mtp.hc_head_fn,
            &mtp.hc_head_scale,
            &mtp.hc_head_base,
        );
        let x = b.hc_collapse("mtp_out_in", state, pre);
        b.head(x, &mtp.norm, &w.output, Logits::Last)
    } else {
        state
    };
    let mut g = b.finish(out, vec![hprev], &[]);
    g.keep.push(state);
    g.keep.sort();
    g.keep.dedup();
    MtpGraph {
        graph: g,
        hprev,
        state,
        ring,
    }
}
