//! Deterministic DeepSeek V4 test models in ds4's exact GGUF layout.
//!
//! A [`TestModelSpec`] gives the small shapes (layers and ratio schedule,
//! widths, experts, window, indexer top-k); [`Variant`] picks the tensor types
//! (`f32`, `q8`, `q2` as ds4's q2 mix, `q4`, `mxfp4` as ds4f-mxfp4's mix). Weights come from a seeded
//! generator keyed by tensor name, so a file is reproducible bit for bit.
//! The same layout code writes the full-shape Flash file whose data region is
//! a hole ([`write_sparse_flash`]), which tests loading at real scale.

mod rng;
pub mod v41;
pub mod vocab;

use std::io;
use std::path::Path;

use crate::gguf::{GgufWriter, MetaArray, MetaValue};
use crate::quant::{self, GgmlType};

pub use rng::Rng;
pub use vocab::Vocab;

/// Small shapes of a generated model. Field meanings follow MODEL.md §1.
#[derive(Clone, Debug)]
pub struct TestModelSpec {
    pub name: String,
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    pub sliding_window: usize,
    /// Per-layer ratio (0 = window only); its length is the layer count.
    pub compress_ratios: Vec<usize>,
    /// Compressed layers with this ratio get the overlapped compressor and the
    /// indexer (CSA); other compressed layers are HCA.
    pub csa_ratio: usize,
    pub indexer_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_top_k: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub n_expert_shared: usize,
    pub n_hash_layers: usize,
    pub hc_count: usize,
    pub hc_sinkhorn_iters: usize,
    pub rope_base: f32,
    pub compress_rope_base: f32,
    pub yarn_factor: f32,
    pub yarn_original_context: u32,
    pub swiglu_clamp: f32,
    pub expert_weights_scale: f32,
    pub context_length: u32,
    /// Multiplies the standard deviation of every random matrix (conditioning).
    pub init_gain: f32,
    /// Fill quantised tensors with random valid blocks instead of quantising
    /// random values: fast, for speed benchmarks of large models only.
    pub random_blocks: bool,
    pub seed: u64,
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
            csa_ratio: 4,
            indexer_heads: 16,
            indexer_head_dim: 32,
            indexer_top_k: 16,
            n_expert: 8,
            n_expert_used: 2,
            expert_ff: 256,
            n_expert_shared: 1,
            n_hash_layers: 3,
            hc_count: 4,
            hc_sinkhorn_iters: 20,
            rope_base: 10000.0,
            compress_rope_base: 160000.0,
            yarn_factor: 16.0,
            yarn_original_context: 65536,
            swiglu_clamp: 10.0,
            expert_weights_scale: 1.5,
            context_length: 1 << 20,
            init_gain: 0.5,
            random_blocks: false,
            seed: 0x5eed_d5d4,
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
        TestModelSpec {
            name: "ds4 long-context test model (random weights)".into(),
            n_embd: 64,
            n_head: 2,
            // One output group of 2 heads × 80: rows of 160, a whole number
            // of Q8_0 blocks (the q8 variant).
            o_groups: 1,
            expert_ff: 128,
            sliding_window: 128,
            compress_ratios: vec![0, 0, 4, 128, 4, 128],
            indexer_heads: 4,
            indexer_top_k: 64,
            ..TestModelSpec::tiny()
        }
    }

    /// The real DeepSeek V4 Flash shape (GGUF.md §3–4).
    pub fn flash() -> TestModelSpec {
        let mut ratios = vec![0, 0];
        for l in 2..43 {
            ratios.push(if l % 2 == 0 { 4 } else { 128 });
        }
        // RoPE, YaRN, hyper-connection, clamp and routing constants are the
        // tiny model's (which copies Flash's); only the shapes differ.
        TestModelSpec {
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
            random_blocks: true,
            seed: 0,
            ..TestModelSpec::tiny()
        }
    }

    pub fn n_layer(&self) -> usize {
        self.compress_ratios.len()
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
                spec.compress_ratios = val()?
                    .split(',')
                    .map(|x| num(x.trim()))
                    .collect::<Result<_, _>>()?;
                spec.n_hash_layers = spec.n_hash_layers.min(spec.compress_ratios.len());
            }
            "--embd" => spec.n_embd = num(val()?)?,
            "--long-context" => spec = TestModelSpec::long_context(),
            "--window" => spec.sliding_window = num(val()?)?,
            "--top-k" | "--indexer-top-k" => spec.indexer_top_k = num(val()?)?,
            "--indexer-heads" => spec.indexer_heads = num(val()?)?,
            "--experts" => spec.n_expert = num(val()?)?,
            "--init-gain" => {
                let v = val()?;
                spec.init_gain = v
                    .parse()
                    .map_err(|_| format!("--init-gain: bad number {v:?}"))?;
            }
            "--seed" => {
                let v = val()?;
                spec.seed = v.parse().map_err(|_| format!("--seed: bad number {v:?}"))?;
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

    fn type_for(self, class: Class) -> GgmlType {
        use GgmlType::*;
        match (class, self) {
            (Class::Vector, _) => F32,
            (Class::Table, _) => I32,
            (_, Variant::F32) => F32,
            (Class::F16Dense, _) => F16,
            (Class::Q8Dense, _) => Q8_0,
            (Class::ExpertGateUp, Variant::Q8) | (Class::ExpertDown, Variant::Q8) => Q8_0,
            (Class::ExpertGateUp, Variant::Q2) => Iq2Xxs,
            (Class::ExpertDown, Variant::Q2) => Q2K,
            (Class::ExpertGateUp, Variant::Q4) | (Class::ExpertDown, Variant::Q4) => Q4K,
            (Class::ExpertGateUp, Variant::Mxfp4) | (Class::ExpertDown, Variant::Mxfp4) => Mxfp4,
        }
    }
}

/// Storage class of a tensor (GGUF.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Embedding, router, HC mixers, compressors, indexer, ape: F16 in ds4 files.
    F16Dense,
    /// Attention projections, shared experts, head: Q8_0 in ds4 files.
    Q8Dense,
    ExpertGateUp,
    ExpertDown,
    /// Norms, sinks, biases, HC scale/base: always F32.
    Vector,
    /// `ffn_gate_tid2eid`: I32.
    Table,
}

#[derive(Clone, Copy, Debug)]
enum Init {
    Normal(f32),
    /// 1 + N(0, 0.1²): norm weights near one.
    NormWeight,
    Uniform(f32, f32),
    /// Rows of `k` distinct expert ids below `e`.
    ExpertIds {
        k: usize,
        e: usize,
    },
}

struct Planned {
    name: String,
    ne: Vec<u64>,
    class: Class,
    init: Init,
}

fn plan_block(
    s: &TestModelSpec,
    p: &str,
    ratio: usize,
    hash: bool,
    n_vocab: usize,
    out: &mut Vec<Planned>,
) {
    let d = s.n_embd;
    let g = s.init_gain;
    let std = |fan_in: usize| g / (fan_in as f32).sqrt();
    let hc_d = s.hc_count * d;
    let mix = (2 + s.hc_count) * s.hc_count;
    let mut add = |name: &str, ne: &[usize], class: Class, init: Init| {
        out.push(Planned {
            name: format!("{p}{name}"),
            ne: ne.iter().map(|&x| x as u64).collect(),
            class,
            init,
        })
    };
    use Class::*;
    add(
        "hc_attn_fn.weight",
        &[hc_d, mix],
        F16Dense,
        Init::Normal(std(hc_d)),
    );
    add(
        "hc_attn_scale.weight",
        &[3],
        Vector,
        Init::Uniform(0.5, 1.5),
    );
    add("hc_attn_base.weight", &[mix], Vector, Init::Normal(0.5));
    add("attn_norm.weight", &[d], Vector, Init::NormWeight);
    add(
        "attn_q_a.weight",
        &[d, s.q_lora_rank],
        Q8Dense,
        Init::Normal(std(d)),
    );
    add(
        "attn_q_a_norm.weight",
        &[s.q_lora_rank],
        Vector,
        Init::NormWeight,
    );
    add(
        "attn_q_b.weight",
        &[s.q_lora_rank, s.n_head * s.head_dim],
        Q8Dense,
        Init::Normal(std(s.q_lora_rank)),
    );
    add(
        "attn_kv.weight",
        &[d, s.head_dim],
        Q8Dense,
        Init::Normal(std(d)),
    );
    add(
        "attn_kv_a_norm.weight",
        &[s.head_dim],
        Vector,
        Init::NormWeight,
    );
    add("attn_sinks.weight", &[s.n_head], Vector, Init::Normal(1.0));
    let group_in = s.n_head / s.o_groups * s.head_dim;
    add(
        "attn_output_a.weight",
        &[group_in, s.o_groups * s.o_lora_rank],
        Q8Dense,
        Init::Normal(std(group_in)),
    );
    add(
        "attn_output_b.weight",
        &[s.o_groups * s.o_lora_rank, d],
        Q8Dense,
        Init::Normal(std(s.o_groups * s.o_lora_rank)),
    );
    if ratio > 0 {
        let csa = ratio == s.csa_ratio;
        let c = if csa { 2 * s.head_dim } else { s.head_dim };
        add(
            "attn_compressor_ape.weight",
            &[c, ratio],
            F16Dense,
            Init::Normal(0.5),
        );
        add(
            "attn_compressor_kv.weight",
            &[d, c],
            F16Dense,
            Init::Normal(std(d)),
        );
        add(
            "attn_compressor_gate.weight",
            &[d, c],
            F16Dense,
            Init::Normal(std(d)),
        );
        add(
            "attn_compressor_norm.weight",
            &[s.head_dim],
            Vector,
            Init::NormWeight,
        );
        if csa {
            let ihd = s.indexer_head_dim;
            add(
                "indexer.attn_q_b.weight",
                &[s.q_lora_rank, s.indexer_heads * ihd],
                F16Dense,
                Init::Normal(std(s.q_lora_rank)),
            );
            add(
                "indexer.proj.weight",
                &[d, s.indexer_heads],
                F16Dense,
                Init::Normal(std(d)),
            );
            add(
                "indexer_compressor_ape.weight",
                &[2 * ihd, ratio],
                F16Dense,
                Init::Normal(0.5),
            );
            add(
                "indexer_compressor_kv.weight",
                &[d, 2 * ihd],
                F16Dense,
                Init::Normal(std(d)),
            );
            add(
                "indexer_compressor_gate.weight",
                &[d, 2 * ihd],
                F16Dense,
                Init::Normal(std(d)),
            );
            add(
                "indexer_compressor_norm.weight",
                &[ihd],
                Vector,
                Init::NormWeight,
            );
        }
    }
    add(
        "hc_ffn_fn.weight",
        &[hc_d, mix],
        F16Dense,
        Init::Normal(std(hc_d)),
    );
    add("hc_ffn_scale.weight", &[3], Vector, Init::Uniform(0.5, 1.5));
    add("hc_ffn_base.weight", &[mix], Vector, Init::Normal(0.5));
    add("ffn_norm.weight", &[d], Vector, Init::NormWeight);
    add(
        "ffn_gate_inp.weight",
        &[d, s.n_expert],
        F16Dense,
        Init::Normal(std(d)),
    );
    if !hash {
        add("exp_probs_b.bias", &[s.n_expert], Vector, Init::Normal(0.1));
    } else {
        add(
            "ffn_gate_tid2eid.weight",
            &[s.n_expert_used, n_vocab],
            Table,
            Init::ExpertIds {
                k: s.n_expert_used,
                e: s.n_expert,
            },
        );
    }
    let (e, ff) = (s.n_expert, s.expert_ff);
    add(
        "ffn_gate_exps.weight",
        &[d, ff, e],
        ExpertGateUp,
        Init::Normal(std(d)),
    );
    add(
        "ffn_up_exps.weight",
        &[d, ff, e],
        ExpertGateUp,
        Init::Normal(std(d)),
    );
    add(
        "ffn_down_exps.weight",
        &[ff, d, e],
        ExpertDown,
        Init::Normal(std(ff)),
    );
    if s.n_expert_shared > 0 {
        add(
            "ffn_gate_shexp.weight",
            &[d, ff],
            Q8Dense,
            Init::Normal(std(d)),
        );
        add(
            "ffn_up_shexp.weight",
            &[d, ff],
            Q8Dense,
            Init::Normal(std(d)),
        );
        add(
            "ffn_down_shexp.weight",
            &[ff, d],
            Q8Dense,
            Init::Normal(std(ff)),
        );
    }
}

fn plan_main(s: &TestModelSpec, n_vocab: usize) -> Vec<Planned> {
    let d = s.n_embd;
    let mut out = vec![Planned {
        name: "token_embd.weight".into(),
        ne: vec![d as u64, n_vocab as u64],
        class: Class::F16Dense,
        init: Init::Normal(1.0),
    }];
    for (l, &ratio) in s.compress_ratios.iter().enumerate() {
        plan_block(
            s,
            &format!("blk.{l}."),
            ratio,
            l < s.n_hash_layers,
            n_vocab,
            &mut out,
        );
    }
    let hc_d = (s.hc_count * d) as u64;
    let g = s.init_gain;
    out.push(Planned {
        name: "output_hc_fn.weight".into(),
        ne: vec![hc_d, s.hc_count as u64],
        class: Class::F16Dense,
        init: Init::Normal(g / (hc_d as f32).sqrt()),
    });
    out.push(Planned {
        name: "output_hc_scale.weight".into(),
        ne: vec![1],
        class: Class::Vector,
        init: Init::Uniform(0.5, 1.5),
    });
    out.push(Planned {
        name: "output_hc_base.weight".into(),
        ne: vec![s.hc_count as u64],
        class: Class::Vector,
        init: Init::Normal(0.5),
    });
    out.push(Planned {
        name: "output_norm.weight".into(),
        ne: vec![d as u64],
        class: Class::Vector,
        init: Init::NormWeight,
    });
    out.push(Planned {
        name: "output.weight".into(),
        ne: vec![d as u64, n_vocab as u64],
        class: Class::Q8Dense,
        init: Init::Normal(g / (d as f32).sqrt()),
    });
    out
}

fn plan_mtp(s: &TestModelSpec) -> Vec<Planned> {
    let d = s.n_embd;
    let hc_d = s.hc_count * d;
    let g = s.init_gain;
    let mut out = Vec::new();
    let mut add = |name: &str, ne: &[usize], class: Class, init: Init| {
        out.push(Planned {
            name: format!("mtp.0.{name}"),
            ne: ne.iter().map(|&x| x as u64).collect(),
            class,
            init,
        })
    };
    add(
        "hc_head_fn.weight",
        &[hc_d, s.hc_count],
        Class::F16Dense,
        Init::Normal(g / (hc_d as f32).sqrt()),
    );
    add(
        "hc_head_scale.weight",
        &[1],
        Class::Vector,
        Init::Uniform(0.5, 1.5),
    );
    add(
        "hc_head_base.weight",
        &[s.hc_count],
        Class::Vector,
        Init::Normal(0.5),
    );
    add(
        "e_proj.weight",
        &[d, d],
        Class::Q8Dense,
        Init::Normal(g / (d as f32).sqrt()),
    );
    add(
        "h_proj.weight",
        &[d, d],
        Class::Q8Dense,
        Init::Normal(g / (d as f32).sqrt()),
    );
    add("enorm.weight", &[d], Class::Vector, Init::NormWeight);
    add("hnorm.weight", &[d], Class::Vector, Init::NormWeight);
    add("norm.weight", &[d], Class::Vector, Init::NormWeight);
    plan_block(s, "mtp.0.", 0, false, 0, &mut out);
    out
}

fn fill(t: &Planned, seed: u64) -> Vec<f32> {
    let n = t.ne.iter().product::<u64>() as usize;
    let mut rng = Rng::for_name(seed, &t.name);
    match t.init {
        Init::Normal(std) => (0..n).map(|_| (rng.normal() * std as f64) as f32).collect(),
        Init::NormWeight => (0..n).map(|_| (1.0 + 0.1 * rng.normal()) as f32).collect(),
        Init::Uniform(lo, hi) => (0..n)
            .map(|_| lo + (hi - lo) * rng.uniform() as f32)
            .collect(),
        Init::ExpertIds { k, e } => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n / k {
                let mut row: Vec<usize> = Vec::with_capacity(k);
                while row.len() < k.min(e) {
                    let x = rng.below(e as u64) as usize;
                    if !row.contains(&x) {
                        row.push(x);
                    }
                }
                v.extend(row.iter().map(|&x| x as f32));
            }
            v
        }
    }
}

/// Encodes f32 values as a tensor of type `ty` (rows along `ne0`).
pub fn encode_tensor(ty: GgmlType, ne0: usize, values: &[f32]) -> io::Result<Vec<u8>> {
    if ty == GgmlType::I32 {
        return Ok(values
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect());
    }
    let row_bytes = ty.row_bytes(ne0 as u64).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("ne0 {ne0} not a multiple of the {ty} block"),
        )
    })? as usize;
    let n_rows = values.len() / ne0;
    let mut out = vec![0u8; row_bytes * n_rows];
    for (src, dst) in values
        .chunks_exact(ne0)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        quant::quantize_row(ty, src, dst, None)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    }
    Ok(out)
}

fn add_metadata(w: &mut GgufWriter, s: &TestModelSpec, vocab: &Vocab) {
    let k = |x: &str| format!("deepseek4.{x}");
    let n_layer = s.n_layer();
    w.add_str("general.architecture", "deepseek4");
    w.add_str("general.name", &s.name);
    w.add_u32(&k("block_count"), n_layer as u32);
    w.add_u32(&k("context_length"), s.context_length);
    w.add_u32(&k("embedding_length"), s.n_embd as u32);
    w.add_u32(&k("vocab_size"), vocab.tokens.len() as u32);
    w.add_u32(&k("attention.head_count"), s.n_head as u32);
    w.add_u32(&k("attention.head_count_kv"), 1);
    w.add_u32(&k("attention.key_length"), s.head_dim as u32);
    w.add_u32(&k("attention.value_length"), s.head_dim as u32);
    w.add_u32(&k("attention.q_lora_rank"), s.q_lora_rank as u32);
    w.add_u32(&k("attention.output_lora_rank"), s.o_lora_rank as u32);
    w.add_u32(&k("attention.output_group_count"), s.o_groups as u32);
    w.add_u32(&k("attention.sliding_window"), s.sliding_window as u32);
    // One more slot for the MTP layer, as the published files carry.
    let mut ratios: Vec<i32> = s.compress_ratios.iter().map(|&r| r as i32).collect();
    ratios.push(0);
    w.add_array(&k("attention.compress_ratios"), MetaArray::I32(ratios));
    w.add_f32(
        &k("attention.compress_rope_freq_base"),
        s.compress_rope_base,
    );
    w.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-6);
    w.add_u32(&k("attention.indexer.head_count"), s.indexer_heads as u32);
    w.add_u32(
        &k("attention.indexer.key_length"),
        s.indexer_head_dim as u32,
    );
    w.add_u32(&k("attention.indexer.top_k"), s.indexer_top_k as u32);
    w.add_u32(&k("rope.dimension_count"), s.n_rot as u32);
    w.add_f32(&k("rope.freq_base"), s.rope_base);
    w.add_str(&k("rope.scaling.type"), "yarn");
    w.add_f32(&k("rope.scaling.factor"), s.yarn_factor);
    w.add_u32(
        &k("rope.scaling.original_context_length"),
        s.yarn_original_context,
    );
    w.add_f32(&k("rope.scaling.yarn_beta_fast"), 32.0);
    w.add_f32(&k("rope.scaling.yarn_beta_slow"), 1.0);
    w.add_u32(&k("expert_count"), s.n_expert as u32);
    w.add_u32(&k("expert_used_count"), s.n_expert_used as u32);
    w.add_u32(&k("expert_feed_forward_length"), s.expert_ff as u32);
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
    w.add_u32(&k("hyper_connection.count"), s.hc_count as u32);
    w.add_u32(
        &k("hyper_connection.sinkhorn_iterations"),
        s.hc_sinkhorn_iters as u32,
    );
    w.add_f32(&k("hyper_connection.epsilon"), 1e-6);
    w.add_str("tokenizer.ggml.model", "gpt2");
    w.add_str("tokenizer.ggml.pre", "joyai-llm");
    w.add_array(
        "tokenizer.ggml.tokens",
        MetaArray::String(vocab.tokens.clone()),
    );
    w.add_array(
        "tokenizer.ggml.merges",
        MetaArray::String(vocab.merges.clone()),
    );
    w.add_array(
        "tokenizer.ggml.token_type",
        MetaArray::I32(vocab.token_types.clone()),
    );
    w.add_kv("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    w.add_kv("tokenizer.ggml.eos_token_id", MetaValue::U32(1));
}

/// Random but valid blocks: random quants with small, finite f16 scales
/// (MXFP4: scale byte 119). Used for large models and benchmarks, where
/// quantizing Gaussian data would take minutes.
pub fn random_blocks(ty: GgmlType, n_elems: usize, rng: &mut Rng) -> Vec<u8> {
    let (be, bb) = ty.block_layout();
    let mut out = vec![0u8; n_elems / be * bb];
    for chunk in out.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    // Offsets of the f16 scale fields (QUANTS.md §3–6).
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Iq2Xxs => &[0],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q4K => &[0, 2],
        _ => &[],
    };
    let small = half::f16::from_f32(0.004).to_bits().to_le_bytes();
    for block in out.chunks_exact_mut(bb) {
        for &o in scale_offsets {
            block[o..o + 2].copy_from_slice(&small);
        }
        if ty == GgmlType::Mxfp4 {
            // E8M0 scale byte: 2^(119-128) = 1/512, values up to 12/512.
            block[0] = 119;
        }
    }
    out
}

fn add_planned(
    w: &mut GgufWriter,
    plan: Vec<Planned>,
    random: bool,
    variant: Variant,
    seed: u64,
    hole: bool,
) -> io::Result<()> {
    for t in plan {
        let ty = variant.type_for(t.class);
        let ne = t.ne.clone();
        let name = t.name.clone();
        if hole {
            w.add_tensor_hole(&name, &ne, ty)?;
            continue;
        }
        let quantised = !matches!(
            ty,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::I32
        );
        // Generated when the file is written: one tensor in memory at a time.
        let make: crate::gguf::writer::LazyData = if random && quantised {
            Box::new(move || {
                let n = t.ne.iter().product::<u64>() as usize;
                Ok(random_blocks(ty, n, &mut Rng::for_name(seed, &t.name)))
            })
        } else {
            Box::new(move || encode_tensor(ty, t.ne[0] as usize, &fill(&t, seed)))
        };
        w.add_tensor_lazy(&name, &ne, ty, make)?;
    }
    Ok(())
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
    add_planned(
        &mut w,
        plan_main(spec, vocab.tokens.len()),
        spec.random_blocks,
        variant,
        spec.seed,
        false,
    )?;
    w.write_to_path(path)
}

/// Writes the matching MTP draft GGUF (tensor directory only, no metadata read).
pub fn write_mtp(spec: &TestModelSpec, variant: Variant, path: &Path) -> io::Result<()> {
    let mut w = GgufWriter::new();
    // Like the published file, it says deepseek4 but carries no model keys.
    w.add_str("general.architecture", "deepseek4");
    add_planned(
        &mut w,
        plan_mtp(spec),
        spec.random_blocks,
        variant,
        spec.seed ^ 0x004d_5450,
        false,
    )?;
    w.write_to_path(path)
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
    add_planned(
        &mut w,
        plan_main(&spec, vocab.tokens.len()),
        false,
        variant,
        0,
        true,
    )?;
    w.write_to_path(path)
}
