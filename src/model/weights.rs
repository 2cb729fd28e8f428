//! Weights bound by name and validated against the configuration.
//!
//! Every required tensor must be present with exactly the shape the
//! configuration implies and a type the engine can compute with; errors name
//! the tensor, what was expected and what was found. Bound tensors are
//! [`TensorRef`]s (type, shape, absolute file extent), so backends can read or
//! upload them without holding a borrow of the file.

use crate::gguf::{GgufFile, TensorInfo, TensorRef};
use crate::quant::GgmlType;

use super::config::{AttentionKind, CoreConfig, ModelConfig};
use super::ModelError;

/// One line of a file's type mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeShare {
    pub ty: GgmlType,
    pub tensors: usize,
    pub bytes: u64,
}

/// Per type, how many of `tensors` and their bytes, largest share first.
pub(crate) fn type_mix_of(tensors: &[&TensorRef]) -> Vec<TypeShare> {
    let mut mix: Vec<TypeShare> = Vec::new();
    for t in tensors {
        match mix.iter_mut().find(|s| s.ty == t.ty) {
            Some(s) => {
                s.tensors += 1;
                s.bytes += t.n_bytes;
            }
            None => mix.push(TypeShare {
                ty: t.ty,
                tensors: 1,
                bytes: t.n_bytes,
            }),
        }
    }
    mix.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ty.id().cmp(&b.ty.id())));
    mix
}

/// The distinct (gate, up, down) type triples of per-layer routed experts,
/// with how many layers use each, in order of first use.
pub(crate) fn routed_types_of(
    layers: impl Iterator<Item = [GgmlType; 3]>,
) -> Vec<([GgmlType; 3], usize)> {
    let mut out: Vec<([GgmlType; 3], usize)> = Vec::new();
    for k in layers {
        match out.iter_mut().find(|(t, _)| *t == k) {
            Some((_, n)) => *n += 1,
            None => out.push((k, 1)),
        }
    }
    out
}

/// Which element types a tensor may have.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Class {
    /// Dense matrices: F32/F16/BF16/Q8_0.
    Dense,
    /// Routed expert slabs: F32/F16/Q8_0/Q2_K/Q4_K/IQ2_XXS/MXFP4 (MXFP4 only
    /// here: ds4f-mxfp4 stores nothing else in it, docs/QUANTS.md).
    Expert,
    /// Norms and small vectors: F32 (F16 accepted).
    Vector,
    /// Hash routing table.
    I32,
    /// Raw bytes (V4.1's Engram rows: 256 E4M3 codes + 8 E8M0 scales).
    I8,
}

impl Class {
    /// The types the loader binds a tensor of this class with.
    pub(crate) fn accepts(self) -> &'static [GgmlType] {
        use GgmlType::*;
        match self {
            Class::Dense => &[F32, F16, Bf16, Q8_0],
            Class::Expert => &[F32, F16, Q8_0, Q2K, Q4K, Iq2Xxs, Mxfp4],
            Class::Vector => &[F32, F16],
            Class::I32 => &[I32],
            Class::I8 => &[I8],
        }
    }
}

pub(crate) struct Binder<'f> {
    pub(crate) file: &'f GgufFile,
    /// Added to every offset: where `file` sits when it is attached to
    /// another ([`GgufFile::attach`]); 0 for a file read on its own.
    pub(crate) base: u64,
}

impl Binder<'_> {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.file.tensor_info(name)
    }

    pub(crate) fn bind(
        &self,
        name: &str,
        shape: &[usize],
        class: Class,
    ) -> Result<TensorRef, ModelError> {
        let info = self
            .info(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
        let ty = info.ty.ok_or_else(|| ModelError::BadType {
            name: name.into(),
            found: format!("unknown type id {}", info.type_id),
            accepted: names(class.accepts()),
        })?;
        let expected: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if info.ne != expected {
            return Err(ModelError::BadShape {
                name: name.into(),
                expected,
                found: info.ne.clone(),
            });
        }
        if !class.accepts().contains(&ty) {
            return Err(ModelError::BadType {
                name: name.into(),
                found: ty.name().into(),
                accepted: names(class.accepts()),
            });
        }
        let mut ne = [1u64; 4];
        for (d, &n) in info.ne.iter().enumerate().take(4) {
            ne[d] = n;
        }
        Ok(TensorRef {
            name: name.into(),
            ty,
            ne,
            offset: self.base + self.file.data_offset() + info.offset,
            n_bytes: info.n_bytes,
        })
    }

    pub(crate) fn bind_opt(
        &self,
        name: &str,
        shape: &[usize],
        class: Class,
    ) -> Result<Option<TensorRef>, ModelError> {
        match self.info(name) {
            None => Ok(None),
            Some(_) => self.bind(name, shape, class).map(Some),
        }
    }
}

fn names(ts: &[GgmlType]) -> String {
    ts.iter().map(|t| t.name()).collect::<Vec<_>>().join("/")
}

/// A compressor (attention or indexer): `ape` `[c, ratio]`, `kv`/`gate` `[D, c]`, norm `[hd]`.
#[derive(Clone, Debug)]
pub struct CompressorWeights {
    pub ape: TensorRef,
    pub kv: TensorRef,
    pub gate: TensorRef,
    pub norm: TensorRef,
    /// Output width of one projected row: `coff · hd`.
    pub width: usize,
    /// Row width after pooling.
    pub head_dim: usize,
    /// True for the two-series (overlapped) compressor of CSA layers.
    pub overlapped: bool,
}

#[derive(Clone, Debug)]
pub struct IndexerWeights {
    pub q_b: TensorRef,
    pub proj: TensorRef,
    pub compressor: CompressorWeights,
}

/// One sublayer's hyper-connection mix: `fn` `[n·D, (2+n)·n]`, `scale`
/// `[3]`, `base` `[(2+n)·n]` (MODEL.md §3.3).
#[derive(Clone, Debug)]
pub struct HcMixWeights {
    pub func: TensorRef,
    pub scale: TensorRef,
    pub base: TensorRef,
}

/// The attention projections both families have (MODEL.md §3.4): the
/// low-rank query, the one shared K=V row, the sinks and the grouped output.
#[derive(Clone, Debug)]
pub struct AttnWeights {
    pub norm: TensorRef,
    pub q_a: TensorRef,
    pub q_a_norm: TensorRef,
    pub q_b: TensorRef,
    pub kv: TensorRef,
    pub kv_norm: TensorRef,
    pub sinks: TensorRef,
    pub output_a: TensorRef,
    pub output_b: TensorRef,
}

/// The shared expert: gate, up, down.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    pub gate: TensorRef,
    pub up: TensorRef,
    pub down: TensorRef,
}

/// The MoE sublayer (MODEL.md §3.7–3.8): router, routed experts and the
/// optional parts (V4: hash routing on the first layers, no bias there;
/// V4.1: always a bias and a shared expert).
#[derive(Clone, Debug)]
pub struct MoeWeights {
    pub norm: TensorRef,
    pub gate_inp: TensorRef,
    pub bias: Option<TensorRef>,
    pub tid2eid: Option<TensorRef>,
    pub gate_exps: TensorRef,
    pub up_exps: TensorRef,
    pub down_exps: TensorRef,
    pub shared: Option<SharedExpert>,
}

impl MoeWeights {
    /// The routed experts: gate, up, down.
    pub fn routed(&self) -> [&TensorRef; 3] {
        [&self.gate_exps, &self.up_exps, &self.down_exps]
    }
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub kind: AttentionKind,
    pub hc_attn: HcMixWeights,
    pub attn: AttnWeights,
    pub compressor: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
    pub hc_ffn: HcMixWeights,
    pub ffn: MoeWeights,
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: TensorRef,
    pub output_hc_fn: TensorRef,
    pub output_hc_scale: TensorRef,
    pub output_hc_base: TensorRef,
    pub output_norm: TensorRef,
    pub output: TensorRef,
    pub layers: Vec<LayerWeights>,
}

/// The optional MTP draft block (a separate GGUF, GGUF.md §7).
#[derive(Clone, Debug)]
pub struct MtpWeights {
    pub hc_head_fn: TensorRef,
    pub hc_head_scale: TensorRef,
    pub hc_head_base: TensorRef,
    pub e_proj: TensorRef,
    pub h_proj: TensorRef,
    pub enorm: TensorRef,
    pub hnorm: TensorRef,
    pub norm: TensorRef,
    /// The block itself, a window-only top-k-routed layer.
    pub block: LayerWeights,
}

impl Weights {
    /// Binds and validates every tensor of the main model.
    pub fn bind(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, ModelError> {
        if file.tensor_info("blk.0.attn_norm.weight").is_none()
            && file.tensor_info("mtp.0.attn_norm.weight").is_some()
        {
            return Err(ModelError::WrongKind(
                "this is an MTP draft file (the optional speculative-decoding model), not a main model".into(),
            ));
        }
        let b = Binder { file, base: 0 };
        let d = cfg.n_embd;
        let hc_d = cfg.hc_count * d;
        let layers = (0..cfg.n_layer)
            .map(|l| bind_layer(&b, cfg, &format!("blk.{l}."), l, false))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights {
            token_embd: b.bind("token_embd.weight", &[d, cfg.n_vocab], Class::Dense)?,
            output_hc_fn: b.bind("output_hc_fn.weight", &[hc_d, cfg.hc_count], Class::Dense)?,
            output_hc_scale: b.bind("output_hc_scale.weight", &[1], Class::Vector)?,
            output_hc_base: b.bind("output_hc_base.weight", &[cfg.hc_count], Class::Vector)?,
            output_norm: b.bind("output_norm.weight", &[d], Class::Vector)?,
            output: b.bind("output.weight", &[d, cfg.n_vocab], Class::Dense)?,
            layers,
        })
    }

    /// Checks the hash-routing tables: every entry must name an expert.
    /// This reads tensor data (a few MB), so it runs when a session is
    /// created rather than at load, which stays data-free.
    pub fn check_tables(&self, file: &GgufFile, cfg: &ModelConfig) -> Result<(), ModelError> {
        for (l, lw) in self.layers.iter().enumerate() {
            let Some(t) = &lw.ffn.tid2eid else { continue };
            let bytes = t.bytes(file);
            if let Some((i, v)) = bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .enumerate()
                .find(|&(_, v)| v < 0 || v as usize >= cfg.n_expert)
            {
                return Err(ModelError::BadTensor {
                    name: t.name.clone(),
                    msg: format!(
                        "entry {i} (token {}, layer {l}) is expert {v}, outside 0..{}",
                        i / cfg.n_expert_used,
                        cfg.n_expert
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every bound tensor, globals first.
    pub fn all(&self) -> Vec<&TensorRef> {
        let mut v = vec![
            &self.token_embd,
            &self.output_hc_fn,
            &self.output_hc_scale,
            &self.output_hc_base,
            &self.output_norm,
            &self.output,
        ];
        for l in &self.layers {
            v.extend(l.all());
        }
        v
    }

    pub fn total_bytes(&self) -> u64 {
        self.all().iter().map(|t| t.n_bytes).sum()
    }

    /// The file's type mix over the bound tensors: per type, how many tensors
    /// and bytes, largest share first (what `ds4 --info` prints).
    pub fn type_mix(&self) -> Vec<TypeShare> {
        type_mix_of(&self.all())
    }

    /// The distinct (gate, up, down) type triples of the routed experts, with
    /// how many layers use each, in layer order of first use.
    pub fn routed_expert_types(&self) -> Vec<([GgmlType; 3], usize)> {
        routed_types_of(self.layers.iter().map(|l| l.ffn.routed().map(|t| t.ty)))
    }

    /// Bytes of weights read to produce one token at decode time: one
    /// embedding row, every dense tensor, the chosen experts' slabs, the head.
    pub fn active_bytes_per_token(&self, cfg: &ModelConfig) -> u64 {
        let mut total = self.token_embd.n_bytes / cfg.n_vocab as u64;
        total += self.output_hc_fn.n_bytes + self.output_hc_scale.n_bytes;
        total += self.output_hc_base.n_bytes + self.output_norm.n_bytes + self.output.n_bytes;
        for l in &self.layers {
            for t in l.all() {
                let is_routed = l.ffn.routed().iter().any(|e| std::ptr::eq(*e, t));
                let is_table = l.ffn.tid2eid.as_ref().is_some_and(|x| std::ptr::eq(x, t));
                if is_routed {
                    total += t.n_bytes / cfg.n_expert as u64 * cfg.n_expert_used as u64;
                } else if is_table {
                    total += (cfg.n_expert_used * 4) as u64;
                } else {
                    total += t.n_bytes;
                }
            }
        }
        total
    }
}

impl HcMixWeights {
    pub fn all(&self) -> [&TensorRef; 3] {
        [&self.func, &self.scale, &self.base]
    }
}

impl AttnWeights {
    pub fn all(&self) -> [&TensorRef; 9] {
        [
            &self.norm,
            &self.q_a,
            &self.q_a_norm,
            &self.q_b,
            &self.kv,
            &self.kv_norm,
            &self.sinks,
            &self.output_a,
            &self.output_b,
        ]
    }
}

impl MoeWeights {
    /// Norm, router, bias, hash table, routed experts, shared expert.
    pub fn all(&self) -> Vec<&TensorRef> {
        let mut v = vec![&self.norm, &self.gate_inp];
        v.extend(self.bias.iter());
        v.extend(self.tid2eid.iter());
        v.extend(self.routed());
        if let Some(s) = &self.shared {
            v.extend([&s.gate, &s.up, &s.down]);
        }
        v
    }
}

impl LayerWeights {
    pub fn all(&self) -> Vec<&TensorRef> {
        let mut v: Vec<&TensorRef> = self.hc_attn.all().into();
        v.extend(self.attn.all());
        for c in self
            .compressor
            .iter()
            .chain(self.indexer.as_ref().map(|i| &i.compressor))
        {
            v.extend([&c.ape, &c.kv, &c.gate, &c.norm]);
        }
        if let Some(i) = &self.indexer {
            v.extend([&i.q_b, &i.proj]);
        }
        v.extend(self.hc_ffn.all());
        v.extend(self.ffn.all());
        v
    }
}

/// Binds a sublayer's HC mix (`{p}{sub}_fn`, `_scale`, `_base`).
pub(crate) fn bind_hc_mix(
    b: &Binder<'_>,
    cfg: &CoreConfig,
    p: &str,
    sub: &str,
) -> Result<HcMixWeights, ModelError> {
    let (hc_d, mix) = (cfg.hc_count * cfg.n_embd, cfg.hc_mix_dim());
    Ok(HcMixWeights {
        func: b.bind(
            &format!("{p}hc_{sub}_fn.weight"),
            &[hc_d, mix],
            Class::Dense,
        )?,
        scale: b.bind(&format!("{p}hc_{sub}_scale.weight"), &[3], Class::Vector)?,
        base: b.bind(&format!("{p}hc_{sub}_base.weight"), &[mix], Class::Vector)?,
    })
}

/// Binds the attention projections of layer prefix `p`.
pub(crate) fn bind_attn(
    b: &Binder<'_>,
    cfg: &CoreConfig,
    p: &str,
) -> Result<AttnWeights, ModelError> {
    let n = |s: &str| format!("{p}{s}");
    let (d, hd, ql) = (cfg.n_embd, cfg.head_dim, cfg.q_lora_rank);
    let ol = cfg.o_groups * cfg.o_lora_rank;
    Ok(AttnWeights {
        norm: b.bind(&n("attn_norm.weight"), &[d], Class::Vector)?,
        q_a: b.bind(&n("attn_q_a.weight"), &[d, ql], Class::Dense)?,
        q_a_norm: b.bind(&n("attn_q_a_norm.weight"), &[ql], Class::Vector)?,
        q_b: b.bind(&n("attn_q_b.weight"), &[ql, cfg.q_dim()], Class::Dense)?,
        kv: b.bind(&n("attn_kv.weight"), &[d, hd], Class::Dense)?,
        kv_norm: b.bind(&n("attn_kv_a_norm.weight"), &[hd], Class::Vector)?,
        sinks: b.bind(&n("attn_sinks.weight"), &[cfg.n_head], Class::Vector)?,
        output_a: b.bind(
            &n("attn_output_a.weight"),
            &[cfg.heads_per_group() * hd, ol],
            Class::Dense,
        )?,
        output_b: b.bind(&n("attn_output_b.weight"), &[ol, d], Class::Dense)?,
    })
}

/// Binds the MoE sublayer of layer prefix `p`: the router bias and hash
/// table as given (bound by the family, which knows when they exist), the
/// shared expert when `shared`.
pub(crate) fn bind_moe(
    b: &Binder<'_>,
    cfg: &CoreConfig,
    p: &str,
    bias: Option<TensorRef>,
    tid2eid: Option<TensorRef>,
    shared: bool,
) -> Result<MoeWeights, ModelError> {
    let n = |s: &str| format!("{p}{s}");
    let (d, e, ff) = (cfg.n_embd, cfg.n_expert, cfg.expert_ff);
    let norm = b.bind(&n("ffn_norm.weight"), &[d], Class::Vector)?;
    let gate_inp = b.bind(&n("ffn_gate_inp.weight"), &[d, e], Class::Dense)?;
    let gate_exps = b.bind(&n("ffn_gate_exps.weight"), &[d, ff, e], Class::Expert)?;
    let up_exps = b.bind(&n("ffn_up_exps.weight"), &[d, ff, e], Class::Expert)?;
    let down_exps = b.bind(&n("ffn_down_exps.weight"), &[ff, d, e], Class::Expert)?;
    let shared = if shared {
        Some(SharedExpert {
            gate: b.bind(&n("ffn_gate_shexp.weight"), &[d, ff], Class::Dense)?,
            up: b.bind(&n("ffn_up_shexp.weight"), &[d, ff], Class::Dense)?,
            down: b.bind(&n("ffn_down_shexp.weight"), &[ff, d], Class::Dense)?,
        })
    } else {
        None
    };
    Ok(MoeWeights {
        norm,
        gate_inp,
        bias,
        tid2eid,
        gate_exps,
        up_exps,
        down_exps,
        shared,
    })
}

fn bind_compressor(
    b: &Binder<'_>,
    cfg: &ModelConfig,
    prefix: &str,
    ratio: usize,
    head_dim: usize,
    overlapped: bool,
) -> Result<CompressorWeights, ModelError> {
    let d = cfg.n_embd;
    let width = if overlapped { 2 * head_dim } else { head_dim };
    Ok(CompressorWeights {
        ape: b.bind(
            &format!("{prefix}ape.weight"),
            &[width, ratio],
            Class::Dense,
        )?,
        kv: b.bind(&format!("{prefix}kv.weight"), &[d, width], Class::Dense)?,
        gate: b.bind(&format!("{prefix}gate.weight"), &[d, width], Class::Dense)?,
        norm: b.bind(&format!("{prefix}norm.weight"), &[head_dim], Class::Vector)?,
        width,
        head_dim,
        overlapped,
    })
}

pub(crate) fn bind_layer(
    b: &Binder<'_>,
    cfg: &ModelConfig,
    p: &str,
    l: usize,
    mtp: bool,
) -> Result<LayerWeights, ModelError> {
    let d = cfg.n_embd;
    let hd = cfg.head_dim;
    let ratio = if mtp { 0 } else { cfg.compress_ratios[l] };
    let n = |s: &str| format!("{p}{s}");

    // CSA vs HCA is not in the metadata: a compressed layer with indexer
    // tensors is CSA (overlapped compressor + indexer), otherwise HCA. Flash
    // ties this to ratio 4, but transformers lets both rates be configured.
    let has_indexer = b.info(&n("indexer.attn_q_b.weight")).is_some();
    let kind = match ratio {
        0 => AttentionKind::Window,
        r if has_indexer => AttentionKind::Csa { ratio: r },
        r => AttentionKind::Hca { ratio: r },
    };
    if ratio == 0 {
        for extra in ["attn_compressor_kv.weight", "indexer.attn_q_b.weight"] {
            if b.info(&n(extra)).is_some() {
                return Err(ModelError::Inconsistent(format!(
                    "{} is present but compress_ratios[{l}] is 0",
                    n(extra)
                )));
            }
        }
    }
    let (compressor, indexer) = match kind {
        AttentionKind::Window => (None, None),
        AttentionKind::Hca { ratio } => (
            Some(bind_compressor(
                b,
                cfg,
                &n("attn_compressor_"),
                ratio,
                hd,
                false,
            )?),
            None,
        ),
        AttentionKind::Csa { ratio } => {
            let ihd = cfg.indexer_head_dim;
            let ih = cfg.indexer_heads;
            if ih == 0 {
                return Err(ModelError::Inconsistent(format!(
                    "layer {l} has indexer tensors but attention.indexer.head_count is 0"
                )));
            }
            (
                Some(bind_compressor(
                    b,
                    cfg,
                    &n("attn_compressor_"),
                    ratio,
                    hd,
                    true,
                )?),
                Some(IndexerWeights {
                    q_b: b.bind(
                        &n("indexer.attn_q_b.weight"),
                        &[cfg.q_lora_rank, ih * ihd],
                        Class::Dense,
                    )?,
                    proj: b.bind(&n("indexer.proj.weight"), &[d, ih], Class::Dense)?,
                    compressor: bind_compressor(
                        b,
                        cfg,
                        &n("indexer_compressor_"),
                        ratio,
                        ihd,
                        true,
                    )?,
                }),
            )
        }
    };

    let hash = !mtp && cfg.is_hash_layer(l);
    let tid2eid = if hash {
        Some(b.bind(
            &n("ffn_gate_tid2eid.weight"),
            &[cfg.n_expert_used, cfg.n_vocab],
            Class::I32,
        )?)
    } else {
        None
    };
    let e = cfg.n_expert;
    let bias = if mtp {
        Some(b.bind(&n("exp_probs_b.bias"), &[e], Class::Vector)?)
    } else {
        b.bind_opt(&n("exp_probs_b.bias"), &[e], Class::Vector)?
    };
    Ok(LayerWeights {
        kind,
        hc_attn: bind_hc_mix(b, cfg, p, "attn")?,
        attn: bind_attn(b, cfg, p)?,
        compressor,
        indexer,
        hc_ffn: bind_hc_mix(b, cfg, p, "ffn")?,
        ffn: bind_moe(b, cfg, p, bias, tid2eid, cfg.n_expert_shared > 0)?,
    })
}

impl MtpWeights {
    /// Binds the MTP block of a separate file, with shapes from the main
    /// model's configuration (the MTP file carries no metadata ds4 reads).
    /// `base`: where the file is attached to the main one
    /// ([`GgufFile::attach`]; 0 to read it on its own).
    pub fn bind(file: &GgufFile, cfg: &ModelConfig, base: u64) -> Result<MtpWeights, ModelError> {
        if file.tensor_info("mtp.0.attn_norm.weight").is_none() {
            return Err(ModelError::WrongKind(
                "no mtp.0.* tensors: not an MTP draft file".into(),
            ));
        }
        let b = Binder { file, base };
        let d = cfg.n_embd;
        let hc_d = cfg.hc_count * d;
        Ok(MtpWeights {
            hc_head_fn: b.bind(
                "mtp.0.hc_head_fn.weight",
                &[hc_d, cfg.hc_count],
                Class::Dense,
            )?,
            hc_head_scale: b.bind("mtp.0.hc_head_scale.weight", &[1], Class::Vector)?,
            hc_head_base: b.bind("mtp.0.hc_head_base.weight", &[cfg.hc_count], Class::Vector)?,
            e_proj: b.bind("mtp.0.e_proj.weight", &[d, d], Class::Dense)?,
            h_proj: b.bind("mtp.0.h_proj.weight", &[d, d], Class::Dense)?,
            enorm: b.bind("mtp.0.enorm.weight", &[d], Class::Vector)?,
            hnorm: b.bind("mtp.0.hnorm.weight", &[d], Class::Vector)?,
            norm: b.bind("mtp.0.norm.weight", &[d], Class::Vector)?,
            block: bind_layer(&b, cfg, "mtp.0.", 0, true)?,
        })
    }
}
