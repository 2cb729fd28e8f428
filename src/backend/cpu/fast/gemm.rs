//! The prefill GEMM: a micro-kernel computes a block of up to [`MR`] decoded
//! weight rows ([`super::expand`]) × [`nr`] tokens at once, every partial sum
//! in its own register, so each weight vector is loaded once per token group
//! and each activation vector once per row group (instead of once per
//! (row, token) pair), and the horizontal sums happen once per block.
//!
//! Inputs: the rows as int8 codes with an f32 scale per 32 values (the
//! K-quants' per-16 offsets are added by the caller), the tokens as
//! [`Packed`] activations (Q8x32 codes contiguous per token). Per 32 values
//! the integer sum is exact and meets `scale_row · d_token` in one f32 FMA —
//! the same products as the per-pair kernels, summed in another order.
//!
//! Paths ([`Isa`]):
//! * **avx512** (AVX-512 F/BW + VNNI): 4 rows × 4 tokens, 64 values per
//!   step, `vpdpbusd` (u8 × i8 → i32 with no intermediate saturation). The
//!   weights become the unsigned operand by flipping their sign bit
//!   (`w + 128`); the resulting `128·Σx` is removed exactly by starting each
//!   sum from the token's precomputed `−128·Σx` per 4-value lane
//!   ([`Packed::bias`]).
//! * **avx2**: 4 rows × 2 tokens per call, run as two passes of 2 rows (2 ×
//!   2 pairs × even and odd blocks: 8 accumulators in registers), 32 values
//!   per step, `maddubs` on |w| against x with w's signs, then `madd` (the
//!   classic sign trick: at most 2·128·127 per i16 pair, no saturation); the
//!   scale products `s·d` made 8 blocks per instruction ahead of each chunk
//!   of 64 blocks. The q2 mix's expert formats take [`super::ktile`] there.
//! * **portable**: the same sums in plain Rust, one pair at a time.

use std::cell::RefCell;

use super::act::BlockQ8x32;
use super::expand::Expanded;
use super::Isa;

/// Weight rows per micro-kernel call.
pub const MR: usize = 4;
/// Largest token count per micro-kernel call on any path.
pub const NR_MAX: usize = 4;

/// The micro-kernel a kernel set's path runs: the avx512 tile needs
/// AVX512-VNNI (`vpdpbusd`), which the avx512 decode path does not (its BW
/// variant serves AVX-512 CPUs without VNNI): those get the AVX2 tile. NEON
/// has no GEMM tile yet and runs the portable one.
pub fn path(isa: Isa) -> Isa {
    match isa {
        Isa::Avx512 if vnni() => Isa::Avx512,
        Isa::Avx512 => Isa::Avx2,
        Isa::Neon => Isa::Portable,
        other => other,
    }
}

#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    use std::sync::OnceLock;
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| Isa::Avx512.supported() && is_x86_feature_detected!("avx512vnni"))
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni() -> bool {
    false
}

/// Tokens per micro-kernel call on `isa`.
pub fn nr(isa: Isa) -> usize {
    match path(isa) {
        Isa::Avx2 => 2,
        _ => 4,
    }
}

/// Activation rows packed for the micro-kernels: row `a`'s codes at
/// `qs[a·n..]`, its block scales at `d[a·n/32..]` and, on the avx512 path,
/// `bias[a·n/4 + l] = −128 · Σ qs[a·n + 4l .. 4l+4]`.
#[derive(Default)]
pub struct Packed {
    pub n: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub bias: Vec<i32>,
}

impl Packed {
    /// Packs all rows of `blocks` (`per_row` Q8x32 blocks each), reusing
    /// this set's buffers.
    pub fn pack(&mut self, isa: Isa, blocks: &[BlockQ8x32], per_row: usize) {
        use rayon::prelude::*;
        let isa = path(isa);
        self.n = per_row * 32;
        self.qs.clear();
        self.d.clear();
        self.bias.clear();
        // Spread over the pool in runs of blocks (a 2,048-token product's
        // 8 MiB of codes were copied on one thread while the other waited).
        const RUN: usize = 1024;
        self.qs.resize(blocks.len() * 32, 0);
        self.d.resize(blocks.len(), 0.0);
        let copy = |(b, (qs, d)): (&[BlockQ8x32], (&mut [i8], &mut [f32]))| {
            for ((blk, q), d) in b.iter().zip(qs.chunks_exact_mut(32)).zip(d) {
                q.copy_from_slice(&blk.qs);
                *d = blk.d;
            }
        };
        if blocks.len() < 4 * RUN {
            copy((blocks, (&mut self.qs[..], &mut self.d[..])));
        } else {
            blocks
                .par_chunks(RUN)
                .zip(
                    self.qs
                        .par_chunks_mut(32 * RUN)
                        .zip(self.d.par_chunks_mut(RUN)),
                )
                .for_each(copy);
        }
        if isa == Isa::Avx512 {
            self.bias.extend(
                self.qs
                    .chunks_exact(4)
                    .map(|c| -128 * c.iter().map(|&q| q as i32).sum::<i32>()),
            );
        }
    }
}

thread_local! {
    /// Per-thread scratch: the decoded rows of the current row block.
    static TILE: RefCell<Vec<Expanded>> = const { RefCell::new(Vec::new()) };
    /// Per-thread scratch: the packed activations of the current product.
    static PACKED: RefCell<Packed> = RefCell::new(Packed::default());
}

/// Runs `f` with this thread's tile of `rows` decoded rows of `n` values
/// (allocated on first use and when the width changes; a fresh one if the
/// scratch is already in use further up this thread's stack).
pub fn with_tile<R>(rows: usize, n: usize, f: impl FnOnce(&mut [Expanded]) -> R) -> R {
    let fresh = |rows| (0..rows).map(|_| Expanded::new(n)).collect::<Vec<_>>();
    TILE.with(|t| match t.try_borrow_mut() {
        Ok(mut t) => {
            if t.len() < rows || t.first().is_some_and(|e| e.codes.len() != n) {
                *t = fresh(rows);
            }
            f(&mut t[..rows])
        }
        Err(_) => f(&mut fresh(rows)),
    })
}

/// Runs `f` with this thread's activation scratch packed from `blocks`.
pub fn with_packed<R>(
    isa: Isa,
    blocks: &[BlockQ8x32],
    per_row: usize,
    f: impl FnOnce(&Packed) -> R,
) -> R {
    PACKED.with(|p| match p.try_borrow_mut() {
        Ok(mut p) => {
            p.pack(isa, blocks, per_row);
            f(&p)
        }
        Err(_) => {
            let mut p = Packed::default();
            p.pack(isa, blocks, per_row);
            f(&p)
        }
    })
}

/// `out[r][t] = Σ_b rows[r].scale[b] · acts.d[toks[t]][b] · (codes · qs)_b`
/// for `rows.len() ≤ MR` rows and `toks.len() ≤ nr(isa)` activation rows.
pub fn tile(
    isa: Isa,
    rows: &[Expanded],
    acts: &Packed,
    toks: &[usize],
    out: &mut [[f32; NR_MAX]; MR],
) {
    let isa = path(isa);
    let n = acts.n;
    assert!(rows.len() <= MR && toks.len() <= nr(isa) && n % 32 == 0);
    for e in rows {
        assert!(e.codes.len() == n && e.scale.len() == n / 32);
    }
    for &a in toks {
        assert!((a + 1) * n <= acts.qs.len() && (a + 1) * n / 32 <= acts.d.len());
        if isa == Isa::Avx512 {
            assert!((a + 1) * n / 4 <= acts.bias.len());
        }
    }
    match isa {
        Isa::Portable => portable(rows, acts, toks, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(Isa::Avx2.supported());
            // SAFETY: the features were checked; the asserts above bound
            // every pointer the kernel reads.
            unsafe { x86::avx2(rows, acts, toks, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(vnni());
            // SAFETY: as above.
            unsafe { x86::avx512(rows, acts, toks, out) }
        }
        _ => portable(rows, acts, toks, out),
    }
}

fn portable(rows: &[Expanded], acts: &Packed, toks: &[usize], out: &mut [[f32; NR_MAX]; MR]) {
    let n = acts.n;
    for (r, e) in rows.iter().enumerate() {
        for (t, &a) in toks.iter().enumerate() {
            let qs = &acts.qs[a * n..(a + 1) * n];
            let d = &acts.d[a * n / 32..(a + 1) * n / 32];
            let mut acc = 0f32;
            let blocks = e.codes.chunks_exact(32).zip(qs.chunks_exact(32));
            for ((w, x), (&s, &d)) in blocks.zip(e.scale.iter().zip(d)) {
                let (w, x): (&[i8; 32], &[i8; 32]) =
                    (w.try_into().expect("32"), x.try_into().expect("32"));
                let i: i32 = (0..32).map(|k| w[k] as i32 * x[k] as i32).sum();
                acc += s * d * i as f32;
            }
            out[r][t] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(clippy::needless_range_loop)]
    use super::{Expanded, Packed, MR, NR_MAX};
    use std::arch::x86_64::*;

    /// Instantiates `$k::<R, T>` for the runtime sizes (1..=4 rows, tokens
    /// as listed).
    macro_rules! dispatch {
        ($k:ident, $rows:expr, $acts:expr, $toks:expr, $out:expr, [$($t:literal),*]) => {{
            macro_rules! with_rows {
                ($r:literal) => {
                    match $toks.len() {
                        $( $t => $k::<$r, $t>($rows, $acts, $toks, $out), )*
                        _ => {}
                    }
                };
            }
            match $rows.len() {
                1 => with_rows!(1),
                2 => with_rows!(2),
                3 => with_rows!(3),
                4 => with_rows!(4),
                _ => {}
            }
        }};
    }

    pub unsafe fn avx2(
        rows: &[Expanded],
        acts: &Packed,
        toks: &[usize],
        out: &mut [[f32; NR_MAX]; MR],
    ) {
        dispatch!(mk_avx2, rows, acts, toks, out, [1, 2]);
    }

    pub unsafe fn avx512(
        rows: &[Expanded],
        acts: &Packed,
        toks: &[usize],
        out: &mut [[f32; NR_MAX]; MR],
    ) {
        dispatch!(mk_avx512, rows, acts, toks, out, [1, 2, 3, 4]);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Blocks per chunk of [`pairs_avx2`]: the chunk's scale products
    /// (`R·T·CHUNK` f32, 1 KiB for 2 × 2) sit on the stack.
    const CHUNK: usize = 64;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn mk_avx2<const R: usize, const T: usize>(
        rows: &[Expanded],
        acts: &Packed,
        toks: &[usize],
        out: &mut [[f32; NR_MAX]; MR],
    ) {
        // Rows two at a time: 2 rows × 2 tokens × (even, odd) accumulators
        // are 8 registers, which leaves room for the operands (4 rows kept
        // 16 accumulators, spilled and reloaded around every FMA).
        let mut r = 0;
        while r < R {
            let mut o = [[0f32; T]; 2];
            if R - r >= 2 {
                pairs_avx2::<2, T>(&rows[r..r + 2], acts, toks, &mut o);
            } else {
                pairs_avx2::<1, T>(&rows[r..r + 1], acts, toks, &mut o[..1]);
            }
            for (i, row) in o.iter().enumerate().take((R - r).min(2)) {
                out[r + i][..T].copy_from_slice(row);
            }
            r += 2;
        }
    }

    /// `R` rows × `T` tokens. Even blocks into `acc`, odd blocks into
    /// `acc_odd`, added at the end: the order of the direct AVX2 Q8_0 kernel
    /// (`avx2::q8_0`), so that a Q8_0 product gives the same bits on both
    /// paths and a session's logits do not depend on how its prompt was cut
    /// into pieces (batched prefill quanta, echo scoring). The scale
    /// products `s_r·d_t` are made 8 blocks per instruction ahead of each
    /// chunk (the same f32 products), so that a (row, token, block) costs a
    /// broadcast load instead of a scalar multiply and a shuffle.
    #[inline(always)]
    unsafe fn pairs_avx2<const R: usize, const T: usize>(
        rows: &[Expanded],
        acts: &Packed,
        toks: &[usize],
        out: &mut [[f32; T]],
    ) {
        let n = acts.n;
        let nb = n / 32;
        let w: [*const i8; R] = std::array::from_fn(|r| rows[r].codes.as_ptr());
        let ws: [*const f32; R] = std::array::from_fn(|r| rows[r].scale.as_ptr());
        let x: [*const i8; T] = std::array::from_fn(|t| acts.qs.as_ptr().add(toks[t] * n));
        let xd: [*const f32; T] = std::array::from_fn(|t| acts.d.as_ptr().add(toks[t] * n / 32));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut acc_odd = [[_mm256_setzero_ps(); T]; R];
        let mut prod = [[[0f32; CHUNK]; T]; R];
        let mut b0 = 0;
        while b0 < nb {
            let m = (nb - b0).min(CHUNK);
            for r in 0..R {
                for t in 0..T {
                    let (s, d, p) = (ws[r].add(b0), xd[t].add(b0), prod[r][t].as_mut_ptr());
                    let mut j = 0;
                    while j + 8 <= m {
                        let v = _mm256_mul_ps(_mm256_loadu_ps(s.add(j)), _mm256_loadu_ps(d.add(j)));
                        _mm256_storeu_ps(p.add(j), v);
                        j += 8;
                    }
                    while j < m {
                        *p.add(j) = *s.add(j) * *d.add(j);
                        j += 1;
                    }
                }
            }
            // A macro, not a closure: a closure would not inherit this
            // function's target features, and its intrinsics would become
            // calls.
            macro_rules! step {
                ($j:expr, $acc:expr) => {{
                    let j = $j;
                    let b = b0 + j;
                    let xv: [__m256i; T] = std::array::from_fn(|t| {
                        _mm256_loadu_si256(x[t].add(32 * b) as *const __m256i)
                    });
                    for r in 0..R {
                        let wv = _mm256_loadu_si256(w[r].add(32 * b) as *const __m256i);
                        let aw = _mm256_sign_epi8(wv, wv);
                        for t in 0..T {
                            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv));
                            let i = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                            let sd = _mm256_broadcast_ss(&prod[r][t][j]);
                            $acc[r][t] = _mm256_fmadd_ps(i, sd, $acc[r][t]);
                        }
                    }
                }};
            }
            // CHUNK is even: block b0 + j is even exactly when j is.
            let mut j = 0;
            while j + 1 < m {
                step!(j, acc);
                step!(j + 1, acc_odd);
                j += 2;
            }
            if j < m {
                step!(j, acc);
            }
            b0 += m;
        }
        for r in 0..R {
            for t in 0..T {
                out[r][t] = hsum256(_mm256_add_ps(acc[r][t], acc_odd[r][t]));
            }
        }
    }

    /// Two consecutive block scales at `p` as 8 + 8 lanes (one scale when
    /// `one`: the upper 8 lanes are 0).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    unsafe fn scales2(p: *const f32, one: bool) -> __m512 {
        let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let v = if one {
            _mm_load_ss(p)
        } else {
            _mm_castpd_ps(_mm_load_sd(p as *const f64))
        };
        _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(v))
    }

    /// One step of 64 values (32 when `half`: masked loads, zeros above).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step512<const R: usize, const T: usize>(
        c: usize,
        half: bool,
        w: &[*const i8; R],
        ws: &[*const f32; R],
        x: &[*const i8; T],
        xd: &[*const f32; T],
        xb: &[*const i32; T],
        acc: &mut [[__m512; T]; R],
    ) {
        let flip = _mm512_set1_epi8(-128);
        let (mb, mi): (__mmask64, __mmask16) = if half {
            (u32::MAX as u64, 0xFF)
        } else {
            (u64::MAX, 0xFFFF)
        };
        let mut wv = [_mm512_setzero_si512(); R];
        let mut sv = [_mm512_setzero_ps(); R];
        for r in 0..R {
            wv[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mb, w[r].add(64 * c)), flip);
            sv[r] = scales2(ws[r].add(2 * c), half);
        }
        for t in 0..T {
            let xv = _mm512_maskz_loadu_epi8(mb, x[t].add(64 * c));
            let bv = _mm512_maskz_loadu_epi32(mi, xb[t].add(16 * c));
            let dv = scales2(xd[t].add(2 * c), half);
            for r in 0..R {
                let i = _mm512_dpbusd_epi32(bv, wv[r], xv);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(sv[r], dv), acc[r][t]);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    unsafe fn mk_avx512<const R: usize, const T: usize>(
        rows: &[Expanded],
        acts: &Packed,
        toks: &[usize],
        out: &mut [[f32; NR_MAX]; MR],
    ) {
        let n = acts.n;
        let w: [*const i8; R] = std::array::from_fn(|r| rows[r].codes.as_ptr());
        let ws: [*const f32; R] = std::array::from_fn(|r| rows[r].scale.as_ptr());
        let x: [*const i8; T] = std::array::from_fn(|t| acts.qs.as_ptr().add(toks[t] * n));
        let xd: [*const f32; T] = std::array::from_fn(|t| acts.d.as_ptr().add(toks[t] * n / 32));
        let xb: [*const i32; T] = std::array::from_fn(|t| acts.bias.as_ptr().add(toks[t] * n / 4));
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        for c in 0..n / 64 {
            step512(c, false, &w, &ws, &x, &xd, &xb, &mut acc);
        }
        if n % 64 != 0 {
            step512(n / 64, true, &w, &ws, &x, &xd, &xb, &mut acc);
        }
        for r in 0..R {
            for t in 0..T {
                out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
            }
        }
    }
}
