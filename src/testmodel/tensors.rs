//! What both families' test models share: the tensor plan (name, shape,
//! storage class, how its values are drawn), the per-layer parts V4 and
//! V4.1 have in common (HC mixes, attention projections, the indexer query,
//! router, routed and shared experts), and the writer that turns a plan
//! into GGUF tensors in a [`Variant`]'s types.
//!
//! Values are drawn from a generator seeded by the tensor's name, so a
//! tensor's contents do not depend on where the plan puts it.

use std::io;
use std::path::Path;

use super::{Rng, Variant};
use crate::gguf::GgufWriter;
use crate::model::config::CoreConfig;
use crate::quant::small_float::e4m3_encode;
use crate::quant::{self, GgmlType};

/// Storage class of a tensor (GGUF.md §5): the variant picks its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Embedding, router, HC mixers, compressors, indexer, ape: F16 in ds4 files.
    F16Dense,
    /// Attention projections, shared experts, head: Q8_0 in ds4 files.
    Q8Dense,
    ExpertGateUp,
    ExpertDown,
    /// Norms, sinks, biases, HC scale/base (and V4.1's router): always F32.
    Vector,
    /// `ffn_gate_tid2eid`: I32.
    Table,
    /// V4.1's Engram rows: raw E4M3 codes + E8M0 scales (I8).
    EngramRows,
}

impl Variant {
    pub(crate) fn type_for(self, class: Class) -> GgmlType {
        use GgmlType::*;
        match (class, self) {
            (Class::Vector, _) => F32,
            (Class::Table, _) => I32,
            (Class::EngramRows, _) => I8,
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

#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    Normal(f32),
    /// 1 + N(0, 0.1²): norm weights near one.
    NormWeight,
    Uniform(f32, f32),
    /// Rows of `k` distinct expert ids below `e`.
    ExpertIds {
        k: usize,
        e: usize,
    },
    /// Random Engram rows (see `engram_rows`).
    EngramRows,
}

pub(crate) struct Planned {
    pub name: String,
    pub ne: Vec<u64>,
    pub class: Class,
    pub init: Init,
}

/// The shapes both families' test models share (the generator's side of
/// `model::config::CoreConfig`): [`super::TestModelSpec`] and
/// [`super::v41::V41Spec`] each hold one and add their own fields.
#[derive(Clone, Debug)]
pub struct CoreShape {
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
    pub indexer_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_top_k: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub hc_count: usize,
    pub hc_sinkhorn_iters: usize,
    pub yarn_factor: f32,
    pub yarn_original_context: u32,
    /// Multiplies the standard deviation of every random matrix (conditioning).
    pub init_gain: f32,
    pub seed: u64,
}

impl CoreShape {
    pub fn n_layer(&self) -> usize {
        self.compress_ratios.len()
    }

    /// Every shape and the name of `c` (what a loader read from a file or
    /// the converter from a checkpoint); the constants the plan does not
    /// use (YaRN, init gain, seed) are `rest`'s.
    pub fn with_shapes_of(c: &CoreConfig, rest: CoreShape) -> CoreShape {
        CoreShape {
            name: c.name.clone(),
            n_embd: c.n_embd,
            n_head: c.n_head,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            q_lora_rank: c.q_lora_rank,
            o_lora_rank: c.o_lora_rank,
            o_groups: c.o_groups,
            sliding_window: c.sliding_window,
            compress_ratios: c.compress_ratios.clone(),
            indexer_heads: c.indexer_heads,
            indexer_head_dim: c.indexer_head_dim,
            indexer_top_k: c.indexer_top_k,
            n_expert: c.n_expert,
            n_expert_used: c.n_expert_used,
            expert_ff: c.expert_ff,
            hc_count: c.hc_count,
            hc_sinkhorn_iters: c.hc_sinkhorn_iters,
            ..rest
        }
    }
}

/// A tensor plan being built.
pub(crate) struct Planner {
    pub out: Vec<Planned>,
    pub dims: CoreShape,
}

impl Planner {
    pub fn new(dims: &CoreShape) -> Planner {
        Planner {
            out: Vec::new(),
            dims: dims.clone(),
        }
    }

    pub fn add(&mut self, name: String, ne: &[usize], class: Class, init: Init) {
        self.out.push(Planned {
            name,
            ne: ne.iter().map(|&x| x as u64).collect(),
            class,
            init,
        });
    }

    /// N(0, (gain/√fan_in)²): a matrix of fan-in `fan_in`.
    pub fn normal(&self, fan_in: usize) -> Init {
        Init::Normal(self.dims.init_gain / (fan_in as f32).sqrt())
    }

    /// The token embedding table, `[n_embd, n_vocab]` in F16.
    pub fn token_embedding(&mut self, n_vocab: usize) {
        let d = self.dims.n_embd;
        self.add(
            "token_embd.weight".into(),
            &[d, n_vocab],
            Class::F16Dense,
            Init::Normal(1.0),
        );
    }

    /// The final norm and the vocabulary projection.
    pub fn output_head(&mut self, n_vocab: usize) {
        let d = self.dims.n_embd;
        let nd = self.normal(d);
        self.add(
            "output_norm.weight".into(),
            &[d],
            Class::Vector,
            Init::NormWeight,
        );
        self.add("output.weight".into(), &[d, n_vocab], Class::Q8Dense, nd);
    }

    /// A draft model's output HC mix: `{p}hc_head_fn`, `_scale`, `_base`.
    pub fn hc_head(&mut self, p: &str) {
        let (d, hc) = (self.dims.n_embd, self.dims.hc_count);
        let init = self.normal(hc * d);
        let n = |x: &str| format!("{p}hc_head_{x}.weight");
        self.add(n("fn"), &[hc * d, hc], Class::F16Dense, init);
        self.add(n("scale"), &[1], Class::Vector, Init::Uniform(0.5, 1.5));
        self.add(n("base"), &[hc], Class::Vector, Init::Normal(0.5));
    }

    /// A sublayer's HC mix: `{p}hc_{sub}_fn`, `_scale`, `_base`.
    pub fn hc_mix(&mut self, p: &str, sub: &str) {
        let CoreShape {
            n_embd: d,
            hc_count: hc,
            ..
        } = self.dims;
        let mix = (2 + hc) * hc;
        let init = self.normal(hc * d);
        self.add(
            format!("{p}hc_{sub}_fn.weight"),
            &[hc * d, mix],
            Class::F16Dense,
            init,
        );
        let (scale, base) = (Init::Uniform(0.5, 1.5), Init::Normal(0.5));
        self.add(
            format!("{p}hc_{sub}_scale.weight"),
            &[3],
            Class::Vector,
            scale,
        );
        self.add(
            format!("{p}hc_{sub}_base.weight"),
            &[mix],
            Class::Vector,
            base,
        );
    }

    /// The attention projections, norms and sinks.
    pub fn attention(&mut self, p: &str) {
        let CoreShape {
            n_embd: d,
            head_dim: hd,
            q_lora_rank: ql,
            ..
        } = self.dims;
        let (nh, og) = (self.dims.n_head, self.dims.o_groups);
        let ol = og * self.dims.o_lora_rank;
        let group_in = nh / og * hd;
        let n = |s: &str| format!("{p}{s}.weight");
        let (nd, nql, ngi, nol) = (
            self.normal(d),
            self.normal(ql),
            self.normal(group_in),
            self.normal(ol),
        );
        use Class::{Q8Dense, Vector};
        self.add(n("attn_norm"), &[d], Vector, Init::NormWeight);
        self.add(n("attn_q_a"), &[d, ql], Q8Dense, nd);
        self.add(n("attn_q_a_norm"), &[ql], Vector, Init::NormWeight);
        self.add(n("attn_q_b"), &[ql, nh * hd], Q8Dense, nql);
        self.add(n("attn_kv"), &[d, hd], Q8Dense, nd);
        self.add(n("attn_kv_a_norm"), &[hd], Vector, Init::NormWeight);
        self.add(n("attn_sinks"), &[nh], Vector, Init::Normal(1.0));
        self.add(n("attn_output_a"), &[group_in, ol], Q8Dense, ngi);
        self.add(n("attn_output_b"), &[ol, d], Q8Dense, nol);
    }

    /// The indexer's query projection and head weights.
    pub fn indexer_query(&mut self, p: &str) {
        let CoreShape {
            n_embd: d,
            q_lora_rank: ql,
            indexer_heads: ih,
            indexer_head_dim: ihd,
            ..
        } = self.dims;
        let (nql, nd) = (self.normal(ql), self.normal(d));
        self.add(
            format!("{p}indexer.attn_q_b.weight"),
            &[ql, ih * ihd],
            Class::F16Dense,
            nql,
        );
        self.add(
            format!("{p}indexer.proj.weight"),
            &[d, ih],
            Class::F16Dense,
            nd,
        );
    }

    /// The FFN norm and the router (`router` its class: F16 in V4, F32 in V4.1).
    pub fn router(&mut self, p: &str, router: Class) {
        let (d, e) = (self.dims.n_embd, self.dims.n_expert);
        self.add(
            format!("{p}ffn_norm.weight"),
            &[d],
            Class::Vector,
            Init::NormWeight,
        );
        let init = self.normal(d);
        self.add(format!("{p}ffn_gate_inp.weight"), &[d, e], router, init);
    }

    /// The routed experts' gate, up and down slabs.
    pub fn experts(&mut self, p: &str) {
        let CoreShape {
            n_embd: d,
            expert_ff: ff,
            n_expert: e,
            ..
        } = self.dims;
        let (nd, nff) = (self.normal(d), self.normal(ff));
        use Class::{ExpertDown, ExpertGateUp};
        self.add(
            format!("{p}ffn_gate_exps.weight"),
            &[d, ff, e],
            ExpertGateUp,
            nd,
        );
        self.add(
            format!("{p}ffn_up_exps.weight"),
            &[d, ff, e],
            ExpertGateUp,
            nd,
        );
        self.add(
            format!("{p}ffn_down_exps.weight"),
            &[ff, d, e],
            ExpertDown,
            nff,
        );
    }

    /// The shared expert's gate, up and down.
    pub fn shared_expert(&mut self, p: &str) {
        let CoreShape {
            n_embd: d,
            expert_ff: ff,
            ..
        } = self.dims;
        let (nd, nff) = (self.normal(d), self.normal(ff));
        self.add(
            format!("{p}ffn_gate_shexp.weight"),
            &[d, ff],
            Class::Q8Dense,
            nd,
        );
        self.add(
            format!("{p}ffn_up_shexp.weight"),
            &[d, ff],
            Class::Q8Dense,
            nd,
        );
        self.add(
            format!("{p}ffn_down_shexp.weight"),
            &[ff, d],
            Class::Q8Dense,
            nff,
        );
    }
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
        Init::EngramRows => Vec::new(),
    }
}

/// Random Engram rows: E4M3 codes of N(0, 4²) values (never NaN) and E8M0
/// scales 2⁻³…2⁰, so dequantised entries have a spread of magnitudes.
fn engram_rows(t: &Planned, seed: u64) -> Vec<u8> {
    let (row_bytes, rows) = (t.ne[0] as usize, t.ne[1] as usize);
    let head_dim = row_bytes * 32 / 33;
    let mut rng = Rng::for_name(seed, &t.name);
    let mut out = vec![0u8; row_bytes * rows];
    for row in out.chunks_exact_mut(row_bytes) {
        for c in &mut row[..head_dim] {
            *c = e4m3_encode((rng.normal() * 4.0) as f32);
        }
        for s in &mut row[head_dim..] {
            *s = 124 + rng.below(4) as u8;
        }
    }
    out
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

/// How [`write_planned`] fills the data region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Data {
    /// Seeded values, quantized: what the reference can reproduce.
    Values,
    /// Quantized tensors get random but valid blocks: quantizing gigabytes
    /// of Gaussians would take far longer than the benchmark.
    RandomBlocks,
    /// No data at all: a header over a hole.
    Hole,
}

impl Data {
    /// Seeded values, or random blocks for a bench model (`random_blocks`).
    pub fn values_or_random(random_blocks: bool) -> Data {
        if random_blocks {
            Data::RandomBlocks
        } else {
            Data::Values
        }
    }
}

/// Writes `w` (its metadata already added) to `path` with the planned
/// tensors in `variant`'s types; each is generated when the file is
/// written, one tensor in memory at a time.
pub(crate) fn write_planned(
    mut w: GgufWriter,
    plan: Vec<Planned>,
    variant: Variant,
    seed: u64,
    data: Data,
    path: &Path,
) -> io::Result<()> {
    for t in plan {
        let ty = variant.type_for(t.class);
        let ne = t.ne.clone();
        let name = t.name.clone();
        if data == Data::Hole {
            w.add_tensor_hole(&name, &ne, ty)?;
            continue;
        }
        let quantised = !matches!(
            ty,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::I32 | GgmlType::I8
        );
        let make: crate::gguf::writer::LazyData = if t.class == Class::EngramRows {
            Box::new(move || Ok(engram_rows(&t, seed)))
        } else if data == Data::RandomBlocks && quantised {
            Box::new(move || {
                let n = t.ne.iter().product::<u64>() as usize;
                Ok(random_blocks(ty, n, &mut Rng::for_name(seed, &t.name)))
            })
        } else {
            Box::new(move || encode_tensor(ty, t.ne[0] as usize, &fill(&t, seed)))
        };
        w.add_tensor_lazy(&name, &ne, ty, make)?;
    }
    w.write_to_path(path)
}
