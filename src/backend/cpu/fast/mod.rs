//! The fast CPU backend's kernels: the reference backend's op loop with the
//! matrix products (dense matmuls and routed experts) replaced by integer
//! SIMD dot products against the weights as stored.
//!
//! Activations are quantised per block ([`act`]); each weight format has a
//! dot product against its activation format, in a portable version
//! ([`portable`]) and, where the CPU has them, SIMD versions (`avx2`,
//! `avx512` on x86-64, `neon` on AArch64). The path is picked at run time
//! ([`Isa::detect`]) or forced ([`Isa::choose`],
//! `DS4_CPU_ISA=portable|avx2|avx512|neon`). Attention and the indexer have
//! fast twins ([`attention`], [`indexer`]); everything else (norms,
//! compressors, hyper-connections) runs the reference twins in
//! `crate::graph::ops`.

pub mod act;
pub mod attention;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod expand;
pub mod gemm;
pub mod indexer;
pub mod ktile;
pub mod matmul;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod portable;
pub mod rows;
pub mod tiled;

use crate::graph::Segment;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::GgmlType;
use act::{ActKind, BlockQ8x32};

/// An instruction-set path of the fast kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (+ AVX2/FMA/F16C); `vpdpbusd` where the CPU
    /// has AVX512-VNNI (the prefill GEMM's avx512 tile needs it, see
    /// [`gemm::path`]).
    Avx512,
    /// AArch64 NEON; `sdot` where the CPU has the dotprod extension.
    Neon,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        match s {
            "portable" | "scalar" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon => false,
        }
    }

    /// Every path this CPU can run, the portable one first.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The best path this CPU can run.
    pub fn detect() -> Isa {
        *Isa::available().last().unwrap_or(&Isa::Portable)
    }

    /// The path `name` names (`DS4_CPU_ISA`, [`BackendOptions::cpu_isa`];
    /// an error names an unknown or unsupported path), else the best path.
    ///
    /// [`BackendOptions::cpu_isa`]: crate::backend::BackendOptions::cpu_isa
    pub fn choose(name: Option<&str>) -> Result<Isa, String> {
        match name {
            Some(v) if v != "auto" && !v.is_empty() => {
                let isa = Isa::parse(v).ok_or_else(|| {
                    format!("DS4_CPU_ISA={v:?} is unknown (auto, portable, avx2, avx512, neon)")
                })?;
                if !isa.supported() {
                    return Err(format!("DS4_CPU_ISA={v}: this CPU lacks the features"));
                }
                Ok(isa)
            }
            _ => Ok(Isa::detect()),
        }
    }
}

/// Token count from which a matrix product decodes each 2/4-bit weight row
/// once and reuses it for every token ([`expand`]).
pub const PREFILL_TOKENS: usize = 4;

type DotK = fn(&[u8], &[BlockQ8K]) -> f32;
type Dot32 = fn(&[u8], &[BlockQ8x32]) -> f32;
type DotF = fn(&[u8], &[f32]) -> f32;
type DotE = fn(&[i8], &[f32], &[BlockQ8x32]) -> f32;
/// One weight row against several activation rows (`out[j]` = the row's
/// 1-row dot with `ys[j]`, bit for bit).
type Many32 = fn(&[u8], &[&[BlockQ8x32]], &mut [f32]);
type ManyK = fn(&[u8], &[&[BlockQ8K]], &mut [f32]);

/// Activation rows one multi-row dot call takes at most
/// ([`Kernels::dot_many`]).
pub const MANY_MAX: usize = 16;

/// The dot products of one path, one per weight format.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub isa: Isa,
    q2k: DotK,
    q4k: DotK,
    iq2xxs: DotK,
    q8_0: Dot32,
    mxfp4: Dot32,
    f32: DotF,
    f16: DotF,
    bf16: DotF,
    /// The multi-row Q8_0 kernel where the path has one (AVX-512, AVX2);
    /// the 1-row kernel per activation row otherwise.
    q8_0_many: Option<Many32>,
    /// The same for IQ2_XXS and Q2_K rows (the q2 mix's routed experts).
    iq2xxs_many: Option<ManyK>,
    q2k_many: Option<ManyK>,
    /// Expanded rows (prefill path of the 2/4-bit formats, [`expand`]).
    pub expanded: DotE,
    /// `y += a·x`.
    pub axpy: fn(f32, &[f32], &mut [f32]),
}

/// Safe wrappers over one SIMD variant's kernels (AVX-512, NEON); only
/// reachable through [`Kernels::new`], [`Kernels::avx512`] or
/// [`Kernels::neon`] after the features were detected.
#[allow(unused_macros)]
macro_rules! simd_safe {
    ($name:ident, $m:path, $isa:expr) => {
        mod $name {
            use super::*;
            use $m as k;
            pub fn q2k(r: &[u8], y: &[BlockQ8K]) -> f32 {
                unsafe { k::q2k(r, y) }
            }
            pub fn q4k(r: &[u8], y: &[BlockQ8K]) -> f32 {
                unsafe { k::q4k(r, y) }
            }
            pub fn iq2xxs(r: &[u8], y: &[BlockQ8K]) -> f32 {
                unsafe { k::iq2xxs(r, y) }
            }
            pub fn q8_0(r: &[u8], y: &[BlockQ8x32]) -> f32 {
                unsafe { k::q8_0(r, y) }
            }
            pub fn mxfp4(r: &[u8], y: &[BlockQ8x32]) -> f32 {
                unsafe { k::mxfp4(r, y) }
            }
            pub fn f32(r: &[u8], x: &[f32]) -> f32 {
                unsafe { k::f32(r, x) }
            }
            pub fn f16(r: &[u8], x: &[f32]) -> f32 {
                unsafe { k::f16(r, x) }
            }
            pub fn bf16(r: &[u8], x: &[f32]) -> f32 {
                unsafe { k::bf16(r, x) }
            }
            pub fn expanded(c: &[i8], s: &[f32], y: &[BlockQ8x32]) -> f32 {
                unsafe { k::expanded(c, s, y) }
            }
            pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
                unsafe { k::axpy(a, x, y) }
            }
            pub fn kernels() -> Kernels {
                Kernels {
                    isa: $isa,
                    q2k,
                    q4k,
                    iq2xxs,
                    q8_0,
                    mxfp4,
                    f32,
                    f16,
                    bf16,
                    q8_0_many: None,
                    iq2xxs_many: None,
                    q2k_many: None,
                    expanded,
                    axpy,
                }
            }
        }
    };
}
/// Safe wrappers over one SIMD variant's multi-row kernels (AVX2,
/// AVX-512), with the same reach as [`simd_safe`]'s.
#[allow(unused_macros)]
macro_rules! many_safe {
    ($name:ident, $m:path) => {
        mod $name {
            use super::*;
            use $m as k;
            pub fn q8_0(r: &[u8], ys: &[&[BlockQ8x32]], out: &mut [f32]) {
                unsafe { k::q8_0_many(r, ys, out) }
            }
            pub fn iq2xxs(r: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
                unsafe { k::iq2xxs_many(r, ys, out) }
            }
            pub fn q2k(r: &[u8], ys: &[&[BlockQ8K]], out: &mut [f32]) {
                unsafe { k::q2k_many(r, ys, out) }
            }
            /// `kern` with these multi-row kernels.
            pub fn with(mut kern: Kernels) -> Kernels {
                kern.q8_0_many = Some(q8_0);
                kern.iq2xxs_many = Some(iq2xxs);
                kern.q2k_many = Some(q2k);
                kern
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
simd_safe!(avx2_safe, super::avx2, Isa::Avx2);
#[cfg(target_arch = "x86_64")]
many_safe!(avx2_many, super::avx2);
#[cfg(target_arch = "x86_64")]
simd_safe!(avx512_vnni_safe, super::avx512::vnni, Isa::Avx512);
#[cfg(target_arch = "x86_64")]
many_safe!(avx512_vnni_many, super::avx512::vnni);
#[cfg(target_arch = "x86_64")]
many_safe!(avx512_bw_many, super::avx512::bw);
#[cfg(target_arch = "x86_64")]
simd_safe!(avx512_bw_safe, super::avx512::bw, Isa::Avx512);
#[cfg(target_arch = "aarch64")]
simd_safe!(neon_dotprod_safe, super::neon::dotprod, Isa::Neon);
#[cfg(target_arch = "aarch64")]
simd_safe!(neon_plain_safe, super::neon::plain, Isa::Neon);

impl Kernels {
    /// The AVX-512 kernels, with `vpdpbusd` if `vnni` (else the BW
    /// route); `None` if this CPU cannot run them. [`Kernels::new`] picks
    /// VNNI when the CPU has it; tests run both.
    pub fn avx512(vnni: bool) -> Option<Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            if !Isa::Avx512.supported() {
                return None;
            }
            if !vnni {
                return Some(avx512_bw_many::with(avx512_bw_safe::kernels()));
            }
            if is_x86_feature_detected!("avx512vnni") {
                return Some(avx512_vnni_many::with(avx512_vnni_safe::kernels()));
            }
            None
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = vnni;
            None
        }
    }

    /// The NEON kernels, with `sdot` if `dotprod` (else plain NEON);
    /// `None` if this CPU cannot run them. [`Kernels::new`] picks dotprod
    /// when the CPU has it; tests run both.
    pub fn neon(dotprod: bool) -> Option<Kernels> {
        #[cfg(target_arch = "aarch64")]
        {
            if !Isa::Neon.supported() {
                return None;
            }
            if !dotprod {
                return Some(neon_plain_safe::kernels());
            }
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                return Some(neon_dotprod_safe::kernels());
            }
            None
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            let _ = dotprod;
            None
        }
    }

    /// The kernels of `isa`; `None` if this CPU cannot run it.
    pub fn new(isa: Isa) -> Option<Kernels> {
        if !isa.supported() {
            return None;
        }
        Some(match isa {
            Isa::Portable => Kernels {
                isa,
                q2k: portable::q2k,
                q4k: portable::q4k,
                iq2xxs: portable::iq2xxs,
                q8_0: portable::q8_0,
                mxfp4: portable::mxfp4,
                f32: portable::f32,
                f16: portable::f16,
                bf16: portable::bf16,
                q8_0_many: None,
                iq2xxs_many: None,
                q2k_many: None,
                expanded: expand::dot_portable,
                axpy: portable::axpy,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2_many::with(avx2_safe::kernels()),
            Isa::Avx512 => {
                return Kernels::avx512(true).or_else(|| Kernels::avx512(false));
            }
            Isa::Neon => return Kernels::neon(true).or_else(|| Kernels::neon(false)),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 => return None,
        })
    }

    /// The activation format `ty` reads, or `None` for a format these
    /// kernels do not cover (the caller falls back to the reference).
    pub fn act_kind(ty: GgmlType) -> Option<ActKind> {
        Kernels::act_kind_on(None, ty, 1)
    }

    /// The activation format for `n_tokens` rows at once: from
    /// [`PREFILL_TOKENS`] tokens on, the 2/4-bit formats take Q8x32 and the
    /// expanded-row path ([`expand`]), except where [`ktile`] handles the
    /// format (IQ2_XXS and Q2_K on AVX2): those keep Q8_K, and the tiles give
    /// the 1-row kernel's values.
    pub fn act_kind_for(&self, ty: GgmlType, n_tokens: usize) -> Option<ActKind> {
        Kernels::act_kind_on(Some(self.isa), ty, n_tokens)
    }

    /// [`Kernels::act_kind_for`] on the path `isa` (`None`: a 1-token
    /// product, which is the same on every path).
    fn act_kind_on(isa: Option<Isa>, ty: GgmlType, n_tokens: usize) -> Option<ActKind> {
        use GgmlType::*;
        if n_tokens >= PREFILL_TOKENS && isa.is_some_and(|isa| ktile::handles(isa, ty)) {
            return Some(ActKind::Q8K);
        }
        if n_tokens >= PREFILL_TOKENS && expand::expandable(ty) {
            return Some(ActKind::Q8x32);
        }
        match ty {
            Q2K | Q4K | Iq2Xxs => Some(ActKind::Q8K),
            Q8_0 | Mxfp4 => Some(ActKind::Q8x32),
            F32 | F16 | Bf16 => Some(ActKind::F32),
            _ => None,
        }
    }

    /// An f32 dot product (`w` holds f32 values as bytes).
    #[inline]
    pub fn dot_f32(&self, w: &[u8], x: &[f32]) -> f32 {
        (self.f32)(w, x)
    }

    /// One dot product of a weight row of `ty` with activation row `r`.
    #[inline]
    pub fn dot(&self, ty: GgmlType, w: &[u8], acts: &act::Acts, r: usize) -> f32 {
        use act::Acts;
        match acts {
            Acts::Q8K { blocks, per_row } => {
                let y = &blocks[r * per_row..(r + 1) * per_row];
                match ty {
                    GgmlType::Q2K => (self.q2k)(w, y),
                    GgmlType::Q4K => (self.q4k)(w, y),
                    _ => (self.iq2xxs)(w, y),
                }
            }
            Acts::Q8x32 { blocks, per_row } => {
                let y = &blocks[r * per_row..(r + 1) * per_row];
                match ty {
                    GgmlType::Q8_0 => (self.q8_0)(w, y),
                    GgmlType::Mxfp4 => (self.mxfp4)(w, y),
                    _ => unreachable!("{ty} rows meet Q8x32 only through expanded rows"),
                }
            }
            Acts::F32 { values, per_row } => {
                let x = &values[r * per_row..(r + 1) * per_row];
                match ty {
                    GgmlType::F16 => (self.f16)(w, x),
                    GgmlType::Bf16 => (self.bf16)(w, x),
                    _ => (self.f32)(w, x),
                }
            }
        }
    }
}

/// Activation rows `rows` (at most [`MANY_MAX`]) picked once as the slices
/// a multi-row kernel reads, so that a product over many weight rows builds
/// them once per token group rather than once per weight row (it showed as
/// 2–3 % of an 8-session decode step).
pub struct Picked<'a> {
    acts: &'a act::Acts<'a>,
    rows: [usize; MANY_MAX],
    m: usize,
    blocks: PickedBlocks<'a>,
}

enum PickedBlocks<'a> {
    Q8x32([&'a [BlockQ8x32]; MANY_MAX]),
    Q8K([&'a [BlockQ8K]; MANY_MAX]),
    /// f32 activations: no multi-row kernel reads them.
    None,
}

impl<'a> Picked<'a> {
    pub fn new(acts: &'a act::Acts<'a>, rows: &[usize]) -> Picked<'a> {
        use act::Acts;
        assert!(
            rows.len() <= MANY_MAX,
            "at most MANY_MAX rows per multi-row dot"
        );
        fn pick<'a, B>(blocks: &'a [B], per_row: usize, rows: &[usize]) -> [&'a [B]; MANY_MAX] {
            let mut ys: [&[B]; MANY_MAX] = [&[]; MANY_MAX];
            for (y, &r) in ys.iter_mut().zip(rows) {
                *y = &blocks[r * per_row..(r + 1) * per_row];
            }
            ys
        }
        // One row takes the 1-row dot, which reads `acts` itself.
        let blocks = match acts {
            _ if rows.len() < 2 => PickedBlocks::None,
            Acts::Q8x32 { blocks, per_row } => PickedBlocks::Q8x32(pick(blocks, *per_row, rows)),
            Acts::Q8K { blocks, per_row } => PickedBlocks::Q8K(pick(blocks, *per_row, rows)),
            Acts::F32 { .. } => PickedBlocks::None,
        };
        let mut all = [0; MANY_MAX];
        all[..rows.len()].copy_from_slice(rows);
        Picked {
            acts,
            rows: all,
            m: rows.len(),
            blocks,
        }
    }

    /// The activation rows, in order.
    pub fn rows(&self) -> &[usize] {
        &self.rows[..self.m]
    }
}

impl Kernels {
    /// [`Kernels::dot`] of one weight row with activation rows `rows` (at
    /// most [`MANY_MAX`]): `out[j] = self.dot(ty, w, acts, rows[j])` bit for
    /// bit, through a multi-row kernel (the weight row decoded once for all
    /// of them) where the path has one for `ty`.
    pub fn dot_many(
        &self,
        ty: GgmlType,
        w: &[u8],
        acts: &act::Acts,
        rows: &[usize],
        out: &mut [f32],
    ) {
        self.dot_picked(ty, w, &Picked::new(acts, rows), out)
    }

    /// [`Kernels::dot_many`] over activation rows picked beforehand.
    pub fn dot_picked(&self, ty: GgmlType, w: &[u8], p: &Picked<'_>, out: &mut [f32]) {
        debug_assert_eq!(out.len(), p.m);
        if p.m > 1 {
            let many = match (&p.blocks, ty) {
                (PickedBlocks::Q8x32(ys), GgmlType::Q8_0) => {
                    self.q8_0_many.map(|many| many(w, &ys[..p.m], out))
                }
                (PickedBlocks::Q8K(ys), GgmlType::Iq2Xxs) => {
                    self.iq2xxs_many.map(|many| many(w, &ys[..p.m], out))
                }
                (PickedBlocks::Q8K(ys), GgmlType::Q2K) => {
                    self.q2k_many.map(|many| many(w, &ys[..p.m], out))
                }
                _ => None,
            };
            if many.is_some() {
                return;
            }
        }
        for (o, &r) in out.iter_mut().zip(p.rows()) {
            *o = self.dot(ty, w, p.acts, r);
        }
    }
}

impl Kernels {
    /// Runs `op` with these kernels when they override it (dense matmuls
    /// and routed experts in a format they handle, attention, the indexer)
    /// and says whether they did; the caller runs the reference twin
    /// otherwise.
    pub fn try_op(&self, op: &crate::graph::ops::Op, cx: &mut crate::graph::ops::CpuCx) -> bool {
        use crate::graph::ops::Op;
        let (pos0, n) = (cx.p.pos0, cx.n());
        // A graph of decode paths runs every row as a one-row piece
        // (`Graph::decode_paths`): the products pick their path per piece.
        let pieces = |cx: &crate::graph::ops::CpuCx| -> Vec<Segment> {
            if cx.graph.decode_paths {
                one_row_pieces(cx.segments())
            } else {
                cx.segments().to_vec()
            }
        };
        match op {
            // Token-indexed products over a step of several session pieces
            // pick their path per piece (`matmul::wide`).
            Op::MatMul(o) if o.rows.fixed_only().is_none() && o.rows.per_token == 1 => {
                cx.write(o.out, |cx, out| {
                    matmul::matmul_segments(
                        self,
                        o.w.ty,
                        o.w.bytes(cx.file),
                        o.in_dim(),
                        o.out_dim(),
                        o.groups,
                        cx.get(o.x),
                        &pieces(cx),
                        out,
                    )
                })
            }
            // Fixed rows: only the head over each session's last row
            // (`TakeLast`, `GatherLast`), one session per row.
            Op::MatMul(o) => {
                let rows = o.rows.at(n);
                cx.write(o.out, |cx, out| {
                    matmul::matmul_rows_apart(
                        self,
                        o.w.ty,
                        o.w.bytes(cx.file),
                        o.in_dim(),
                        o.out_dim(),
                        o.groups,
                        cx.get(o.x),
                        rows,
                        out,
                    )
                })
            }
            Op::MoeExperts(o) => cx.write(o.out, |cx, out| {
                let (x, sel, w) = (cx.get(o.x), cx.get_i32(o.selected), cx.get(o.weights));
                matmul::moe_experts_segments(
                    self,
                    o,
                    cx.expert_source(),
                    x,
                    sel,
                    w,
                    &pieces(cx),
                    out,
                )
            }),
            Op::RmsNorm(o) => {
                let len = o.rows.at(n) * o.dim;
                let w = o
                    .weight
                    .as_ref()
                    .map(|t| crate::graph::ops::load_f32(cx.file, t));
                cx.write(o.out, |cx, out| {
                    rows::rms_norm(o, w.as_deref(), &cx.get(o.x)[..len], &mut out[..len]);
                    true
                })
            }
            Op::Rope(o) => cx.write(o.out, |cx, out| {
                rows::rope(o, cx.get(o.x), pos0, n, out);
                true
            }),
            Op::Attention(o) => cx.write(o.out, |cx, out| {
                attention::attention(self, o, cx.file, o.inputs(cx), pos0, n, out);
                true
            }),
            Op::IndexerTopK(o) => cx.write_i32(o.out, |cx, out| {
                let (q, w, rows) = (cx.get(o.q), cx.get(o.weights), cx.state(o.rows));
                indexer::topk(self, o, q, w, rows, pos0, n, out);
                true
            }),
            _ => false,
        }
    }
}

/// Every row of `segs` as a piece of its own (same position and state).
fn one_row_pieces(segs: &[Segment]) -> Vec<Segment> {
    segs.iter()
        .flat_map(|s| {
            (0..s.n).map(move |i| Segment {
                row0: s.row0 + i,
                n: 1,
                pos0: s.pos0 + i,
                state: s.state,
            })
        })
        .collect()
}
