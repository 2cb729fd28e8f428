//! Tiny DSpark drafter files for the tiny V4 and V4.1 models
//! (docs/SPECULATIVE.md): ds4's `deepseek4-dspark` and `deepseek41-dspark`
//! layouts with random weights.

use std::io;
use std::path::Path;

use super::tensors::{write_planned, Class, CoreShape, Data, Init, Planned, Planner};
use super::v41::V41Spec;
use super::{plan_block, typed, TestModelSpec, Variant};
use crate::gguf::{GgufWriter, MetaArray};
use crate::model::dspark::DsparkConfig;
use crate::model::family::Arch;
use crate::quant::GgmlType;

/// A drafter's shape (its widths are the model's): the configuration the
/// loader reads back.
pub type DsparkSpec = DsparkConfig;

impl DsparkSpec {
    /// Two stages drafting blocks of 4, tapping the first layer (the
    /// embedding), a middle one and the last, with experts of its own (half
    /// the model's, top-2).
    pub fn for_model(spec: &TestModelSpec) -> DsparkSpec {
        let n = spec.n_layer();
        DsparkConfig {
            family: Arch::V4,
            block_size: 4,
            markov_rank: 8,
            noise_token: 5,
            target_layers: vec![0, n / 2, n - 1],
            n_stages: 2,
            n_expert: (spec.core.n_expert / 2).max(2),
            n_expert_used: 2,
        }
    }

    /// DeepSeek's published shape on a Flash-width model: three stages,
    /// blocks of 5, Markov rank 256, the last three layers tapped, the
    /// model's experts and top-k (ds4's V4 0731 file has no expert keys).
    pub fn flash_for(spec: &TestModelSpec, n_vocab: usize) -> DsparkSpec {
        let n = spec.n_layer();
        DsparkConfig {
            family: Arch::V4,
            block_size: 5,
            markov_rank: 256,
            noise_token: (n_vocab - 1) as u32,
            target_layers: (n.saturating_sub(3)..n).collect(),
            n_stages: 3,
            n_expert: spec.core.n_expert,
            n_expert_used: spec.core.n_expert_used,
        }
    }
}

impl DsparkSpec {
    /// The tiny V4.1 model's drafter: two stages drafting blocks of 4 with
    /// experts of its own, top-1 (the router then does not normalise),
    /// tapping the embedding, an Engram layer (after its module), a plain
    /// middle layer and the last.
    pub fn for_v41(spec: &V41Spec) -> DsparkSpec {
        let n = spec.n_layer();
        let engram = spec.engram_layers[0];
        let middle = (engram + 1..n - 1)
            .find(|l| !spec.engram_layers.contains(l))
            .unwrap_or(n / 2);
        DsparkConfig {
            family: Arch::V41,
            block_size: 4,
            markov_rank: 8,
            noise_token: 5,
            target_layers: vec![0, engram, middle, n - 1],
            n_stages: 2,
            n_expert: spec.core.n_expert.max(2) - 1,
            n_expert_used: 1,
        }
    }
}

/// Writes the drafter for `spec` (its vocabulary has `n_vocab` tokens).
pub fn write_dspark(
    spec: &TestModelSpec,
    ds: &DsparkSpec,
    variant: Variant,
    n_vocab: usize,
    path: &Path,
) -> io::Result<()> {
    let data = Data::values_or_random(spec.random_blocks);
    let plan = plan_v4_dspark(spec, ds, n_vocab);
    write_drafter(&spec.core, ds, variant, n_vocab, data, plan, path)
}

/// The tensors of [`write_dspark`]'s file in order, each with its GGUF
/// shape and its type in `variant`: the plan the converter follows
/// (`ds4-quantize --dspark-only`, `ds4::convert::dspark`).
pub fn dspark_tensor_types(
    spec: &TestModelSpec,
    ds: &DsparkSpec,
    variant: Variant,
    n_vocab: usize,
) -> Vec<(String, Vec<u64>, GgmlType)> {
    typed(plan_v4_dspark(spec, ds, n_vocab), variant)
}

/// A V4 drafter's plan: each stage a window-only V4 block with the
/// drafter's experts and a router bias.
fn plan_v4_dspark(spec: &TestModelSpec, ds: &DsparkSpec, n_vocab: usize) -> Vec<Planned> {
    let mut s = spec.clone();
    s.core.n_expert = ds.n_expert;
    s.core.n_expert_used = ds.n_expert_used;
    let stage = |t: &mut Planner, p: &str| plan_block(&s, p, 0, false, n_vocab, t);
    plan_drafter(&spec.core, ds, n_vocab, stage)
}

/// Writes the drafter for the V4.1 model `spec`: its stages are window-only
/// V4.1 blocks (the router bias and the image-span bias, a shared expert)
/// and its head has no learned HC mix.
pub fn write_v41_dspark(
    spec: &V41Spec,
    ds: &DsparkSpec,
    variant: Variant,
    n_vocab: usize,
    path: &Path,
) -> io::Result<()> {
    let plan = plan_v41_dspark(spec, ds, n_vocab);
    write_drafter(&spec.core, ds, variant, n_vocab, Data::Values, plan, path)
}

/// [`dspark_tensor_types`] of [`write_v41_dspark`]'s file.
pub fn v41_dspark_tensor_types(
    spec: &V41Spec,
    ds: &DsparkSpec,
    variant: Variant,
    n_vocab: usize,
) -> Vec<(String, Vec<u64>, GgmlType)> {
    typed(plan_v41_dspark(spec, ds, n_vocab), variant)
}

fn plan_v41_dspark(spec: &V41Spec, ds: &DsparkSpec, n_vocab: usize) -> Vec<Planned> {
    let stage = |t: &mut Planner, p: &str| {
        t.hc_mix(p, "attn");
        t.attention(p);
        t.hc_mix(p, "ffn");
        t.router(p, Class::Vector);
        for bias in ["exp_probs_b.bias", "exp_probs_b_vl.bias"] {
            t.add(
                format!("{p}{bias}"),
                &[ds.n_expert],
                Class::Vector,
                Init::Normal(0.1),
            );
        }
        t.experts(p);
        t.shared_expert(p);
    };
    plan_drafter(&spec.core, ds, n_vocab, stage)
}

/// The file: the `dspark.*` keys and the tensors of `plan`.
fn write_drafter(
    core: &CoreShape,
    ds: &DsparkSpec,
    variant: Variant,
    n_vocab: usize,
    data: Data,
    plan: Vec<Planned>,
    path: &Path,
) -> io::Result<()> {
    let mut w = GgufWriter::new();
    let arch = match ds.family {
        Arch::V4 => "deepseek4-dspark",
        Arch::V41 => "deepseek41-dspark",
    };
    w.add_str("general.architecture", arch);
    w.add_str("general.name", "ds4 tiny DSpark drafter (random weights)");
    let k = |x: &str| format!("dspark.{x}");
    w.add_u32(&k("block_size"), ds.block_size as u32);
    w.add_u32(&k("markov_rank"), ds.markov_rank as u32);
    w.add_u32(&k("noise_token_id"), ds.noise_token);
    let targets = ds.target_layers.iter().map(|&l| l as u32).collect();
    w.add_array(&k("target_layer_ids"), MetaArray::U32(targets));
    w.add_u32(&k("stage_count"), ds.n_stages as u32);
    w.add_u32(&k("n_layers"), ds.n_stages as u32);
    w.add_u32(&k("expert_count"), ds.n_expert as u32);
    w.add_u32(&k("expert_used_count"), ds.n_expert_used as u32);
    w.add_u32(&k("embedding_length"), core.n_embd as u32);
    w.add_u32(&k("vocab_size"), n_vocab as u32);
    let seed = core.seed ^ 0x0d5a_a4c0;
    write_planned(w, plan, variant, seed, data, path)
}

/// The tensors: each stage's block (`plan_stage`), stage 0's tap
/// projection, the last stage's head.
fn plan_drafter(
    core: &CoreShape,
    ds: &DsparkSpec,
    n_vocab: usize,
    plan_stage: impl Fn(&mut Planner, &str),
) -> Vec<Planned> {
    let mut core = core.clone();
    core.n_expert = ds.n_expert;
    core.n_expert_used = ds.n_expert_used;
    let (d, r) = (core.n_embd, ds.markov_rank);
    let mut t = Planner::new(&core);
    let taps = ds.target_layers.len();
    for stage in 0..ds.n_stages {
        let p = format!("mtp.{stage}.");
        let n = |x: &str| format!("{p}{x}.weight");
        plan_stage(&mut t, &p);
        if stage == 0 {
            let init = t.normal(d * taps);
            t.add(n("main_proj"), &[d * taps, d], Class::Q8Dense, init);
            t.add(n("main_norm"), &[d], Class::Vector, Init::NormWeight);
        }
        if stage + 1 == ds.n_stages {
            if ds.family == Arch::V4 {
                t.hc_head(&p);
            }
            t.add(n("norm"), &[d], Class::Vector, Init::NormWeight);
            let head = t.normal(r);
            t.add(
                n("markov_head.markov_w1"),
                &[r, n_vocab],
                Class::F16Dense,
                Init::Normal(1.0),
            );
            t.add(
                n("markov_head.markov_w2"),
                &[r, n_vocab],
                Class::F16Dense,
                head,
            );
            let conf = t.normal(d + r);
            t.add(
                n("confidence_head.proj"),
                &[d + r, 1],
                Class::F16Dense,
                conf,
            );
        }
    }
    t.out
}
