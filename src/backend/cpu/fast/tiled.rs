//! The many-token (prefill) drivers of the fast matrix products: a task
//! owns a run of weight rows, decodes them in blocks of [`ROW_BLOCK`] into
//! per-thread scratch, and every group of tokens meets the block in
//! micro-kernel tiles: [`gemm`] over Q8x32 activations, [`ktile`] over Q8_K
//! (the AVX2 set's expert formats). [`super::matmul`] picks the driver.

use std::marker::PhantomData;
use std::ops::Range;

use rayon::prelude::*;

use super::act::BlockQ8x32;
use super::{expand, gemm, ktile, Kernels};
use crate::quant::q8_k::BlockQ8K;
use crate::quant::GgmlType;

/// Decoded rows per block on the prefill path (16 Flash rows of 4096: 64 KiB
/// of codes and 8 KiB of scales, in L2 beside the token group's activations).
const ROW_BLOCK: usize = 16;

/// Where a product's values go: `n_out` rows × `n_tokens` tokens, value
/// (o, t) at `o·row_stride + t·tok_stride` of one buffer: weight-row-major
/// (`tmp[o·n_tokens + t]`, the experts' layout) or token-major (an op's
/// output, `out[t·n_out + o]`, written in place: a 2,048-token product no
/// longer fills a fresh weight-row-major buffer of up to 256 MiB and
/// transposes it). Tasks write it through [`Part`]s, which only
/// [`split_rows`] and [`split_tokens`] make, over disjoint ranges.
pub struct OutRows<'a> {
    ptr: *mut f32,
    n_out: usize,
    n_tokens: usize,
    row_stride: usize,
    tok_stride: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: an `OutRows` is written only through `Part`s, whose (row, token)
// ranges the splits below keep disjoint; the buffer is borrowed mutably for
// the `OutRows`' lifetime.
unsafe impl Send for OutRows<'_> {}
unsafe impl Sync for OutRows<'_> {}

impl<'a> OutRows<'a> {
    /// `buf[o·n_tokens + t]`.
    pub fn row_major(buf: &'a mut [f32], n_out: usize, n_tokens: usize) -> Self {
        assert!(buf.len() >= n_out * n_tokens, "output buffer too short");
        OutRows {
            ptr: buf.as_mut_ptr(),
            n_out,
            n_tokens,
            row_stride: n_tokens,
            tok_stride: 1,
            _buf: PhantomData,
        }
    }

    /// `buf[t·n_out + o]`.
    pub fn token_major(buf: &'a mut [f32], n_out: usize, n_tokens: usize) -> Self {
        assert!(buf.len() >= n_out * n_tokens, "output buffer too short");
        OutRows {
            ptr: buf.as_mut_ptr(),
            n_out,
            n_tokens,
            row_stride: 1,
            tok_stride: n_out,
            _buf: PhantomData,
        }
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Rows `rows` × tokens `toks`. Private to the splits, which never hand
    /// out two parts that overlap.
    fn part(&self, rows: Range<usize>, toks: Range<usize>) -> Part<'_> {
        assert!(rows.end <= self.n_out && toks.end <= self.n_tokens);
        Part {
            ptr: self.ptr,
            rows,
            toks,
            row_stride: self.row_stride,
            tok_stride: self.tok_stride,
            _out: PhantomData,
        }
    }
}

/// One task's rows × tokens of an [`OutRows`].
pub struct Part<'p> {
    ptr: *mut f32,
    rows: Range<usize>,
    toks: Range<usize>,
    row_stride: usize,
    tok_stride: usize,
    _out: PhantomData<&'p OutRows<'p>>,
}

// SAFETY: as for `OutRows`: a part's (row, token) range is its own.
unsafe impl Send for Part<'_> {}

impl Part<'_> {
    /// The product's row of the part's row 0.
    pub fn first(&self) -> usize {
        self.rows.start
    }

    /// Rows in the part.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The part's tokens.
    pub fn tokens(&self) -> Range<usize> {
        self.toks.clone()
    }

    /// Sets the value of the part's row `r` and token `t` (a token of
    /// [`Part::tokens`]).
    #[inline]
    pub fn set(&mut self, r: usize, t: usize, v: f32) {
        assert!(
            r < self.rows.len() && self.toks.contains(&t),
            "outside the part"
        );
        // SAFETY: in the buffer (checked against `OutRows`' bounds when the
        // part was made) and in this part's range, which no other part has.
        unsafe {
            *self
                .ptr
                .add((self.rows.start + r) * self.row_stride + t * self.tok_stride) = v;
        }
    }
}

/// Splits the rows of `out` (weight rows of `rb` bytes) over the pool (when
/// `parallel`): `work` fills each part, all tokens of a run of rows.
pub fn split_rows(
    out: &OutRows,
    rb: usize,
    parallel: bool,
    work: impl Fn(&mut Part) + Sync + Send,
) {
    let (n_out, n_tokens) = (out.n_out, out.n_tokens);
    let threads = rayon::current_num_threads().max(1);
    let min_rows = ((256 << 10) / (rb * n_tokens).max(1)).max(4);
    let chunk_rows = n_out.div_ceil(threads * 4).max(min_rows);
    if chunk_rows >= n_out || threads == 1 || !parallel {
        work(&mut out.part(0..n_out, 0..n_tokens));
        return;
    }
    (0..n_out.div_ceil(chunk_rows))
        .into_par_iter()
        .for_each(|i| {
            let r0 = i * chunk_rows;
            work(&mut out.part(r0..(r0 + chunk_rows).min(n_out), 0..n_tokens))
        });
}

/// Splits the tokens of `out` over the pool in runs of `per`: `work` fills
/// each part, all rows of a run of tokens (products with too few rows to
/// share out).
pub fn split_tokens(out: &OutRows, per: usize, work: impl Fn(&mut Part) + Sync + Send) {
    let (n_out, n_tokens) = (out.n_out, out.n_tokens);
    let per = per.max(1);
    (0..n_tokens.div_ceil(per)).into_par_iter().for_each(|i| {
        let t0 = i * per;
        work(&mut out.part(0..n_out, t0..(t0 + per).min(n_tokens)))
    });
}

/// The prefill path ([`gemm`]): rows decoded ([`expand::expand`]) in blocks
/// of [`ROW_BLOCK`] into per-thread scratch, then every group of tokens meets
/// the block in micro-kernel calls of [`gemm::MR`] rows × [`gemm::nr`] tokens.
#[allow(clippy::too_many_arguments)]
pub fn matmul_expanded(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    groups: usize,
    blocks: &[BlockQ8x32],
    per_row: usize,
    out: &OutRows,
) {
    let rb = w.len() / out.n_out();
    let n_in = per_row * 32;
    let sums = if expand::has_offsets(ty) {
        expand::sums16(blocks)
    } else {
        Vec::new()
    };
    let shape = Walk::new(out, groups, gemm::nr(k.isa));
    gemm::with_packed(k.isa, blocks, per_row, |packed| {
        split_rows(out, rb, true, |part| {
            gemm::with_tile(ROW_BLOCK.min(part.rows()), n_in, |tile| {
                shape.run(
                    tile,
                    part,
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
    groups: usize,
    blocks: &[BlockQ8K],
    per_row: usize,
    parallel: bool,
    out: &OutRows,
) {
    assert!(ktile::handles(k.isa, ty), "{ty} on {:?}: no ktile", k.isa);
    let rb = w.len() / out.n_out();
    let n_in = per_row * 256;
    let mut packed = ktile::KActs::default();
    packed.pack(ty, blocks);
    let shape = Walk::new(out, groups, ktile::NR);
    split_rows(out, rb, parallel, |part| {
        ktile::with_rows(ROW_BLOCK.min(part.rows()), n_in, |tile| {
            shape.run(
                tile,
                part,
                |kr, o| ktile::decode(ty, &w[o * rb..(o + 1) * rb], kr),
                |sub, toks, out: &mut [[f32; ktile::NR]; ktile::MR]| {
                    ktile::tile(ty, sub, blocks, per_row, &packed, toks, out)
                },
                |_, _, v| v,
            );
        })
    });
}

/// One task's walk over its rows (those of its [`Part`]): blocks of `tile.len()` rows decoded into the tile (ROW_BLOCK ×
/// ~1.1 bytes per weight: L2), then every token group of `nr` meets the
/// block in micro-kernel calls of at most `MR` rows of one group (a token
/// group's activations stay in L1 across the block).
struct Walk {
    groups: usize,
    rows_per_group: usize,
    nr: usize,
}

impl Walk {
    /// The walk of a product into `out` whose rows fall in `groups` equal
    /// groups (each its own activation row per token), `nr` tokens a call.
    fn new(out: &OutRows, groups: usize, nr: usize) -> Walk {
        let groups = groups.max(1);
        Walk {
            groups,
            rows_per_group: out.n_out() / groups,
            nr,
        }
    }

    /// `decode(row, o)` fills a tile row from weight row `o`;
    /// `call(rows, toks, out)` runs the micro-kernel (`toks`: activation
    /// rows); `finish(row, tok, v)` gives the value written for `out[i][j]`.
    fn run<R, const MR: usize, const NR: usize>(
        &self,
        tile: &mut [R],
        part: &mut Part,
        mut decode: impl FnMut(&mut R, usize),
        mut call: impl FnMut(&[R], &[usize], &mut [[f32; NR]; MR]),
        mut finish: impl FnMut(&R, usize, f32) -> f32,
    ) {
        let Walk {
            groups,
            rows_per_group,
            nr,
        } = *self;
        assert!(nr <= NR);
        let (first, rows, toks) = (part.first(), part.rows(), part.tokens());
        let mut out = [[0f32; NR]; MR];
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + tile.len()).min(rows);
            for (e, r) in tile.iter_mut().zip(r0..r1) {
                decode(e, first + r);
            }
            let mut t0 = toks.start;
            while t0 < toks.end {
                let t1 = (t0 + nr).min(toks.end);
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
                            part.set(s0 + i, t0 + j, finish(e, a, out[i][j]));
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
