//! The kernel list: every kernel family and its entry points, once, read by
//! the WGSL loader (`wgpu/shaders.rs`), the CUDA loader (`cuda/kernels.rs`)
//! and the CUDA emulator of the tests (tests/cuda_emu).
//!
//! A [`Family`] is one file stem: `shaders/<stem>.wgsl` and `cuda/<stem>.cu`
//! hold the same kernels, and `backend/{wgpu,cuda}/launch/<stem>.rs` record
//! their dispatches. An [`Entry`] is one kernel of a family, named alike in
//! both languages; where one op runs one kernel, the entry bears the op's
//! name ([`crate::graph::ops::Op::name`]). Call sites name an [`Entry`],
//! never a string.
//!
//! The helpers a family's source needs (shared pieces prepended to it) are
//! listed here per language; each loader holds the helper texts.

/// Which languages have a kernel for an entry, and how CUDA names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Langs {
    /// One kernel of the entry's name in both languages.
    Both,
    /// Both; CUDA compiles one kernel per weight type (`<name>_<type>`, see
    /// `cuda::kernels::TYPE_SUFFIXES`), WGSL one kernel that takes the type
    /// as a parameter or a pipeline constant.
    BothTypedInCuda,
    /// CUDA only, one kernel per weight type.
    CudaTyped,
    /// CUDA only.
    Cuda,
    /// WGSL only.
    Wgsl,
}

/// A kernel language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lang {
    Wgsl,
    Cuda,
}

impl Langs {
    /// Whether `lang` has a kernel for the entry.
    pub fn has(self, lang: Lang) -> bool {
        match lang {
            Lang::Wgsl => matches!(self, Langs::Both | Langs::BothTypedInCuda | Langs::Wgsl),
            Lang::Cuda => !matches!(self, Langs::Wgsl),
        }
    }

    /// Whether CUDA compiles one kernel per weight type.
    pub fn typed_in_cuda(self) -> bool {
        matches!(self, Langs::BothTypedInCuda | Langs::CudaTyped)
    }
}

macro_rules! kernel_list {
    ($(
        $(#[$fdoc:meta])*
        $fam:ident = $stem:literal, wgsl [$($wh:literal),*], cuda [$($ch:literal),*] {
            $( $(#[$edoc:meta])* $entry:ident = $name:literal $langs:ident, )*
        }
    )*) => {
        /// A kernel family: `shaders/<stem>.wgsl` and `cuda/<stem>.cu`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Family { $( $(#[$fdoc])* $fam, )* }

        /// One kernel of a family (see the module docs).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Entry { $( $( $(#[$edoc])* $entry, )* )* }

        impl Family {
            /// Every family, in the order the loaders list them.
            pub const ALL: &'static [Family] = &[$(Family::$fam),*];

            /// The file stem.
            pub fn stem(self) -> &'static str {
                match self { $(Family::$fam => $stem,)* }
            }

            /// The entries of the family (both languages).
            pub fn entries(self) -> &'static [Entry] {
                match self { $(Family::$fam => &[$(Entry::$entry),*],)* }
            }

            /// Helpers prepended to the WGSL source, by name (in the
            /// loader's order, not this list's).
            pub fn wgsl_helpers(self) -> &'static [&'static str] {
                match self { $(Family::$fam => &[$($wh),*],)* }
            }

            /// Helpers prepended to the CUDA source, by name.
            pub fn cuda_helpers(self) -> &'static [&'static str] {
                match self { $(Family::$fam => &[$($ch),*],)* }
            }

            /// `shaders/<stem>.wgsl` as written.
            pub fn wgsl_source(self) -> &'static str {
                match self {
                    $(Family::$fam => include_str!(concat!("../../shaders/", $stem, ".wgsl")),)*
                }
            }

            /// `cuda/<stem>.cu` as written.
            pub fn cuda_source(self) -> &'static str {
                match self {
                    $(Family::$fam => include_str!(concat!("../../cuda/", $stem, ".cu")),)*
                }
            }
        }

        impl Entry {
            /// Every entry, family by family.
            pub const ALL: &'static [Entry] = &[$($(Entry::$entry,)*)*];

            /// The kernel's name in both languages (CUDA's per-type kernels
            /// add `_<type>`).
            pub fn name(self) -> &'static str {
                match self { $($(Entry::$entry => $name,)*)* }
            }

            pub fn family(self) -> Family {
                match self { $($(Entry::$entry => Family::$fam,)*)* }
            }

            /// Which languages have it.
            pub fn langs(self) -> Langs {
                match self { $($(Entry::$entry => Langs::$langs,)*)* }
            }
        }
    };
}

kernel_list! {
    /// ops::basic::{Add, Scale, TakeLast}, ops::moe::SwiGlu.
    Elementwise = "elementwise", wgsl ["common"], cuda ["common"] {
        Add = "add" Both,
        Scale = "scale" Both,
        SwiGlu = "swiglu" Both,
        TakeLast = "take_last" Both,
    }
    /// ops::basic::Embed.
    Embed = "embed", wgsl ["common"], cuda ["common", "iq2xxs_grid", "quant"] {
        Embed = "embed" BothTypedInCuda,
    }
    /// ops::norm::RmsNorm.
    Norm = "norm", wgsl ["common", "reduce"], cuda ["common"] {
        RmsNorm = "rms_norm" Both,
    }
    /// ops::hc::HcMix.
    HcMix = "hc_mix", wgsl ["common"], cuda ["common"] {
        HcMix = "hc_mix" Both,
    }
    /// ops::hc::{HcInit, HcCollapse, HcExpand, HcOneHot}.
    Hc = "hc", wgsl ["common"], cuda ["common"] {
        HcInit = "hc_init" Both,
        HcCollapse = "hc_collapse" Both,
        HcExpand = "hc_expand" Both,
        /// Lagged hyper-connections' first collapse (DeepSeek V4.1).
        HcOneHot = "hc_one_hot" Both,
    }
    /// ops::rope::Rope.
    Rope = "rope", wgsl ["common", "rope_angle"], cuda ["common"] {
        Rope = "rope" Both,
    }
    /// ops::round::{KvRound, HadamardFp4, BlockRound}.
    Round = "round", wgsl ["common", "rowops"], cuda ["common"] {
        KvRound = "kv_round" Both,
        HadamardFp4 = "hadamard_fp4" Both,
        BlockRound = "block_round" Both,
    }
    /// ops::attention::RingWrite.
    Ring = "ring", wgsl ["common"], cuda ["common"] {
        RingWrite = "ring_write" Both,
    }
    /// ops::attention::Attention.
    Attention = "attention", wgsl ["common", "reduce"], cuda ["common"] {
        Attention = "attention" Both,
    }
    /// ops::compress::Compress.
    Compress = "compress", wgsl ["common", "rowops", "rope_angle"], cuda ["common"] {
        Compress = "compress" Both,
    }
    /// ops::indexer::IndexerTopK.
    Indexer = "indexer", wgsl ["common", "select"], cuda ["common", "select"] {
        IndexerTopK = "indexer_topk" Both,
    }
    /// ops::moe::Router.
    Router = "router", wgsl ["common"], cuda ["common"] {
        Router = "router" Both,
    }
    /// ops::gather::GatherLast.
    Gather = "gather", wgsl ["common"], cuda ["common"] {
        GatherLast = "gather_last" Both,
    }
    /// DeepSeek V4.1's Engram gate: ops::engram::EngramGate.
    Engram = "engram", wgsl ["common", "rowops"], cuda ["common"] {
        EngramGate = "engram_gate" Both,
    }
    /// DeepSeek V4.1's compressor of kv-source layers:
    /// ops::source_compress::SourceCompress.
    SourceCompress = "source_compress", wgsl ["common", "rowops", "rope_angle"], cuda ["common"] {
        SourceCompress = "source_compress" Both,
    }
    /// DeepSeek V4.1's two-level top-k: ops::candidate::{CandidateBlocks,
    /// CandidateTopK}.
    Candidate = "candidate", wgsl ["common", "select"], cuda ["common", "select"] {
        CandidateBlocks = "candidate_blocks" Both,
        CandidateTopK = "candidate_topk" Both,
    }
    /// ops::matmul::MatMul (wgpu: src/backend/wgpu/matmul.rs).
    Matmul = "matmul", wgsl ["quant"], cuda ["common", "iq2xxs_grid", "quant"] {
        MatMul = "matmul" BothTypedInCuda,
        /// The tensor-core prefill product (sm_80+, opt-in).
        Mma = "mma" CudaTyped,
    }
    /// ops::moe::MoeExperts.
    Moe = "moe", wgsl ["quant", "matmul"], cuda ["common", "iq2xxs_grid", "quant"] {
        /// One selected expert's rows for each (token, slot).
        ExpertRows = "expert_rows" BothTypedInCuda,
        /// Gate and up of one type in one pass, writing the weighted SwiGLU.
        ExpertGateUp = "expert_gate_up" CudaTyped,
        ExpertSwiGlu = "expert_swiglu" Cuda,
        /// The FP8 round trip of w2's input in place (V4.1 model numerics;
        /// CUDA runs `block_round` on it).
        ExpertMidRound = "expert_mid_round" Wgsl,
        /// Each token's slots summed in slot order.
        ExpertSum = "expert_sum" Both,
    }
    /// The device read-bandwidth probe (ds4-bench --bandwidth).
    Bandwidth = "bandwidth", wgsl [], cuda ["common"] {
        /// Grid-strided reads.
        ReadAll = "read_all" Both,
        /// Contiguous runs per invocation (CPU emulators).
        ReadBlocked = "read_blocked" Wgsl,
    }
}

impl Family {
    /// The family of stem `stem`.
    pub fn from_stem(stem: &str) -> Option<Family> {
        Family::ALL.iter().copied().find(|f| f.stem() == stem)
    }

    /// The entries `lang` has a kernel for.
    pub fn entries_in(self, lang: Lang) -> impl Iterator<Item = Entry> {
        self.entries()
            .iter()
            .copied()
            .filter(move |e| e.langs().has(lang))
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.stem())
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The one match from an op to its launch function, shared by the GPU
/// backends: `launch_op!(l, cx, op)` calls `l::<family>::<function>(cx, o)`,
/// `l` being the backend's `launch` module (a file per kernel family, named
/// like `shaders/<family>.wgsl` and `cuda/<family>.cu`). Exhaustive over
/// [`Op`](crate::graph::ops::Op): a new op fails to compile until it is
/// listed here, then until every GPU backend has its function.
macro_rules! launch_op {
    ($l:ident, $cx:expr, $op:expr) => {{
        use $crate::graph::ops::{v41::V41Op, Op};
        match $op {
            Op::Embed(o) => $l::embed::embed($cx, o),
            Op::HcInit(o) => $l::hc::hc_init($cx, o),
            Op::RmsNorm(o) => $l::norm::rms_norm($cx, o),
            Op::MatMul(o) => $l::matmul::matmul($cx, o),
            Op::HcMix(o) => $l::hc_mix::hc_mix($cx, o),
            Op::HcCollapse(o) => $l::hc::hc_collapse($cx, o),
            Op::HcExpand(o) => $l::hc::hc_expand($cx, o),
            Op::Rope(o) => $l::rope::rope($cx, o),
            Op::KvRound(o) => $l::round::kv_round($cx, o),
            Op::HadamardFp4(o) => $l::round::hadamard_fp4($cx, o),
            Op::BlockRound(o) => $l::round::block_round($cx, o),
            Op::Attention(o) => $l::attention::attention($cx, o),
            Op::RingWrite(o) => $l::ring::ring_write($cx, o),
            Op::Compress(o) => $l::compress::compress($cx, o),
            Op::IndexerTopK(o) => $l::indexer::indexer_topk($cx, o),
            Op::Router(o) => $l::router::router($cx, o),
            Op::MoeExperts(o) => $l::moe::moe_experts($cx, o),
            Op::SwiGlu(o) => $l::elementwise::swiglu($cx, o),
            Op::Add(o) => $l::elementwise::add($cx, o),
            Op::Scale(o) => $l::elementwise::scale($cx, o),
            Op::TakeLast(o) => $l::elementwise::take_last($cx, o),
            Op::GatherLast(o) => $l::gather::gather_last($cx, o),
            // DeepSeek V4.1's own ops (docs/V41.md).
            Op::V41(v) => match v {
                V41Op::HcOneHot(o) => $l::hc::hc_one_hot($cx, o),
                V41Op::EngramGate(o) => $l::engram::engram_gate($cx, o),
                V41Op::SourceCompress(o) => $l::source_compress::source_compress($cx, o),
                V41Op::CandidateBlocks(o) => $l::candidate::candidate_blocks($cx, o),
                V41Op::CandidateTopK(o) => $l::candidate::candidate_topk($cx, o),
                V41Op::EngramHash(_) | V41Op::EngramLookup(_) => {
                    Err($l::unsupported($crate::backend::kernels::engram_on_host(v)))
                }
            },
        }
    }};
}
pub(crate) use launch_op;

/// Why a GPU backend has no kernel for the Engram hash and table lookup:
/// the host hashes the ids and feeds the rows (`engram_from_host`), so no
/// table ever reaches the device.
pub fn engram_on_host(op: &crate::graph::ops::v41::V41Op) -> String {
    format!(
        "{}: the Engram tables stay on the host; record the V4.1 graph with engram_from_host (the host hashes the ids and feeds engram_rows@L)",
        op.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_entries_belong_to_their_family() {
        let mut names: Vec<&str> = Entry::ALL.iter().map(|e| e.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Entry::ALL.len());
        for f in Family::ALL {
            assert_eq!(Family::from_stem(f.stem()), Some(*f));
            for e in f.entries() {
                assert_eq!(e.family(), *f);
            }
        }
    }
}
