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
//!            (V4: a learned head mix; V4.1: the last FFN mix, lagged)
//! ```
//!
//! The stages are blocks of the target's family: V4 blocks for a V4
//! target (`record_draft` here), V4.1 blocks with the lagged HC mixes for a
//! V4.1 target (`model::v41::dspark`). A V4.1 drafter taps its layers'
//! inputs after their Engram module.
//!
//! Then, on the host, row `i` of the logits gains the Markov bias
//! `head_m · embed_m[token_i]` (token 0 = `next`, token i+1 = the pick from
//! row i), and the picks are the drafts ([`markov_drafts`]).
//!
//! The file layout is ds4's (`deepseek4-dspark`, `deepseek41-dspark`):
//! `dspark.*` keys, the stages under `mtp.{k}.` with the main model's
//! tensor names, `main_proj` and `main_norm` in stage 0, the head (V4's
//! `hc_head_*`, `norm`, the Markov head and the confidence head) in the
//! last stage.

use super::block::attention::AttnOptions;
use super::block::Builder;
use super::config::{CoreConfig, Meta};
use super::family::Arch;
use super::forward::{self, attn_options, Numerics};
use super::logits::Logits;
use super::state::LayerState;
use super::weights::{bind_attn, bind_hc_mix, bind_layer, bind_moe, Binder, Class, HcMixWeights};
use super::{AttentionKind, LayerWeights, ModelConfig, ModelError, Weights};
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops::basic::{Add, Embed};
use crate::graph::ops::Op;
use crate::graph::{Graph, StateId, ValueId, ValueName};

/// The longest draft block ds4 runs (the published drafters use 5–7).
pub const MAX_BLOCK: usize = 16;

/// The drafter's hyper-parameters (`dspark.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkConfig {
    /// The family of the target it drafts for (`deepseek4-dspark`: V4,
    /// `deepseek41-dspark`: V4.1).
    pub family: Arch,
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
    /// V4's learned collapse of the HC streams before the output head
    /// (`hc_head_*`); a V4.1 drafter collapses with its last stage's FFN
    /// mix instead.
    pub head_mix: Option<HcMixWeights>,
    pub norm: TensorRef,
    /// The Markov head: a rank-r embedding of the previous token and its
    /// vocabulary projection (`markov_w1`, `markov_w2`).
    pub markov_embed: TensorRef,
    pub markov_head: TensorRef,
}

impl DsparkConfig {
    /// Reads and checks the `dspark.*` keys of `f` against the main
    /// model (its configuration `cfg`, family `target`); the converter reads
    /// its metadata back through it (`convert::dspark`).
    pub fn read(f: &GgufFile, cfg: &CoreConfig, target: Arch) -> Result<DsparkConfig, ModelError> {
        let family = match f.get_str("general.architecture") {
            Some("deepseek4-dspark") => Arch::V4,
            Some("deepseek41-dspark") => Arch::V41,
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
        };
        if family != target {
            let name = |a: Arch| match a {
                Arch::V4 => "V4 (deepseek4-dspark)",
                Arch::V41 => "V4.1 (deepseek41-dspark)",
            };
            return Err(ModelError::WrongKind(format!(
                "this DSpark drafter is built for a {} target, and the model is {}",
                name(family),
                name(target).split(' ').next().unwrap_or_default()
            )));
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
            family,
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
    /// Binds a DSpark support file attached at `base` to a model of family
    /// `target` with configuration `cfg`.
    pub fn bind(
        file: &GgufFile,
        cfg: &CoreConfig,
        target: Arch,
        base: u64,
    ) -> Result<DsparkWeights, ModelError> {
        let config = DsparkConfig::read(file, cfg, target)?;
        let b = Binder { file, base };
        let (d, hc, r) = (cfg.n_embd, cfg.hc_count, config.markov_rank);
        let stage_cfg = dspark_config(cfg, &config);
        let stages = (0..config.n_stages)
            .map(|k| {
                let p = format!("mtp.{k}.");
                match config.family {
                    Arch::V4 => {
                        let v4 = ModelConfig {
                            core: stage_cfg.clone(),
                            n_hash_layers: 0,
                        };
                        bind_layer(&b, &v4, &p, 0, true)
                    }
                    Arch::V41 => bind_v41_stage(&b, &stage_cfg, &p),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let last = format!("mtp.{}.", config.n_stages - 1);
        let n = |p: &str, s: &str| format!("{p}{s}");
        let taps = config.target_layers.len();
        let head_mix = match config.family {
            Arch::V4 => Some(HcMixWeights {
                func: b.bind(&n(&last, "hc_head_fn.weight"), &[hc * d, hc], Class::Dense)?,
                scale: b.bind(&n(&last, "hc_head_scale.weight"), &[1], Class::Vector)?,
                base: b.bind(&n(&last, "hc_head_base.weight"), &[hc], Class::Vector)?,
            }),
            Arch::V41 => None,
        };
        Ok(DsparkWeights {
            main_proj: b.bind("mtp.0.main_proj.weight", &[d * taps, d], Class::Dense)?,
            main_norm: b.bind("mtp.0.main_norm.weight", &[d], Class::Vector)?,
            stages,
            head_mix,
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

/// Opens the DSpark drafter GGUF at `path`, binds it against a model of
/// family `target` (configuration `cfg`) and attaches it to the model's
/// `file`: backends then read its weights like the model's own.
pub fn attach(
    file: &mut GgufFile,
    cfg: &CoreConfig,
    target: Arch,
    path: &std::path::Path,
) -> Result<DsparkWeights, ModelError> {
    let f = GgufFile::open(path)?;
    let ds = DsparkWeights::bind(&f, cfg, target, file.next_support_base())?;
    file.attach(f);
    Ok(ds)
}

/// A V4.1 stage: a window-only V4.1 block, always with a router bias and
/// a shared expert; its image-span bias, when present, is checked and left
/// unused (drafts are text).
fn bind_v41_stage(b: &Binder, cfg: &CoreConfig, p: &str) -> Result<LayerWeights, ModelError> {
    let e = cfg.n_expert;
    let bias = b.bind(&format!("{p}exp_probs_b.bias"), &[e], Class::Vector)?;
    b.bind_opt(&format!("{p}exp_probs_b_vl.bias"), &[e], Class::Vector)?;
    Ok(LayerWeights {
        kind: AttentionKind::Window,
        hc_attn: bind_hc_mix(b, cfg, p, "attn")?,
        attn: bind_attn(b, cfg, p)?,
        compressor: None,
        indexer: None,
        hc_ffn: bind_hc_mix(b, cfg, p, "ffn")?,
        ffn: bind_moe(b, cfg, p, Some(bias), None, true)?,
    })
}

/// The drafter's configuration: the model's, with one window-only layer
/// per stage after the model's (indices `n_layer …`), clamped like the
/// last layer, with the drafter's expert counts.
pub fn dspark_config(cfg: &CoreConfig, ds: &DsparkConfig) -> CoreConfig {
    let mut c = cfg.with_draft_layers(ds.n_stages);
    c.n_expert = ds.n_expert;
    c.n_expert_used = ds.n_expert_used;
    c
}

/// The values of the target's forward the taps are read from, in the
/// order of `target_layers`: the HC state entering layer L (n·D; the
/// embedding, D, for layer 0, whose streams are all equal). A V4.1 layer
/// with an Engram module (`engram_layers`) is tapped after it.
pub fn tap_values(ds: &DsparkConfig, engram_layers: &[usize]) -> Vec<ValueName> {
    let at = |name: &str, layer| ValueName {
        name: name.into(),
        layer,
    };
    ds.target_layers
        .iter()
        .map(|&l| {
            if engram_layers.contains(&l) {
                at("engram_hc_state", Some(l))
            } else if l == 0 {
                at("embed", None)
            } else {
                at("ffn_hc_state", Some(l - 1))
            }
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

/// Records the seed step over `rings` (one per stage) of a drafter for a
/// target of configuration `cfg`; `attn` as the target's layers (its
/// rounding of window rows and of the FP8 GEMMs' inputs).
pub(crate) fn record_seed(
    cfg: &CoreConfig,
    ds: &DsparkWeights,
    rings: &[StateId],
    attn: AttnOptions,
    max_rows: usize,
) -> SeedGraph {
    let core = dspark_config(cfg, &ds.config);
    let d = core.n_embd;
    let mut b = Builder::new(&core, max_rows);
    b.r.set_layer(Some(cfg.n_layer));
    let taps =
        b.r.tokens_f32("dspark_taps", ds.config.target_layers.len() * d);
    let xq = b.gemm_input("dspark_taps_fp8", taps, attn.act_fp8);
    let main = b.matmul("dspark_main_proj", &ds.main_proj, xq); // D
    let main = b.rms_norm("dspark_main_norm", main, d, Some(&ds.main_norm));
    let mut last = main;
    for (k, (stage, &ring)) in ds.stages.iter().zip(rings).enumerate() {
        let l = cfg.n_layer + k;
        b.r.set_layer(Some(l));
        last = b.seed_ring(l, &stage.attn, ring, attn, main);
    }
    b.r.set_layer(None);
    SeedGraph {
        graph: b.finish(last, vec![taps], &[]),
        taps,
    }
}

/// Records a V4 target's draft block: `block_size` rows, logits at every
/// row (before the Markov bias).
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
    let h = ds.head_mix.as_ref().expect("a V4 drafter has a head mix");
    let pre = b.hc_head_mix("dspark_out", state, &h.func, &h.scale, &h.base);
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
pub fn record_markov(cfg: &CoreConfig, ds: &DsparkWeights) -> MarkovGraph {
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
