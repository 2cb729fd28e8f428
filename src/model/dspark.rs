//! DeepSeek's DSpark drafter (docs/SPECULATIVE.md, "DSpark"): the support
//! file's configuration and weights, bound against the main model, and the
//! two graphs that run it.
//!
//! From the official `inference/model.py` (`DSparkBlock`, `DSparkAttention`,
//! `Transformer.forward_spec`), for a target that has evaluated positions
//! up to `P`:
//!
//! ```text
//! taps[p]  = concat over the target layers L of mean_s(H_L[p][s])   (the HC
//!            state entering layer L, averaged over its streams)
//! main_x   = rmsnorm(main_proj · taps[p], main_norm)
//! seed     : each stage writes kv_norm(wkv · main_x) (RoPE at p, rounded
//!            like a window row) into its own window ring, slot p mod W
//! block    = [next, noise, …, noise] (block_size tokens) at P+1 … P+bs,
//!            embedded with the target's table, copied to the HC streams
//! stages   : ordinary window-only blocks with the drafter's own experts,
//!            whose attention keys on the ring's last W positions and on
//!            all the block's rows (no causal mask), and writes no ring row
//! logits   = the target's output head on the last stage's HC collapse
//! ```
//!
//! Then, on the host, row `i` of the logits gains the Markov bias
//! `head_m · embed_m[token_i]` (token 0 = `next`, token i+1 = the pick from
//! row i), and the picks are the drafts ([`markov_drafts`]).
//!
//! The file layout is ds4's (`deepseek4-dspark`): `dspark.*` keys, the
//! stages under `mtp.{k}.` with the main model's tensor names, `main_proj`
//! and `main_norm` in stage 0, the head (`hc_head_*`, `norm`, the Markov
//! head and the confidence head) in the last stage.

use super::block::attention::AttnOptions;
use super::block::Builder;
use super::config::{CoreConfig, Meta};
use super::forward::{self, attn_options, Numerics};
use super::logits::Logits;
use super::state::LayerState;
use super::weights::{bind_layer, Binder, Class};
use super::{LayerWeights, ModelConfig, ModelError, Weights};
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops::basic::{Add, Embed};
use crate::graph::ops::Op;
use crate::graph::{Graph, StateId, ValueId, ValueName};

/// The longest draft block ds4 runs (the published drafters use 5–7).
pub const MAX_BLOCK: usize = 16;

/// The drafter's hyper-parameters (`dspark.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkConfig {
    /// Tokens per draft block: the token after the target's last, then
    /// `block_size − 1` noise tokens; it drafts `block_size` tokens.
    pub block_size: usize,
    pub markov_rank: usize,
    pub noise_token: u32,
    /// The target layers whose input state is tapped, increasing.
    pub target_layers: Vec<usize>,
    pub n_stages: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
}

/// The drafter's weights, bound at their offsets in the main file.
#[derive(Clone, Debug)]
pub struct DsparkWeights {
    pub config: DsparkConfig,
    /// `[D·taps → D]` and its norm (stage 0).
    pub main_proj: TensorRef,
    pub main_norm: TensorRef,
    /// One window-only block per stage (`mtp.{k}.`).
    pub stages: Vec<LayerWeights>,
    pub hc_head_fn: TensorRef,
    pub hc_head_scale: TensorRef,
    pub hc_head_base: TensorRef,
    pub norm: TensorRef,
    /// The Markov head: a rank-r embedding of the previous token and its
    /// vocabulary projection (`markov_w1`, `markov_w2`).
    pub markov_embed: TensorRef,
    pub markov_head: TensorRef,
}

impl DsparkConfig {
    /// Reads and checks the `dspark.*` keys against the main model.
    fn read(f: &GgufFile, cfg: &ModelConfig) -> Result<DsparkConfig, ModelError> {
        match f.get_str("general.architecture") {
            Some("deepseek4-dspark" | "deepseek41-dspark") => {}
            other => {
                let what = if f.tensor_info("mtp.0.e_proj.weight").is_some() {
                    "this is an MTP draft file: use --mtp".to_string()
                } else {
                    format!(
                        "general.architecture is {}, not deepseek4-dspark",
                        other.map_or("missing".into(), |a| format!("{a:?}"))
                    )
                };
                return Err(ModelError::WrongKind(format!(
                    "not a DSpark drafter: {what}"
                )));
            }
        }
        let m = Meta { f, arch: "dspark" };
        let block_size = m.pos("block_size")?;
        if block_size > MAX_BLOCK {
            return Err(m.bad(
                "block_size",
                format!("at most {MAX_BLOCK}"),
                block_size.to_string(),
            ));
        }
        let markov_rank = m.pos("markov_rank")?;
        let noise = m.uint("noise_token_id")?;
        if noise >= cfg.n_vocab {
            return Err(m.bad(
                "noise_token_id",
                format!("a token below the model's vocabulary of {}", cfg.n_vocab),
                noise.to_string(),
            ));
        }
        let stages_key = if m.has("stage_count") {
            "stage_count"
        } else {
            "n_layers"
        };
        let n_stages = m.pos(stages_key)?;
        let targets = m.ints("target_layer_ids")?;
        let ok = !targets.is_empty()
            && targets.windows(2).all(|p| p[0] < p[1])
            && targets
                .iter()
                .all(|&l| l >= 0 && (l as usize) < cfg.n_layer);
        if !ok {
            return Err(m.bad(
                "target_layer_ids",
                format!("increasing layers below the model's {}", cfg.n_layer),
                format!("{targets:?}"),
            ));
        }
        for (k, want) in [
            ("embedding_length", cfg.n_embd),
            ("vocab_size", cfg.n_vocab),
        ] {
            if let Some(v) = m.opt_uint(k)? {
                if v != want {
                    return Err(m.bad(k, format!("{want} (the model's)"), v.to_string()));
                }
            }
        }
        // ds4's V4 0731 file carries no expert keys: the router's shape says.
        let n_expert = match m.opt_uint("expert_count")? {
            Some(e) => e,
            None => f
                .tensor_info("mtp.0.ffn_gate_inp.weight")
                .and_then(|t| t.ne.get(1).copied())
                .map_or(cfg.n_expert, |e| e as usize),
        };
        let n_expert_used = m
            .opt_uint("expert_used_count")?
            .unwrap_or(cfg.n_expert_used);
        if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(ModelError::Inconsistent(format!(
                "DSpark drafter: {n_expert_used} of {n_expert} experts per token"
            )));
        }
        Ok(DsparkConfig {
            block_size,
            markov_rank,
            noise_token: noise as u32,
            target_layers: targets.iter().map(|&l| l as usize).collect(),
            n_stages,
            n_expert,
            n_expert_used,
        })
    }
}

impl DsparkWeights {
    /// Binds a DSpark support file attached at `base` to a V4 model.
    pub fn bind(
        file: &GgufFile,
        cfg: &ModelConfig,
        base: u64,
    ) -> Result<DsparkWeights, ModelError> {
        let config = DsparkConfig::read(file, cfg)?;
        let b = Binder { file, base };
        let (d, hc, r) = (cfg.n_embd, cfg.hc_count, config.markov_rank);
        let mut stage_cfg = cfg.clone();
        stage_cfg.core.n_expert = config.n_expert;
        stage_cfg.core.n_expert_used = config.n_expert_used;
        let stages = (0..config.n_stages)
            .map(|k| bind_layer(&b, &stage_cfg, &format!("mtp.{k}."), 0, true))
            .collect::<Result<Vec<_>, _>>()?;
        let last = format!("mtp.{}.", config.n_stages - 1);
        let n = |p: &str, s: &str| format!("{p}{s}");
        let taps = config.target_layers.len();
        Ok(DsparkWeights {
            main_proj: b.bind("mtp.0.main_proj.weight", &[d * taps, d], Class::Dense)?,
            main_norm: b.bind("mtp.0.main_norm.weight", &[d], Class::Vector)?,
            stages,
            hc_head_fn: b.bind(&n(&last, "hc_head_fn.weight"), &[hc * d, hc], Class::Dense)?,
            hc_head_scale: b.bind(&n(&last, "hc_head_scale.weight"), &[1], Class::Vector)?,
            hc_head_base: b.bind(&n(&last, "hc_head_base.weight"), &[hc], Class::Vector)?,
            norm: b.bind(&n(&last, "norm.weight"), &[d], Class::Vector)?,
            markov_embed: b.bind(
                &n(&last, "markov_head.markov_w1.weight"),
                &[r, cfg.n_vocab],
                Class::Dense,
            )?,
            markov_head: b.bind(
                &n(&last, "markov_head.markov_w2.weight"),
                &[r, cfg.n_vocab],
                Class::Dense,
            )?,
            config,
        })
    }
}

/// The drafter's configuration: the model's, with one window-only layer
/// per stage after the model's (indices `n_layer …`), clamped like the
/// last layer, with the drafter's expert counts.
pub fn dspark_config(cfg: &CoreConfig, ds: &DsparkConfig) -> CoreConfig {
    let mut c = cfg.clone();
    let n = cfg.n_layer;
    let clamp = cfg
        .swiglu_clamp
        .get(n.saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    c.compress_ratios.truncate(n);
    c.swiglu_clamp.truncate(n);
    for _ in 0..ds.n_stages {
        c.compress_ratios.push(0);
        c.swiglu_clamp.push(clamp);
    }
    c.n_layer = n + ds.n_stages;
    c.n_expert = ds.n_expert;
    c.n_expert_used = ds.n_expert_used;
    c
}

/// The values of the target's forward the taps are read from, in the
/// order of `target_layers`: the HC state entering layer L (n·D; the
/// embedding, D, for layer 0, whose streams are all equal).
pub fn tap_values(ds: &DsparkConfig) -> Vec<ValueName> {
    ds.target_layers
        .iter()
        .map(|&l| match l {
            0 => ValueName {
                name: "embed".into(),
                layer: None,
            },
            l => ValueName {
                name: "ffn_hc_state".into(),
                layer: Some(l - 1),
            },
        })
        .collect()
}

/// The seed step: writes the rows of up to `max_rows` target positions
/// into every stage's ring.
#[derive(Clone, Debug)]
pub struct SeedGraph {
    pub graph: Graph,
    /// The taps of the step's positions (host-written, `taps·D` per row).
    pub taps: ValueId,
}

/// Records the seed step over `rings` (one per stage).
pub fn record_seed(
    cfg: &ModelConfig,
    ds: &DsparkWeights,
    rings: &[StateId],
    numerics: Numerics,
    max_rows: usize,
) -> SeedGraph {
    let core = dspark_config(cfg, &ds.config);
    let d = core.n_embd;
    let mut b = Builder::new(&core, max_rows);
    b.r.set_layer(Some(cfg.n_layer));
    let taps =
        b.r.tokens_f32("dspark_taps", ds.config.target_layers.len() * d);
    let main = b.matmul("dspark_main_proj", &ds.main_proj, taps); // D
    let main = b.rms_norm("dspark_main_norm", main, d, Some(&ds.main_norm));
    let mut last = main;
    for (k, (stage, &ring)) in ds.stages.iter().zip(rings).enumerate() {
        let l = cfg.n_layer + k;
        b.r.set_layer(Some(l));
        last = b.seed_ring(l, &stage.attn, ring, attn_options(numerics), main);
    }
    b.r.set_layer(None);
    SeedGraph {
        graph: b.finish(last, vec![taps], &[]),
        taps,
    }
}

/// Records the draft block: `block_size` rows, logits at every row (before
/// the Markov bias).
pub fn record_draft(
    cfg: &ModelConfig,
    w: &Weights,
    ds: &DsparkWeights,
    rings: &[StateId],
    numerics: Numerics,
) -> Graph {
    let core = dspark_config(cfg, &ds.config);
    let mut b = Builder::new(&core, ds.config.block_size);
    let mut state = b.embed(&w.token_embd); // n·D
    let attn = AttnOptions {
        draft_block: true,
        ..attn_options(numerics)
    };
    for (k, (stage, &ring)) in ds.stages.iter().zip(rings).enumerate() {
        let l = cfg.n_layer + k;
        b.r.set_layer(Some(l));
        let st = LayerState {
            ring,
            compressor: None,
            indexer: None,
        };
        state = forward::block_with(&mut b, l, stage, &st, numerics, attn, state);
        b.r.flush();
    }
    b.r.set_layer(None);
    let pre = b.hc_head_mix(
        "dspark_out",
        state,
        &ds.hc_head_fn,
        &ds.hc_head_scale,
        &ds.hc_head_base,
    );
    let x = b.hc_collapse("dspark_out_in", state, pre);
    let logits = b.head(x, &ds.norm, &w.output, Logits::All);
    b.finish(logits, Vec::new(), &[])
}

/// One Markov step: a logits row (host-written) plus the bias of the
/// step's one token, `markov_w2 · markov_w1[token]`.
#[derive(Clone, Debug)]
pub struct MarkovGraph {
    pub graph: Graph,
    /// The draft block's logits row the bias is added to (vocab).
    pub row: ValueId,
}

/// Records the Markov step of `ds` (the row's biased logits are the
/// graph's logits).
pub fn record_markov(cfg: &ModelConfig, ds: &DsparkWeights) -> MarkovGraph {
    let core = dspark_config(cfg, &ds.config);
    let mut b = Builder::new(&core, 1);
    let e = b.r.tokens_f32("markov_embed", ds.config.markov_rank);
    b.r.op(Op::Embed(Embed {
        table: ds.markov_embed.clone(),
        tokens: b.tokens,
        out: e,
    }));
    let bias = b.matmul("markov_bias", &ds.markov_head, e); // vocab
    let row = b.r.tokens_f32("markov_row", cfg.n_vocab);
    let out = b.r.tokens_f32("markov_logits", cfg.n_vocab);
    b.r.op(Op::Add(Add {
        a: row,
        b: bias,
        out,
        cols: cfg.n_vocab,
    }));
    MarkovGraph {
        graph: b.finish(out, vec![row], &[]),
        row,
    }
}
