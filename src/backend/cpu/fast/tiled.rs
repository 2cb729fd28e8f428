//! The many-token (prefill) drivers of the fast matrix products: a task
//! owns a run of weight rows, decodes them in blocks of [`ROW_BLOCK`] into
//! per-thread scratch, and every group of tokens meets the block in
//! micro-kernel tiles: [`gemm`] over Q8x32 activations, [`ktile`] over Q8_K
//! (the AVX2 set's expert formats). [`super::matmul`] picks the driver.

use rayon::prelude::*;

use super::act::BlockQ8x32;
use super::{expand, gemm, ktile, Kernels};
use crate::quant::q8_k::BlockQ8K;
use crate::quant::GgmlType;

/// Decoded rows per block on the prefill path (16 Flash rows of 4096: 64 KiB
/// of codes and 8 KiB of scales, in L2 beside the token group's activations).
const ROW_BLOCK: usize = 16;

/// Splits `n_out` weight rows of `rb` bytes over the pool (when
/// `parallel`): `work(first, chunk)` fills `chunk` (rows `first..`,
/// `n_tokens` values each).
pub fn split_rows(
    tmp: &mut [f32],
    n_out: usize,
    rb: usize,
    n_tokens: usize,
    parallel: bool,
    work: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    let threads = rayon::current_num_threads().max(1);
    let min_rows = ((256 << 10) / (rb * n_tokens).max(1)).max(4);
    let chunk_rows = n_out.div_ceil(threads * 4).max(min_rows);
    let tmp = &mut tmp[..n_out * n_tokens];
    if chunk_rows >= n_out || threads == 1 || !parallel {
        work(0, tmp);
        return;
    }
    tmp.par_chunks_mut(chunk_rows * n_tokens)
        .enumerate()
        .for_each(|(i, c)| work(i * chunk_rows, c));
}

/// The prefill path ([`gemm`]): rows decoded ([`expand::expand`]) in blocks
/// of [`ROW_BLOCK`] into per-thread scratch, then every group of tokens meets
/// the block in micro-kernel calls of [`gemm::MR`] rows × [`gemm::nr`] tokens.
#[allow(clippy::too_many_arguments)]
pub fn matmul_expanded(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_out: usize,
    groups: usize,
    blocks: &[BlockQ8x32],
    per_row: usize,
    n_tokens: usize,
    tmp: &mut [f32],
) {
    let rb = w.len() / n_out;
    let groups = groups.max(1);
    let rows_per_group = n_out / groups;
    let n_in = per_row * 32;
    let sums = if expand::has_offsets(ty) {
        expand::sums16(blocks)
    } else {
        Vec::new()
    };
    let nr = gemm::nr(k.isa);
    gemm::with_packed(k.isa, blocks, per_row, |packed| {
        split_rows(tmp, n_out, rb, n_tokens, true, |first, chunk| {
            let rows = chunk.len() / n_tokens;
            gemm::with_tile(ROW_BLOCK.min(rows), n_in, |tile| {
                let shape = Walk {
                    first,
                    n_tokens,
                    groups,
                    rows_per_group,
                    nr,
                };
                shape.run(
                    tile,
                    chunk,
                    |e, o| expand::expand_isa(k.isa, ty, &w[o * rb..(o + 1) * rb], e),
                    |sub, toks, out: &mut [[f32; gemm::NR_MAX]; gemm::MR]| {
                        gemm::tile(k.isa, sub, packed, toks, out)
                    },
                    |e, a, v| {
                        // The K-quants' min terms: an f32 dot of n/16.
                        if e.has_off {
                            v + k.dot_f32(
                                bytemuck::cast_slice(&e.off),
                                &sums[2 * a * per_row..2 * (a + 1) * per_row],
                            )
                        } else {
                            v
                        }
                    },
                );
            })
        });
    });
}

/// The prefill path of the formats [`ktile`] handles: rows decoded in
/// blocks of [`ROW_BLOCK`], then every group of tokens meets the block in
/// micro-kernel calls of [`ktile::MR`] rows × [`ktile::NR`] tokens; each
/// value is the 1-row kernel's, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn matmul_ktile(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_out: usize,
    groups: usize,
    blocks: &[BlockQ8K],
    per_row: usize,
    n_tokens: usize,
    parallel: bool,
    tmp: &mut [f32],
) {
    assert!(ktile::handles(k.isa, ty), "{ty} on {:?}: no ktile", k.isa);
    let rb = w.len() / n_out;
    let groups = groups.max(1);
    let rows_per_group = n_out / groups;
    let n_in = per_row * 256;
    let mut packed = ktile::KActs::default();
    packed.pack(ty, blocks);
    split_rows(tmp, n_out, rb, n_tokens, parallel, |first, chunk| {
        let rows = chunk.len() / n_tokens;
        ktile::with_rows(ROW_BLOCK.min(rows), n_in, |tile| {
            let nr = ktile::NR;
            let shape = Walk {
                first,
                n_tokens,
                groups,
                rows_per_group,
                nr,
            };
            shape.run(
                tile,
                chunk,
                |kr, o| ktile::decode(ty, &w[o * rb..(o + 1) * rb], kr),
                |sub, toks, out: &mut [[f32; ktile::NR]; ktile::MR]| {
                    ktile::tile(ty, sub, blocks, per_row, &packed, toks, out)
                },
                |_, _, v| v,
            );
        })
    });
}

/// One task's walk over its rows (`first..`, `chunk.len() / n_tokens` of
/// them): blocks of `tile.len()` rows decoded into the tile (ROW_BLOCK ×
/// ~1.1 bytes per weight: L2), then every token group of `nr` meets the
/// block in micro-kernel calls of at most `MR` rows of one group (a token
/// group's activations stay in L1 across the block).
struct Walk {
    first: usize,
    n_tokens: usize,
    groups: usize,
    rows_per_group: usize,
    nr: usize,
}

impl Walk {
    /// `decode(row, o)` fills a tile row from weight row `o`;
    /// `call(rows, toks, out)` runs the micro-kernel (`toks`: activation
    /// rows); `finish(row, tok, v)` gives the value written for `out[i][j]`.
    fn run<R, const MR: usize, const NR: usize>(
        &self,
        tile: &mut [R],
        chunk: &mut [f32],
        mut decode: impl FnMut(&mut R, usize),
        mut call: impl FnMut(&[R], &[usize], &mut [[f32; NR]; MR]),
        mut finish: impl FnMut(&R, usize, f32) -> f32,
    ) {
        let Walk {
            first,
            n_tokens,
            groups,
            rows_per_group,
            nr,
        } = *self;
        assert!(nr <= NR);
        let rows = chunk.len() / n_tokens;
        let mut out = [[0f32; NR]; MR];
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + tile.len()).min(rows);
            for (e, r) in tile.iter_mut().zip(r0..r1) {
                decode(e, first + r);
            }
            let mut t0 = 0;
            while t0 < n_tokens {
                let t1 = (t0 + nr).min(n_tokens);
                let mut s0 = r0;
                while s0 < r1 {
                    // Rows of one call share their group's activations.
                    let g = (first + s0) / rows_per_group;
                    let s1 = (s0 + MR).min(r1).min((g + 1) * rows_per_group - first);
                    let mut toks = [0usize; NR];
                    for (a, t) in toks.iter_mut().zip(t0..t1) {
                        *a = t * groups + g;
                    }
                    let toks = &toks[..t1 - t0];
                    let sub = &tile[s0 - r0..s1 - r0];
                    call(sub, toks, &mut out);
                    for (i, e) in sub.iter().enumerate() {
                        for (j, &a) in toks.iter().enumerate() {
                            chunk[(s0 + i) * n_tokens + t0 + j] = finish(e, a, out[i][j]);
                        }
                    }
                    s0 = s1;
                }
                t0 = t1;
            }
            r0 = r1;
        }
    }
}
