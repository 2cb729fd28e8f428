//! DeepSeek's DSpark drafter on a V4.1 target (`deepseek41-dspark`,
//! docs/SPECULATIVE.md): the draft block with V4.1 stages. The file, the
//! seeding and the Markov step are the family-neutral ones of
//! `model::dspark`; what differs from a V4 target's drafter, as in the
//! official `DSparkBlock` (whose parent is V4.1's `Block`):
//!
//! * each stage is a V4.1 block: lagged HC mixes, the first stage's
//!   attention collapsing with a one-hot on the first stream
//!   (`make_identity_pre_mix`), no per-head query norm, V4.1's rounding
//!   under model numerics, the text routing bias;
//! * the head collapses with the last stage's FFN mix (no `hc_head`);
//! * the taps are the target layers' inputs after their Engram module
//!   (`tap_values` with the model's Engram layers).

use super::forward::{first_stream_mix, lagged_block, v41_attn_options};
use super::V41Weights;
use crate::graph::{Graph, StateId};
use crate::model::block::attention::{AttnOptions, Sparse};
use crate::model::block::Builder;
use crate::model::config::CoreConfig;
use crate::model::dspark::{dspark_config, DsparkWeights};
use crate::model::forward::Numerics;
use crate::model::logits::Logits;

/// Records the draft block of a V4.1 target's drafter: `block_size` rows,
/// logits at every row (before the Markov bias).
pub fn record_draft(
    cfg: &CoreConfig,
    w: &V41Weights,
    ds: &DsparkWeights,
    rings: &[StateId],
    numerics: Numerics,
) -> Graph {
    let core = dspark_config(cfg, &ds.config);
    let mut b = Builder::new(&core, ds.config.block_size);
    let attn = AttnOptions {
        draft_block: true,
        ..v41_attn_options(numerics)
    };
    let model = numerics == Numerics::Model;
    let mut state = b.embed(&w.token_embd); // n·D
    let mut pre_mix = first_stream_mix(&mut b);
    for (k, (stage, &ring)) in ds.stages.iter().zip(rings).enumerate() {
        let l = cfg.n_layer + k;
        b.r.set_layer(Some(l));
        (state, pre_mix) = lagged_block(
            &mut b,
            l,
            stage.into(),
            ring,
            attn,
            model,
            state,
            pre_mix,
            |_, _| Sparse::default(),
        );
        b.r.flush();
    }
    b.r.set_layer(None);
    let x = b.hc_collapse("dspark_out_in", state, pre_mix);
    let logits = b.head(x, &ds.norm, &w.output, Logits::All);
    b.finish(logits, Vec::new(), &[])
}
