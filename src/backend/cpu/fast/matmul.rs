//! The fast matrix products: dense matmuls and routed experts over
//! quantised activations, split by weight rows across the rayon pool (a
//! persistent pool: no thread start-up per step).
//!
//! Tiling: a task owns a run of weight rows; it walks them in tiles of
//! [`ROW_TILE`] rows and, per tile, every token, so a tile's rows stay in L1
//! while the (smaller) quantised activation rows stream from L2. In decode
//! (one token) every core streams its own rows of the weight matrix.

use rayon::prelude::*;

use super::act::{ActKind, Acts};
use super::tiled::{OutRows, Part};
use super::{expand, ktile, tiled, Kernels, Picked, MANY_MAX};
use crate::gguf::TensorRef;
use crate::graph::ops::moe::{swiglu, MoeExperts, SlabSource};
use crate::graph::Segment;
use crate::quant::GgmlType;

/// Weight rows per tile (a Flash Q8_0 row of 4096 is 4.3 KiB: 4 rows and a token's
/// activations fit L1).
const ROW_TILE: usize = 4;

/// Bytes of weight rows per tile when the activations are f32 (8 Flash F16
/// rows of 16,384, 32 of 4,096: an L2's share beside a token group).
const F32_TILE_BYTES: usize = 256 << 10;

/// `tmp[o·n_tokens + t] = W[o] · act[t·groups + o / (n_out/groups)]`
/// (weight-row-major). `wide` picks the many-token path (decoded rows and
/// the gemm micro-kernels where the format has them; [`wide`]) over the
/// direct dot products. Either path computes each (weight row, token) with
/// one fixed reduction order, whatever the other tokens: a token's result
/// depends only on its activations and the path.
#[allow(clippy::too_many_arguments)]
pub fn matmul_acts(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_out: usize,
    groups: usize,
    acts: &Acts,
    n_tokens: usize,
    wide: bool,
    tmp: &mut [f32],
) {
    let out = OutRows::row_major(tmp, n_out, n_tokens);
    matmul_acts_on(k, ty, w, groups, acts, wide, true, &out)
}

/// [`matmul_acts`], its weight rows split over the pool when `parallel`,
/// on the calling thread otherwise (the caller already spreads whole
/// products over the pool). The same bits either way: each output value
/// is one [`Kernels::dot_many`] over the same token group. `out` says
/// where values go (weight-row-major or token-major) and how many.
#[allow(clippy::too_many_arguments)]
fn matmul_acts_on(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    groups: usize,
    acts: &Acts,
    wide: bool,
    parallel: bool,
    out: &OutRows,
) {
    let (n_out, n_tokens) = (out.n_out(), out.n_tokens());
    if n_out == 0 || n_tokens == 0 {
        return;
    }
    let rb = w.len() / n_out;
    let rows_per_group = n_out / groups.max(1);
    // Q8x32 activations meet 2/4-bit rows only decoded; Q8_0 and MXFP4 have
    // direct kernels too, which win below a few tokens (`wide` false).
    let direct = matches!(ty, GgmlType::Q8_0 | GgmlType::Mxfp4) && !wide;
    if let (Acts::Q8x32 { blocks, per_row }, true, false) = (acts, expand::expandable(ty), direct) {
        return tiled::matmul_expanded(k, ty, w, groups, blocks, *per_row, out);
    }
    if let (Some((blocks, per_row)), true, true) =
        (ktile::q8k(acts), wide, ktile::handles(k.isa, ty))
    {
        return tiled::matmul_ktile(k, ty, w, groups, blocks, per_row, parallel, out);
    }
    // Per tile of weight rows and group of up to `MANY_MAX` tokens, one
    // multi-row dot per weight row ([`Kernels::dot_many`]): the row's blocks
    // decoded once for the whole group, each token's result the one its
    // 1-row dot gives. (Groups of 4 on AVX2, so that a weight tile meets
    // activation rows still in L1, measured slower: the blocks are then
    // decoded twice as often; docs/PERFORMANCE.md.)
    //
    // f32 activations (F16/BF16/F32 weights) have no multi-row kernel, and
    // a token's row is 4 bytes a value: with tiles of 4 rows every tile
    // streamed all the tokens' activations again (32 MiB at 2,048 tokens of
    // 4,096, from memory, per 4 rows). Their tiles are sized in bytes
    // instead, so that a tile stays in L2 while the token groups sweep it.
    let f32_acts = matches!(acts, Acts::F32 { .. });
    let row_tile = if f32_acts {
        (F32_TILE_BYTES / rb.max(1)).clamp(ROW_TILE, 64)
    } else {
        ROW_TILE
    };
    // A part's rows × its tokens.
    let fill = |part: &mut Part| {
        let (first, rows, toks) = (part.first(), part.rows(), part.tokens());
        let mut idx = [0usize; MANY_MAX];
        let mut vals = [0f32; MANY_MAX];
        // The token group's rows, picked again only for another token group
        // or when the output row enters another group of a grouped product.
        let mut picked: Option<((usize, usize), Picked)> = None;
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + row_tile).min(rows);
            let mut t0 = toks.start;
            while t0 < toks.end {
                let t1 = (t0 + MANY_MAX).min(toks.end);
                let m = t1 - t0;
                for r in r0..r1 {
                    let o = first + r;
                    let g = o / rows_per_group;
                    if picked.as_ref().is_none_or(|(key, _)| *key != (t0, g)) {
                        for (a, t) in idx.iter_mut().zip(t0..t1) {
                            *a = t * groups + g;
                        }
                        picked = Some(((t0, g), Picked::new(acts, &idx[..m])));
                    }
                    let (_, p) = picked.as_ref().expect("picked above");
                    k.dot_picked(ty, &w[o * rb..(o + 1) * rb], p, &mut vals[..m]);
                    for (t, &v) in (t0..t1).zip(&vals[..m]) {
                        part.set(r, t, v);
                    }
                }
                t0 = t1;
            }
            r0 = r1;
        }
    };
    let threads = rayon::current_num_threads().max(1);
    if f32_acts && parallel && threads > 1 && n_out < 2 * threads * row_tile {
        // Too few rows to share out (the hyper-connection mixers: 24 rows of
        // 16,384): the tokens are split instead, so each token's
        // activations are read once, not once per task.
        let per = n_tokens.div_ceil(threads).next_multiple_of(MANY_MAX);
        tiled::split_tokens(out, per, fill);
        return;
    }
    tiled::split_rows(out, rb, parallel, fill);
}

/// Whether a piece of `n_tokens` rows takes the many-token path: the one
/// choice that depends on the step, made per session piece (a [`Segment`])
/// so that a session's results do not depend on what else is in the step.
pub fn wide(n_tokens: usize) -> bool {
    n_tokens >= super::PREFILL_TOKENS
}

/// The fast twin of `ops::matmul::matmul_rows`; `false` (nothing written)
/// when the weight type has no fast kernel.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> bool {
    matmul_path(
        k,
        ty,
        w,
        n_in,
        n_out,
        groups,
        x,
        n_tokens,
        wide(n_tokens),
        out,
    )
}

/// [`matmul`] over rows that are each the last row of a different session
/// (the head after `TakeLast` / `GatherLast`): every row takes the path of
/// a 1-row piece, as it does when its session runs alone, whatever the
/// number of rows. (Choosing the path by the row count, as [`matmul`] does,
/// put 4 or more sessions' last rows on the many-token path and changed
/// their logits.)
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows_apart(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) -> bool {
    matmul_path(k, ty, w, n_in, n_out, groups, x, rows, wide(1), out)
}

/// [`matmul`] on the path `wide` names.
#[allow(clippy::too_many_arguments)]
fn matmul_path(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    n_tokens: usize,
    wide: bool,
    out: &mut [f32],
) -> bool {
    let Some(kind) = k.act_kind_for(ty, if wide { super::PREFILL_TOKENS } else { 1 }) else {
        return false;
    };
    let groups = groups.max(1);
    // Activation row `t·groups + g` (token t, group g) is `x[r·n_in..]`.
    let x = &x[..n_tokens * groups * n_in];
    let acts = if kind == ActKind::F32 {
        Acts::f32_borrowed(x, n_in)
    } else {
        Acts::quantize_par(kind, n_in, &x.chunks_exact(n_in).collect::<Vec<_>>())
    };
    // Token-major: the op's output, written in place.
    let out = OutRows::token_major(out, n_out, n_tokens);
    matmul_acts_on(k, ty, w, groups, &acts, wide, true, &out);
    true
}

/// [`matmul`] over a batched step: each session piece takes the path its
/// own row count picks ([`wide`]), so a row's result is the one its session
/// alone would get. Rows of one path run as one product (each weight row
/// read once for all of them); a step mixing both paths reads the weights
/// twice.
#[allow(clippy::too_many_arguments)]
pub fn matmul_segments(
    k: &Kernels,
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    groups: usize,
    x: &[f32],
    segs: &[Segment],
    out: &mut [f32],
) -> bool {
    if Kernels::act_kind(ty).is_none() {
        return false;
    }
    let n: usize = segs.iter().map(|s| s.n).sum();
    let width = groups.max(1) * n_in;
    for path in [false, true] {
        let mine: Vec<&Segment> = segs.iter().filter(|s| wide(s.n) == path).collect();
        let rows: usize = mine.iter().map(|s| s.n).sum();
        if rows == 0 {
            continue;
        }
        if rows == n {
            return matmul_path(k, ty, w, n_in, n_out, groups, x, n, path, out);
        }
        let mut xs = Vec::with_capacity(rows * width);
        for s in &mine {
            xs.extend_from_slice(&x[s.row0 * width..(s.row0 + s.n) * width]);
        }
        let mut ys = vec![0f32; rows * n_out];
        matmul_path(k, ty, w, n_in, n_out, groups, &xs, rows, path, &mut ys);
        let mut at = 0;
        for s in &mine {
            out[s.row0 * n_out..(s.row0 + s.n) * n_out]
                .copy_from_slice(&ys[at * n_out..(at + s.n) * n_out]);
            at += s.n;
        }
    }
    true
}

// The kernel table, the op, the file, the activations, the routing and the
// output are all distinct inputs of one expert pass; a struct would only
// rename them.
/// The fast twin of `MoeExperts::cpu` over one session's `n_tokens` rows
/// ([`moe_experts_segments`] with one piece).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts<'f>(
    k: &Kernels,
    o: &MoeExperts,
    src: impl Into<SlabSource<'f>>,
    x: &[f32],
    sel: &[i32],
    wts: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> bool {
    let one = [Segment {
        row0: 0,
        n: n_tokens,
        pos0: 0,
        state: 0,
    }];
    moe_experts_segments(k, o, src, x, sel, wts, &one, out)
}

#[allow(clippy::too_many_arguments)]
/// The fast twin of `MoeExperts::cpu`: the step's tokens are quantised once,
/// gathered per expert, and each selected expert runs over its tokens: once
/// per path ([`wide`]), the path of a token chosen by how many rows of its
/// own session piece chose the expert, so that a session's rows get the
/// results they get alone. `false` (nothing written) when a weight type has
/// no fast kernel.
pub fn moe_experts_segments<'f>(
    k: &Kernels,
    o: &MoeExperts,
    src: impl Into<SlabSource<'f>>,
    x: &[f32],
    sel: &[i32],
    wts: &[f32],
    segs: &[Segment],
    out: &mut [f32],
) -> bool {
    // Per expert: decoded rows ([`expand`]) once it has a few tokens, the
    // direct kernels below that; the step's tokens are quantised once in
    // each activation format an expert may need.
    let many = super::PREFILL_TOKENS;
    let kinds = |ty: GgmlType| (k.act_kind_for(ty, 1), k.act_kind_for(ty, many));
    let ((Some(kg1), Some(kgn)), (Some(ku1), Some(kun)), (Some(kd1), Some(kdn))) =
        (kinds(o.gate.ty), kinds(o.up.ty), kinds(o.down.ty))
    else {
        return false;
    };
    let crate::graph::ops::moe::ExpertDims {
        dim: d,
        hidden: ff,
        n_expert,
    } = o.dims();
    let n_tokens: usize = segs.iter().map(|s| s.n).sum();
    let kk = o.k;
    let src = src.into();
    let slab = |t: &TensorRef, e: usize| o.slab_from(src, t, e);
    let rows = || (0..n_tokens).map(|t| &x[t * d..(t + 1) * d]);
    // Activation sets by kind, made once: (kind, acts).
    let mut sets: Vec<(super::act::ActKind, Acts)> = Vec::new();
    let wanted = if segs.iter().any(|s| s.n * kk >= many) {
        vec![kg1, ku1, kgn, kun]
    } else {
        vec![kg1, ku1]
    };
    for kind in wanted {
        if !sets.iter().any(|(k2, _)| *k2 == kind) {
            sets.push((
                kind,
                Acts::quantize_par(kind, d, &rows().collect::<Vec<_>>()),
            ));
        }
    }
    let set = |kind| {
        &sets
            .iter()
            .find(|(k2, _)| *k2 == kind)
            .expect("quantised above")
            .1
    };
    let (direct, wide_jobs) = jobs_by_path(o, sel, segs, n_expert, many);
    // One expert over its users: gate, up, SwiGLU with the routing weight,
    // down; the users' output rows (token-major, d per user). A
    // many-token expert splits each product over the pool; a direct one
    // runs on the calling thread (whole experts are the tasks, below).
    let expert = |e: usize, path: bool, split: bool, users: &[usize]| -> Vec<f32> {
        let n = users.len();
        let (kg, ku, kd) = if path {
            (kgn, kun, kdn)
        } else {
            (kg1, ku1, kd1)
        };
        let ag = set(kg).gather(users.iter().map(|&i| i / kk));
        let au = if ku == kg {
            None
        } else {
            Some(set(ku).gather(users.iter().map(|&i| i / kk)))
        };
        let mut g = vec![0f32; n * ff];
        let mut u = vec![0f32; n * ff];
        let on = |ty, w, a: &Acts, out: OutRows| matmul_acts_on(k, ty, w, 1, a, path, split, &out);
        on(
            o.gate.ty,
            slab(&o.gate, e),
            &ag,
            OutRows::row_major(&mut g, ff, n),
        );
        let au = au.as_ref().unwrap_or(&ag);
        on(
            o.up.ty,
            slab(&o.up, e),
            au,
            OutRows::row_major(&mut u, ff, n),
        );
        // g, u are weight-row-major: element (f, j) at f·n + j.
        let mut h = vec![0f32; n * ff];
        for (j, &slot) in users.iter().enumerate() {
            let wt = wts[slot];
            for f in 0..ff {
                h[j * ff + f] = wt * swiglu(g[f * n + j], u[f * n + j], o.clamp);
            }
        }
        if o.mid_fp8 {
            for row in h.chunks_exact_mut(ff) {
                crate::quant::small_float::fp8_roundtrip(
                    row,
                    crate::graph::ops::moe::MID_FP8_BLOCK,
                );
            }
        }
        let ah = Acts::quantize(kd, ff, h.chunks_exact(ff));
        let mut y = vec![0f32; n * d];
        on(
            o.down.ty,
            slab(&o.down, e),
            &ah,
            OutRows::token_major(&mut y, d, n),
        );
        y
    };
    // Direct-path experts (decode rows: a step of s sessions meets up to
    // 6·s of them, each a few MB read by one or a few rows) run whole, one
    // per task, over the pool: no fork and join per product, and each
    // thread streams its own expert. Many-token experts split each product
    // over the pool instead. Either way each output value is the same dot
    // (docs/ARCHITECTURE.md, "Batch invariance").
    let ys: Vec<Vec<f32>> = direct
        .par_iter()
        .map(|(e, users)| expert(*e, false, false, users))
        .collect();
    // Many-token experts: whole experts as tasks too when there are enough
    // of them to keep every thread busy (a 256-token prompt at Flash width
    // meets ~190 per layer; forking and joining each of their three
    // products cost ~3 % of a prefill, and the SwiGLU and quantisation
    // between them ran on one thread), else each product split over the
    // pool. The same values either way.
    let threads = rayon::current_num_threads().max(1);
    let wide_ys: Vec<Vec<f32>> = if wide_jobs.len() >= 4 * threads {
        wide_jobs
            .par_iter()
            .map(|(e, users)| expert(*e, true, false, users))
            .collect()
    } else {
        wide_jobs
            .iter()
            .map(|(e, users)| expert(*e, true, true, users))
            .collect()
    };
    let jobs: Vec<&[usize]> = direct
        .iter()
        .chain(&wide_jobs)
        .map(|(_, u)| &u[..])
        .collect();
    let outs: Vec<&[f32]> = ys.iter().chain(&wide_ys).map(|y| &y[..]).collect();
    sum_experts(n_tokens, kk, d, &jobs, &outs, out);
    true
}

/// Experts with their users (slots): (expert, users).
type Jobs = Vec<(usize, Vec<usize>)>;

/// Each selected expert's users per path: the direct jobs, then the
/// many-token ones. A slot takes the many-token path when at least `many`
/// rows of its own session piece chose the expert.
fn jobs_by_path(
    o: &MoeExperts,
    sel: &[i32],
    segs: &[Segment],
    n_expert: usize,
    many: usize,
) -> (Jobs, Jobs) {
    let n_tokens: usize = segs.iter().map(|s| s.n).sum();
    let kk = o.k;
    // Each token's piece, to count an expert's users per piece.
    let mut piece = vec![0usize; n_tokens];
    for (i, s) in segs.iter().enumerate() {
        piece[s.row0..s.row0 + s.n].fill(i);
    }
    let (mut direct, mut wide) = (Vec::new(), Vec::new());
    let mut per_piece = vec![0usize; segs.len()];
    for e in 0..n_expert {
        let users = o.users(sel, n_tokens, e);
        if users.is_empty() {
            continue;
        }
        per_piece.fill(0);
        for &i in &users {
            per_piece[piece[i / kk]] += 1;
        }
        for path in [false, true] {
            let mine: Vec<usize> = users
                .iter()
                .copied()
                .filter(|&i| (per_piece[piece[i / kk]] >= many) == path)
                .collect();
            if !mine.is_empty() {
                if path { &mut wide } else { &mut direct }.push((e, mine));
            }
        }
    }
    (direct, wide)
}

/// Every token's `kk` slots summed in slot order (the same order whatever
/// ran first): slot `t·kk + i` holds row `j` of job `job` when `jobs[job][j]`
/// is that slot (`outs[job]` token-major, `d` per row), else 0. Tokens run
/// over the pool, each reading its slots' rows where the experts left them
/// (no per-slot buffer: at 2,048 tokens that was 200 MB filled, scattered
/// and summed on one thread).
fn sum_experts(
    n_tokens: usize,
    kk: usize,
    d: usize,
    jobs: &[&[usize]],
    outs: &[&[f32]],
    out: &mut [f32],
) {
    let mut from: Vec<Option<(u32, u32)>> = vec![None; n_tokens * kk];
    for (job, users) in jobs.iter().enumerate() {
        for (j, &slot) in users.iter().enumerate() {
            from[slot] = Some((job as u32, j as u32));
        }
    }
    let per_task = ((1 << 14) / d.max(1)).max(1);
    out[..n_tokens * d]
        .par_chunks_mut(per_task * d)
        .enumerate()
        .for_each(|(c, rows)| {
            for (i, ot) in rows.chunks_exact_mut(d).enumerate() {
                let t = c * per_task + i;
                ot.fill(0.0);
                for src in &from[t * kk..(t + 1) * kk] {
                    match *src {
                        Some((job, j)) => {
                            let (job, j) = (job as usize, j as usize);
                            for (a, &b) in ot.iter_mut().zip(&outs[job][j * d..(j + 1) * d]) {
                                *a += b;
                            }
                        }
                        // An unfilled slot adds 0, as its zeroed row did.
                        None => ot.iter_mut().for_each(|a| *a += 0.0),
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    /// [`super::sum_experts`] against its definition: every slot's row
    /// placed in a zeroed per-slot table, then each token's slots added in
    /// slot order into a zeroed row. Bit for bit, with signed zeros, an
    /// unfilled slot and a token count over several tasks.
    #[test]
    fn expert_sums_follow_slot_order_bit_for_bit() {
        let (n_tokens, kk, d) = (300usize, 3usize, 70usize);
        let mut seed = 0x5eed_u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 1e3;
            // Some signed zeros and values far apart in magnitude, so that
            // the order of the adds shows in the bits.
            match seed >> 60 {
                0 => -0.0,
                1 => v * 1e-6,
                _ => v,
            }
        };
        // Slots dealt to 5 jobs, slot 7 to none.
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); 5];
        for slot in 0..n_tokens * kk {
            if slot != 7 {
                users[(slot * 7 + slot / 5) % 5].push(slot);
            }
        }
        let outs: Vec<Vec<f32>> = users
            .iter()
            .map(|u| (0..u.len() * d).map(|_| next()).collect())
            .collect();
        let jobs: Vec<&[usize]> = users.iter().map(|u| &u[..]).collect();
        let outs_ref: Vec<&[f32]> = outs.iter().map(|o| &o[..]).collect();
        let mut want = vec![0f32; n_tokens * d];
        let mut table = vec![0f32; n_tokens * kk * d];
        for (u, y) in users.iter().zip(&outs) {
            for (j, &slot) in u.iter().enumerate() {
                table[slot * d..(slot + 1) * d].copy_from_slice(&y[j * d..(j + 1) * d]);
            }
        }
        for t in 0..n_tokens {
            let ot = &mut want[t * d..(t + 1) * d];
            ot.fill(0.0);
            for i in 0..kk {
                for (a, &b) in ot
                    .iter_mut()
                    .zip(&table[(t * kk + i) * d..(t * kk + i + 1) * d])
                {
                    *a += b;
                }
            }
        }
        let mut got = vec![f32::NAN; n_tokens * d];
        super::sum_experts(n_tokens, kk, d, &jobs, &outs_ref, &mut got);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }
}
