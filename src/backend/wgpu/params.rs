//! Per-family parameter structs: each `#[repr(C)]` struct here is the twin
//! of the WGSL struct of the same name in `shaders/<family>.wgsl`, written
//! once per dispatch into a uniform buffer at `load_graph`. The naga test
//! (tests/wgpu_naga.rs) checks every size and field offset against the
//! layout naga computes for the WGSL side.

use bytemuck::{Pod, Zeroable};

macro_rules! params {
    ($( $(#[$m:meta])* $name:ident { $($f:ident : $t:ty),* $(,)? } )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
            pub struct $name { $(pub $f: $t),* }
        )*
        /// (WGSL struct name, size in bytes, (field, offset) list) of every twin.
        pub fn twins() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
            vec![$(
                (stringify!($name), std::mem::size_of::<$name>(),
                 vec![$((stringify!($f), std::mem::offset_of!($name, $f))),*]),
            )*]
        }
    };
}

params! {
    /// shaders/common.wgsl (the Rust side is `gpu::StepUniform`; mirrored
    /// here so the layout check covers it).
    StepUniform { pos0: u32, n_tokens: u32, row0: u32, _pad0: u32 }
    /// shaders/common.wgsl (the Rust side is `gpu::RowRecord`).
    RowRecord { pos: u32, state: u32 }
    EltParams { cols: u32, factor: f32, clamp: f32, _pad0: u32 }
    EmbedParams { dim: u32, ty: u32, row0: u32, n_rows: u32 }
    NormParams {
        dim: u32, rows_per_token: u32, fixed_rows: u32, has_weight: u32,
        eps: f32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
    HcMixParams {
        n_hc: u32, mix_dim: u32, sinkhorn_iters: u32, has_post: u32,
        eps: f32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
    HcParams { n_hc: u32, dim: u32, _pad0: u32, _pad1: u32 }
    RopeParams { heads: u32, head_dim: u32, n_rot: u32, inverse: u32 }
    RoundParams {
        dim: u32, rows_per_token: u32, n_rot: u32, fp8: u32,
        f16: u32, block: u32, format: u32, _pad0: u32,
    }
    RingParams { window: u32, dim: u32, _pad0: u32, _pad1: u32 }
    GatherParams { cols: u32, states: u32, _pad0: u32, _pad1: u32 }
    AttnParams {
        n_head: u32, head_dim: u32, window: u32, top_k: u32,
        ratio: u32, has_sel: u32, scale: f32, chunk_rows: u32,
        block: u32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
    CompressParams {
        ratio: u32, head_dim: u32, width: u32, overlapped: u32,
        n_rot: u32, rounding: u32, eps: f32, chunk_rows: u32,
        t0: u32, t1: u32, _pad0: u32, _pad1: u32,
    }
    IndexerParams {
        ratio: u32, top_k: u32, n_head: u32, head_dim: u32,
        max_rows: u32, chunk_rows: u32, t0: u32, _pad2: u32,
    }
    /// shaders/engram.wgsl.
    EngramParams { n_hc: u32, dim: u32, eps: f32, _pad0: u32 }
    /// shaders/source_compress.wgsl.
    SourceCompressParams {
        ratio: u32, head_dim: u32, index_head_dim: u32, n_rot: u32,
        eps: f32, capacity: u32, t0: u32, t1: u32,
        chunk_rows: u32, index_chunk_rows: u32, round_rows: u32, _pad0: u32,
    }
    /// shaders/candidate.wgsl.
    CandidateParams {
        ratio: u32, top_k: u32, n_head: u32, head_dim: u32,
        topk_blocks: u32, block_size: u32, max_items: u32, t0: u32,
        chunk_rows: u32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
    RouterParams {
        n_expert: u32, k: u32, scale: f32, normalize: u32,
        has_bias: u32, has_table: u32, table_row: u32, _pad0: u32,
    }
}

/// The RoPE table the kernels read: per rotated pair, the frequency as turns
/// per position split in (hi, mid, lo) so that `pos · part` is exact in f32
/// for hi and mid (12 significant bits each, positions split in 12-bit
/// halves). See shaders/rope.wgsl.
pub fn rope_table(freqs: &[f64]) -> Vec<f32> {
    fn trunc12(x: f64) -> f64 {
        if x == 0.0 {
            return 0.0;
        }
        let e = x.abs().log2().floor();
        let q = (e - 11.0).exp2();
        (x / q).trunc() * q
    }
    let mut out = Vec::with_capacity(3 * freqs.len());
    for &f in freqs {
        let turns = f / (2.0 * std::f64::consts::PI);
        let hi = trunc12(turns);
        let mid = trunc12(turns - hi);
        let lo = turns - hi - mid;
        out.extend([hi as f32, mid as f32, lo as f32]);
    }
    out
}
