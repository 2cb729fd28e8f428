//! Deterministic DeepSeek V4 test models in ds4's exact GGUF layout.
//!
//! A [`TestModelSpec`] gives the small shapes (layers and ratio schedule,
//! widths, experts, window, indexer top-k); [`Variant`] picks the tensor types
//! (`f32`, `q8`, `q2` as ds4's q2 mix, `q4`, `mxfp4` as ds4f-mxfp4's mix). Weights come from a seeded
//! generator keyed by tensor name, so a file is reproducible bit for bit.
//! The same layout code writes the full-shape Flash file whose data region is
//! a hole ([`write_sparse_flash`]), which tests loading at real scale.

pub mod dspark;
mod rng;
mod tensors;
pub mod v41;
pub mod vocab;

use std::io;
use std::path::Path;

use crate::gguf::{GgufWriter, MetaArray, MetaValue};
use crate::model::ModelConfig;
use crate::quant::GgmlType;

pub use rng::Rng;
pub use tensors::{encode_tensor, random_blocks, CoreShape};
pub use vocab::Vocab;

use tensors::{write_planned, Class, Data, Init, Planned, Planner};

/// Small shapes of a generated V4 model: the shapes both families share,
/// and V4's own. Field meanings follow MODEL.md §1.
#[derive(Clone, Debug)]
pub struct TestModelSpec {
    pub core: CoreShape,
    /// Compressed layers with this ratio get the overlapped compressor and the
    /// indexer (CSA); other compressed layers are HCA.
    pub csa_ratio: usize,
    pub n_expert_shared: usize,
    pub n_hash_layers: usize,
    pub rope_base: f32,
    pub compress_rope_base: f32,
    pub swiglu_clamp: f32,
    pub expert_weights_scale: f32,
    pub context_length: u32,
    /// Fill quantised tensors with random valid blocks instead of quantising
    /// random values: fast, for speed benchmarks of large models only.
    pub random_blocks: bool,
}

impl TestModelSpec {
    /// The default tiny model: 6 layers (2 window, 2 CSA ratio 4, 2 HCA ratio
    /// 16, 3 hash layers), window 32, indexer top-k 16. Prompts of a few
    /// hundred tokens cross the window, give compressed rows of both kinds, and
    /// make the indexer choose a strict subset. Widths are multiples of 256 so
    /// the K-quant and IQ2 variants are possible; heads of 80 with 16 rotary
    /// dims leave exactly one 64-wide FP8 block, as Flash's 448 leave seven.
    /// Gain 0.5 keeps the model well conditioned (tools/reference/README.md).
    pub fn tiny() -> TestModelSpec {
        TestModelSpec {
            core: CoreShape {
                name: "ds4 tiny test model (random weights)".into(),
                n_embd: 256,
                n_head: 4,
                head_dim: 80,
                n_rot: 16,
                q_lora_rank: 64,
                o_lora_rank: 32,
                o_groups: 2,
                sliding_window: 32,
                compress_ratios: vec![0, 0, 4, 16, 4, 16],
                indexer_heads: 16,
                indexer_head_dim: 32,
                indexer_top_k: 16,
                n_expert: 8,
                n_expert_used: 2,
                expert_ff: 256,
                hc_count: 4,
                hc_sinkhorn_iters: 20,
                yarn_factor: 16.0,
                yarn_original_context: 65536,
                init_gain: 0.5,
                seed: 0x5eed_d5d4,
            },
            csa_ratio: 4,
            n_expert_shared: 1,
            n_hash_layers: 3,
            rope_base: 10000.0,
            compress_rope_base: 160000.0,
            swiglu_clamp: 10.0,
            expert_weights_scale: 1.5,
            context_length: 1 << 20,
            random_blocks: false,
        }
    }

    /// The long-context test model (`ds4-make-test-model --long-context`):
    /// Flash's layer schedule (two window layers, then CSA ratio 4 and HCA
    /// ratio 128 alternating), Flash's window of 128 and an indexer of 4
    /// heads choosing 64 rows. At 3,000 tokens the indexer picks 64 of about
    /// 750 compressed rows and the ratio-128 compressors have emitted 23
    /// rows: selection bites as it does at Flash's 512 of tens of thousands.
    /// Narrower than the tiny model where the length does not depend on it
    /// (embedding 64, 2 attention heads in one output group, experts of
    /// 128) so that thousands
    /// of tokens stay affordable on a CPU emulator of a GPU; heads of 80 and
    /// the indexer's 32 are the tiny model's. f32 and q8 are the variants
    /// used (the K-quant ones need `--embd 256` at least).
    pub fn long_context() -> TestModelSpec {
        let mut spec = TestModelSpec::tiny();
        let c = &mut spec.core;
        c.name = "ds4 long-context test model (random weights)".into();
        c.n_embd = 64;
        c.n_head = 2;
        // One output group of 2 heads × 80: rows of 160, a whole number
        // of Q8_0 blocks (the q8 variant).
        c.o_groups = 1;
        c.expert_ff = 128;
        c.sliding_window = 128;
        c.compress_ratios = vec![0, 0, 4, 128, 4, 128];
        c.indexer_heads = 4;
        c.indexer_top_k = 64;
        spec
    }

    /// The real DeepSeek V4 Flash shape (GGUF.md §3–4).
    pub fn flash() -> TestModelSpec {
        let mut ratios = vec![0, 0];
        for l in 2..43 {
            ratios.push(if l % 2 == 0 { 4 } else { 128 });
        }
        // RoPE, YaRN, hyper-connection, clamp and routing constants are the
        // tiny model's (which copies Flash's); only the shapes differ.
        let tiny = TestModelSpec::tiny();
        TestModelSpec {
            core: CoreShape {
                name: "DeepSeek V4 Flash".into(),
                n_embd: 4096,
                n_head: 64,
                head_dim: 512,
                n_rot: 64,
                q_lora_rank: 1024,
                o_lora_rank: 1024,
                o_groups: 8,
                sliding_window: 128,
                compress_ratios: ratios,
                indexer_heads: 64,
                indexer_head_dim: 128,
                indexer_top_k: 512,
                n_expert: 256,
                n_expert_used: 6,
                expert_ff: 2048,
                init_gain: 1.0,
                seed: 0,
                ..tiny.core
            },
            random_blocks: true,
            ..tiny
        }
    }

    /// The medium bench model (`cargo bench --bench cpu_forward`,
    /// `ds4-bench --make-model flash:N`): Flash's full widths — 4096
    /// embedding, 64 heads × 512, 256 experts of 2048 in ds4's q2 mix,
    /// random blocks — over `layers` layers (2 window layers, then CSA and
    /// HCA pairs), so it fits in memory; 8.85 GiB at 4 layers.
    pub fn flash_bench(layers: usize) -> TestModelSpec {
        let mut spec = TestModelSpec::flash();
        spec.core.compress_ratios = (0..layers)
            .map(|l| {
                if l < 2 {
                    0
                } else if l % 2 == 0 {
                    4
                } else {
                    128
                }
            })
            .collect();
        spec.n_hash_layers = spec.n_hash_layers.min(layers);
        spec.core.name = format!("medium bench model ({layers} Flash-width layers, random blocks)");
        spec.core.init_gain = 0.5;
        spec
    }

    pub fn n_layer(&self) -> usize {
        self.core.n_layer()
    }

    /// The spec whose tensor plan has the directory of a V4 model of
    /// hyper-parameters `c` (the converter's check that a converted file
    /// gets the published mix's types, [`tensor_types`]): every shape of
    /// `c`; the constants the plan does not use are the tiny model's.
    pub fn from_config(c: &ModelConfig) -> TestModelSpec {
        let tiny = TestModelSpec::tiny();
        TestModelSpec {
            core: CoreShape::with_shapes_of(c, tiny.core),
            n_expert_shared: c.n_expert_shared,
            n_hash_layers: c.n_hash_layers,
            ..tiny
        }
    }
}

/// Applies `ds4-make-test-model` options (`--long-context`, `--variant`,
/// `--ratios`, `--embd`, `--window`, `--top-k` or `--indexer-top-k`,
/// `--indexer-heads`, `--experts`, `--init-gain`, `--seed`; `-o` and its
/// value are skipped) to the tiny spec (`--long-context`: to
/// [`TestModelSpec::long_context`], and it must come first). Tests use it to rebuild exactly the
/// model a golden file was made from.
pub fn spec_from_args(args: &[&str]) -> Result<(TestModelSpec, Variant), String> {
    let mut spec = TestModelSpec::tiny();
    let mut variant = Variant::F32;
    let mut it = args.iter();
    while let Some(&flag) = it.next() {
        let mut val = || {
            it.next()
                .copied()
                .ok_or_else(|| format!("{flag}: missing value"))
        };
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: bad number {v:?}"))
        };
        match flag {
            "-o" | "--out" => {
                val()?;
            }
            "--variant" => {
                let v = val()?;
                variant = Variant::parse(v).ok_or_else(|| format!("--variant: unknown {v:?}"))?;
            }
            "--ratios" => {
                spec.core.compress_ratios = val()?
                    .split(',')
                    .map(|x| num(x.trim()))
                    .collect::<Result<_, _>>()?;
                spec.n_hash_layers = spec.n_hash_layers.min(spec.core.compress_ratios.len());
            }
            "--embd" => spec.core.n_embd = num(val()?)?,
            "--long-context" => spec = TestModelSpec::long_context(),
            "--window" => spec.core.sliding_window = num(val()?)?,
            "--top-k" | "--indexer-top-k" => spec.core.indexer_top_k = num(val()?)?,
            "--indexer-heads" => spec.core.indexer_heads = num(val()?)?,
            "--experts" => spec.core.n_expert = num(val()?)?,
            "--init-gain" => {
                let v = val()?;
                spec.core.init_gain = v
                    .parse()
                    .map_err(|_| format!("--init-gain: bad number {v:?}"))?;
            }
            "--seed" => {
                let v = val()?;
                spec.core.seed = v.parse().map_err(|_| format!("--seed: bad number {v:?}"))?;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok((spec, variant))
}

/// Tensor type recipe of a generated file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Every tensor F32 (tight comparisons with the reference).
    F32,
    /// ds4's dense types (F16 tables/mixers, Q8_0 projections) with Q8_0 experts.
    Q8,
    /// ds4's q2 mix: IQ2_XXS routed gate/up, Q2_K routed down, Q8_0 dense.
    Q2,
    /// Q4_K routed experts, Q8_0 dense.
    Q4,
    /// ds4f-mxfp4's mix: MXFP4 routed gate/up/down, the rest as q2/q4.
    Mxfp4,
}

impl Variant {
    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "f32" => Some(Variant::F32),
            "q8" => Some(Variant::Q8),
            "q2" => Some(Variant::Q2),
            "q4" => Some(Variant::Q4),
            "mxfp4" => Some(Variant::Mxfp4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Variant::F32 => "f32",
            Variant::Q8 => "q8",
            Variant::Q2 => "q2",
            Variant::Q4 => "q4",
            Variant::Mxfp4 => "mxfp4",
        }
    }

    pub const ALL: [Variant; 5] = [
        Variant::F32,
        Variant::Q8,
        Variant::Q2,
        Variant::Q4,
        Variant::Mxfp4,
    ];
}

/// One V4 block (`p` = `blk.L.` or `mtp.0.`): the shared parts, V4's own
/// compressors (CSA: overlapped, with the indexer's) and the hash table or
/// router bias.
pub(crate) fn plan_block(
    s: &TestModelSpec,
    p: &str,
    ratio: usize,
    hash: bool,
    n_vocab: usize,
    t: &mut Planner,
) {
    t.hc_mix(p, "attn");
    t.attention(p);
    if ratio > 0 {
        let csa = ratio == s.csa_ratio;
        plan_compressor(t, p, "attn_compressor_", ratio, s.core.head_dim, csa);
        if csa {
            t.indexer_query(p);
            plan_compressor(
                t,
                p,
                "indexer_compressor_",
                ratio,
                s.core.indexer_head_dim,
                true,
            );
        }
    }
    t.hc_mix(p, "ffn");
    t.router(p, Class::F16Dense);
    if !hash {
        t.add(
            format!("{p}exp_probs_b.bias"),
            &[s.core.n_expert],
            Class::Vector,
            Init::Normal(0.1),
        );
    } else {
        let (k, e) = (s.core.n_expert_used, s.core.n_expert);
        let ids = Init::ExpertIds { k, e };
        t.add(
            format!("{p}ffn_gate_tid2eid.weight"),
            &[k, n_vocab],
            Class::Table,
            ids,
        );
    }
    t.experts(p);
    if s.n_expert_shared > 0 {
        t.shared_expert(p);
    }
}

/// A V4 compressor `{p}{c}ape/kv/gate/norm` of rows `hd` (2·hd when overlapped).
fn plan_compressor(t: &mut Planner, p: &str, c: &str, ratio: usize, hd: usize, overlapped: bool) {
    let d = t.dims.n_embd;
    let w = if overlapped { 2 * hd } else { hd };
    let nd = t.normal(d);
    t.add(
        format!("{p}{c}ape.weight"),
        &[w, ratio],
        Class::F16Dense,
        Init::Normal(0.5),
    );
    t.add(format!("{p}{c}kv.weight"), &[d, w], Class::F16Dense, nd);
    t.add(format!("{p}{c}gate.weight"), &[d, w], Class::F16Dense, nd);
    t.add(
        format!("{p}{c}norm.weight"),
        &[hd],
        Class::Vector,
        Init::NormWeight,
    );
}

fn plan_main(s: &TestModelSpec, n_vocab: usize) -> Vec<Planned> {
    let (d, hc) = (s.core.n_embd, s.core.hc_count);
    let mut t = Planner::new(&s.core);
    t.token_embedding(n_vocab);
    for (l, &ratio) in s.core.compress_ratios.iter().enumerate() {
        let hash = l < s.n_hash_layers;
        plan_block(s, &format!("blk.{l}."), ratio, hash, n_vocab, &mut t);
    }
    let nhc = t.normal(hc * d);
    t.add(
        "output_hc_fn.weight".into(),
        &[hc * d, hc],
        Class::F16Dense,
        nhc,
    );
    t.add(
        "output_hc_scale.weight".into(),
        &[1],
        Class::Vector,
        Init::Uniform(0.5, 1.5),
    );
    t.add(
        "output_hc_base.weight".into(),
        &[hc],
        Class::Vector,
        Init::Normal(0.5),
    );
    t.output_head(n_vocab);
    t.out
}

fn plan_mtp(s: &TestModelSpec) -> Vec<Planned> {
    let d = s.core.n_embd;
    let mut t = Planner::new(&s.core);
    let n = |x: &str| format!("mtp.0.{x}.weight");
    let nd = t.normal(d);
    t.hc_head("mtp.0.");
    t.add(n("e_proj"), &[d, d], Class::Q8Dense, nd);
    t.add(n("h_proj"), &[d, d], Class::Q8Dense, nd);
    for x in ["enorm", "hnorm", "norm"] {
        t.add(n(x), &[d], Class::Vector, Init::NormWeight);
    }
    plan_block(s, "mtp.0.", 0, false, 0, &mut t);
    t.out
}

fn add_metadata(w: &mut GgufWriter, s: &TestModelSpec, vocab: &Vocab) {
    let k = |x: &str| format!("deepseek4.{x}");
    let n_layer = s.n_layer();
    w.add_str("general.architecture", "deepseek4");
    w.add_str("general.name", &s.core.name);
    w.add_u32(&k("block_count"), n_layer as u32);
    w.add_u32(&k("context_length"), s.context_length);
    w.add_u32(&k("embedding_length"), s.core.n_embd as u32);
    w.add_u32(&k("vocab_size"), vocab.tokens.len() as u32);
    w.add_u32(&k("attention.head_count"), s.core.n_head as u32);
    w.add_u32(&k("attention.head_count_kv"), 1);
    w.add_u32(&k("attention.key_length"), s.core.head_dim as u32);
    w.add_u32(&k("attention.value_length"), s.core.head_dim as u32);
    w.add_u32(&k("attention.q_lora_rank"), s.core.q_lora_rank as u32);
    w.add_u32(&k("attention.output_lora_rank"), s.core.o_lora_rank as u32);
    w.add_u32(&k("attention.output_group_count"), s.core.o_groups as u32);
    w.add_u32(&k("attention.sliding_window"), s.core.sliding_window as u32);
    // One more slot for the MTP layer, as the published files carry.
    let mut ratios: Vec<i32> = s.core.compress_ratios.iter().map(|&r| r as i32).collect();
    ratios.push(0);
    w.add_array(&k("attention.compress_ratios"), MetaArray::I32(ratios));
    w.add_f32(
        &k("attention.compress_rope_freq_base"),
        s.compress_rope_base,
    );
    w.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
    w.add_u32(
        &k("attention.indexer.head_count"),
        s.core.indexer_heads as u32,
    );
    w.add_u32(
        &k("attention.indexer.key_length"),
        s.core.indexer_head_dim as u32,
    );
    w.add_u32(&k("attention.indexer.top_k"), s.core.indexer_top_k as u32);
    w.add_u32(&k("rope.dimension_count"), s.core.n_rot as u32);
    w.add_f32(&k("rope.freq_base"), s.rope_base);
    w.add_str(&k("rope.scaling.type"), "yarn");
    w.add_f32(&k("rope.scaling.factor"), s.core.yarn_factor);
    w.add_u32(
        &k("rope.scaling.original_context_length"),
        s.core.yarn_original_context,
    );
    w.add_f32(&k("rope.scaling.yarn_beta_fast"), 32.0);
    w.add_f32(&k("rope.scaling.yarn_beta_slow"), 1.0);
    w.add_u32(&k("expert_count"), s.core.n_expert as u32);
    w.add_u32(&k("expert_used_count"), s.core.n_expert_used as u32);
    w.add_u32(&k("expert_feed_forward_length"), s.core.expert_ff as u32);
    w.add_u32(&k("expert_shared_count"), s.n_expert_shared as u32);
    w.add_f32(&k("expert_weights_scale"), s.expert_weights_scale);
    w.add_bool(&k("expert_weights_norm"), true);
    w.add_u32(&k("expert_gating_func"), 4);
    w.add_u32(&k("hash_layer_count"), s.n_hash_layers as u32);
    w.add_array(
        &k("swiglu_clamp_exp"),
        MetaArray::F32(vec![s.swiglu_clamp; n_layer + 1]),
    );
    w.add_u32(&k("nextn_predict_layers"), 1);
    w.add_u32(&k("hyper_connection.count"), s.core.hc_count as u32);
    w.add_u32(
        &k("hyper_connection.sinkhorn_iterations"),
        s.core.hc_sinkhorn_iters as u32,
    );
    w.add_f32(&k("hyper_connection.epsilon"), 1e-6);
    add_tokenizer(w, vocab, false);
}

/// The vocabulary and its BPE merges, as both families' files carry them
/// (V4.1's metadata script writes the token types before the merges).
fn add_tokenizer(w: &mut GgufWriter, vocab: &Vocab, types_first: bool) {
    w.add_str("tokenizer.ggml.model", "gpt2");
    w.add_str("tokenizer.ggml.pre", "joyai-llm");
    let v = vocab.clone();
    w.add_array("tokenizer.ggml.tokens", MetaArray::String(v.tokens));
    let types = MetaArray::I32(v.token_types);
    if types_first {
        w.add_array("tokenizer.ggml.token_type", types.clone());
    }
    w.add_array("tokenizer.ggml.merges", MetaArray::String(v.merges));
    if !types_first {
        w.add_array("tokenizer.ggml.token_type", types);
    }
    w.add_kv("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    w.add_kv("tokenizer.ggml.eos_token_id", MetaValue::U32(1));
}

/// The main model's tensors in file order, each with its GGUF shape and
/// its type in `variant` (ds4's published mix of that name): the plan the
/// generator writes, which the converter (`ds4::convert::write`) follows.
pub fn tensor_types(
    spec: &TestModelSpec,
    variant: Variant,
    n_vocab: usize,
) -> Vec<(String, Vec<u64>, GgmlType)> {
    typed(plan_main(spec, n_vocab), variant)
}

/// [`tensor_types`] of the MTP file ([`write_mtp`]).
pub fn mtp_tensor_types(
    spec: &TestModelSpec,
    variant: Variant,
) -> Vec<(String, Vec<u64>, GgmlType)> {
    typed(plan_mtp(spec), variant)
}

pub(crate) fn typed(plan: Vec<Planned>, variant: Variant) -> Vec<(String, Vec<u64>, GgmlType)> {
    plan.into_iter()
        .map(|t| {
            let ty = variant.type_for(t.class);
            (t.name, t.ne, ty)
        })
        .collect()
}

/// Writes a main-model GGUF with random weights.
pub fn write_model(
    spec: &TestModelSpec,
    variant: Variant,
    vocab: &Vocab,
    path: &Path,
) -> io::Result<()> {
    let mut w = GgufWriter::new();
    add_metadata(&mut w, spec, vocab);
    let data = Data::values_or_random(spec.random_blocks);
    let plan = plan_main(spec, vocab.tokens.len());
    write_planned(w, plan, variant, spec.core.seed, data, path)
}

/// Writes the matching MTP draft GGUF (tensor directory only, no metadata read).
pub fn write_mtp(spec: &TestModelSpec, variant: Variant, path: &Path) -> io::Result<()> {
    let mut w = GgufWriter::new();
    // Like the published file, it says deepseek4 but carries no model keys.
    w.add_str("general.architecture", "deepseek4");
    let data = Data::values_or_random(spec.random_blocks);
    let seed = spec.core.seed ^ 0x004d_5450;
    write_planned(w, plan_mtp(spec), variant, seed, data, path)
}

/// Writes a file with the exact header of the published Flash q2 file (every
/// tensor with its real shape and type) whose data region is a hole.
pub fn write_sparse_flash(vocab: &Vocab, path: &Path) -> io::Result<()> {
    write_sparse_flash_variant(vocab, Variant::Q2, path)
}

/// [`write_sparse_flash`] in the layout of another published file: `Q2`
/// (ds4f-q2, 80.76 GiB), `Q4` (ds4f-q4, 153.32 GiB) or `Mxfp4` (ds4f-mxfp4,
/// 145.27 GiB); the non-expert tensors are the same in all three.
pub fn write_sparse_flash_variant(vocab: &Vocab, variant: Variant, path: &Path) -> io::Result<()> {
    if !matches!(variant, Variant::Q2 | Variant::Q4 | Variant::Mxfp4) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no published Flash file has the {} layout", variant.name()),
        ));
    }
    let spec = TestModelSpec::flash();
    let mut w = GgufWriter::new();
    add_metadata(&mut w, &spec, vocab);
    let plan = plan_main(&spec, vocab.tokens.len());
    write_planned(w, plan, variant, 0, Data::Hole, path)
}
