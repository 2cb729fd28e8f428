//! The prefill GEMM over Q8_K activations for the q2 mix's routed-expert
//! formats (IQ2_XXS, Q2_K) on the AVX2 path: a micro-kernel computes
//! [`MR`] decoded weight rows × up to [`NR`] tokens, and every (row, token)
//! value is **bit for bit** the one the 1-row decode kernel gives
//! (`avx2::iq2xxs`, `avx2::q2k`), so prefill and decode agree on these
//! rows and a token's result does not depend on the path its piece took.
//!
//! Why it is faster than the Q8x32 tile ([`super::gemm`]): the integer sums
//! run over a whole 256-value super-block, as in the 1-row kernels, and the
//! f32 work (convert, scale product, FMA) happens once per super-block
//! instead of once per 32 values. Per (row, token) and 32 values that leaves
//! `maddubs`, `madd`, `add`: three instructions, two of them on the
//! multiply pipes, against six on the Q8x32 tile.
//!
//! * **IQ2_XXS**: the row's signed codes (±grid, |w| ≤ 43) are the signed
//!   operand, the activations plus 128 the unsigned one (at most 2·255·43
//!   per i16 pair: no saturation), `madd` against the group's `2s + 1`. The
//!   activations' 128 adds `128·Σ_g (2s_g + 1)·Σ w` per lane, which the row
//!   carries precomputed ([`KRow::bias`]) and the kernel subtracts once per
//!   super-block: the same integers as the 1-row kernel's sign trick.
//! * **Q2_K**: the codes `sc·q` (≤ 45, unsigned) against the signed
//!   activations, `madd` against ones (the 1-row kernel multiplies by `sc`
//!   in the `madd`; the sums are the same integers), the minimum terms from
//!   the activations' per-16 sums, as the 1-row kernel does.

use std::cell::RefCell;

use super::act::Acts;
use super::Isa;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::GgmlType;

/// Weight rows per micro-kernel call.
pub const MR: usize = 4;
/// Tokens per micro-kernel call.
pub const NR: usize = 2;

/// Whether the kernel set `isa` runs `ty`'s prefill products here (with
/// Q8_K activations). Only the AVX2 set: its 1-row kernels are the ones
/// these tiles reproduce bit for bit.
pub fn handles(isa: Isa, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && isa == Isa::Avx2
        && matches!(ty, GgmlType::Iq2Xxs | GgmlType::Q2K)
}

/// One weight row decoded for the tiles: the codes (the bytes
/// [`super::expand`] gives), and per
/// super-block what the 1-row kernel reads from the block's header.
pub struct KRow {
    /// Codes, `n` (IQ2_XXS: ±grid; Q2_K: `sc·q`).
    pub codes: Vec<i8>,
    /// The block's f16 scale as f32 (Q2_K: `d`), per super-block.
    pub d: Vec<f32>,
    /// Q2_K: the f16 `dmin` as f32, per super-block.
    pub dmin: Vec<f32>,
    /// IQ2_XXS: per 32 values, `2s + 1` in both i16 halves.
    pub ls: Vec<i32>,
    /// IQ2_XXS: per super-block, 8 lanes of `128·Σ_g (2s_g + 1)·Σ w` (lane
    /// `l` sums bytes `4l..4l + 4` of every group).
    pub bias: Vec<i32>,
    /// Q2_K: per super-block, the 16 sub-block minimums (`sc >> 4`).
    pub mins: Vec<i16>,
}

impl KRow {
    pub fn new(n: usize) -> KRow {
        KRow {
            codes: vec![0; n],
            d: vec![0.0; n / 256],
            dmin: vec![0.0; n / 256],
            ls: vec![0; n / 32],
            bias: vec![0; n / 32],
            mins: vec![0; n / 16],
        }
    }
}

/// Decodes one row of `ty` (IQ2_XXS or Q2_K) into `k` (sized for it).
pub fn decode(ty: GgmlType, row: &[u8], k: &mut KRow) {
    let n = k.codes.len();
    assert!(row.len() == n / 256 * ty.block_bytes() && n % 256 == 0);
    assert!(k.d.len() == n / 256 && k.dmin.len() == n / 256);
    assert!(k.ls.len() == n / 32 && k.bias.len() == n / 32 && k.mins.len() == n / 16);
    #[cfg(target_arch = "x86_64")]
    {
        assert!(Isa::Avx2.supported() && handles(Isa::Avx2, ty));
        // SAFETY: AVX2 checked; the asserts above bound every block read
        // and every write.
        unsafe {
            match ty {
                GgmlType::Iq2Xxs => x86::decode_iq2xxs(row, k),
                _ => x86::decode_q2k(row, k),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, row, k);
        unreachable!("ktile::handles is false off x86-64");
    }
}

thread_local! {
    /// Per-thread scratch: the decoded rows of the current row block.
    static ROWS: RefCell<Vec<KRow>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's `rows` decoded rows of `n` values (allocated
/// on first use and when the width changes; fresh ones if the scratch is
/// already in use further up this thread's stack).
pub fn with_rows<R>(rows: usize, n: usize, f: impl FnOnce(&mut [KRow]) -> R) -> R {
    let fresh = |rows| (0..rows).map(|_| KRow::new(n)).collect::<Vec<_>>();
    ROWS.with(|t| match t.try_borrow_mut() {
        Ok(mut t) => {
            if t.len() < rows || t.first().is_some_and(|k| k.codes.len() != n) {
                *t = fresh(rows);
            }
            f(&mut t[..rows])
        }
        Err(_) => f(&mut fresh(rows)),
    })
}

/// The activations of a product as the tiles read them: the Q8_K blocks,
/// and for IQ2_XXS every code plus 128 as a byte (row `a` at `xu[a·n..]`).
#[derive(Default)]
pub struct KActs {
    pub xu: Vec<u8>,
}

impl KActs {
    pub fn pack(&mut self, ty: GgmlType, blocks: &[BlockQ8K]) {
        self.xu.clear();
        if ty == GgmlType::Iq2Xxs {
            for b in blocks {
                self.xu.extend(b.qs.iter().map(|&q| (q as u8) ^ 0x80));
            }
        }
    }
}

/// `out[r][t]` = the 1-row kernel's dot of `rows[r]` with activation row
/// `toks[t]` of `blocks` (`per_row` blocks each), for `rows.len() ≤ MR`,
/// `toks.len() ≤ NR`.
pub fn tile(
    ty: GgmlType,
    rows: &[KRow],
    blocks: &[BlockQ8K],
    per_row: usize,
    packed: &KActs,
    toks: &[usize],
    out: &mut [[f32; NR]; MR],
) {
    let n = per_row * 256;
    assert!(rows.len() <= MR && toks.len() <= NR);
    for k in rows {
        assert!(k.codes.len() == n && k.d.len() == per_row);
        assert!(k.ls.len() == n / 32 && k.bias.len() == n / 32 && k.mins.len() == n / 16);
    }
    for &a in toks {
        assert!((a + 1) * per_row <= blocks.len());
        if ty == GgmlType::Iq2Xxs {
            assert!((a + 1) * n <= packed.xu.len());
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert!(Isa::Avx2.supported() && handles(Isa::Avx2, ty));
        // SAFETY: the features were checked; the asserts above bound every
        // pointer the kernels read.
        unsafe {
            match ty {
                GgmlType::Iq2Xxs => x86::iq2xxs(rows, blocks, per_row, packed, toks, out),
                _ => x86::q2k(rows, blocks, per_row, toks, out),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows, blocks, packed, out);
        unreachable!("ktile::handles is false off x86-64");
    }
}

/// [`Acts::Q8K`]'s blocks and row length (the tiles' activations).
pub fn q8k<'a>(acts: &'a Acts<'_>) -> Option<(&'a [BlockQ8K], usize)> {
    match acts {
        Acts::Q8K { blocks, per_row } => Some((blocks, *per_row)),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(clippy::needless_range_loop)]
    use super::super::avx2;
    use super::{BlockQ8K, KActs, KRow, MR, NR};
    use std::arch::x86_64::*;

    /// Instantiates `$k::<R, T>` for 1..=MR rows and 1..=NR tokens.
    macro_rules! dispatch {
        ($k:ident, $rows:expr, $toks:expr, ($($arg:expr),*)) => {{
            macro_rules! with_rows {
                ($r:literal) => {
                    match $toks.len() {
                        1 => $k::<$r, 1>($($arg),*),
                        2 => $k::<$r, 2>($($arg),*),
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

    pub unsafe fn iq2xxs(
        rows: &[KRow],
        blocks: &[BlockQ8K],
        per_row: usize,
        packed: &KActs,
        toks: &[usize],
        out: &mut [[f32; NR]; MR],
    ) {
        dispatch!(
            iq2xxs_rt,
            rows,
            toks,
            (rows, blocks, per_row, packed, toks, out)
        );
    }

    pub unsafe fn q2k(
        rows: &[KRow],
        blocks: &[BlockQ8K],
        per_row: usize,
        toks: &[usize],
        out: &mut [[f32; NR]; MR],
    ) {
        dispatch!(q2k_rt, rows, toks, (rows, blocks, per_row, toks, out));
    }

    /// One IQ2_XXS row: the codes (`sign · grid`, the expanded rows' bytes),
    /// `2s + 1` per group and the bias per super-block (per group,
    /// `madd(maddubs(1, w), 2s + 1)` gives each lane's `(2s + 1)·Σ w`),
    /// with the 1-row kernel's sign computation ([`avx2::iq2xxs_words`]).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_iq2xxs(row: &[u8], k: &mut KRow) {
        let ones = _mm256_set1_epi8(1);
        for i in 0..row.len() / 66 {
            let b = row.as_ptr().add(66 * i);
            k.d[i] = avx2::f16_at(b);
            let (ks, ls) = avx2::iq2xxs_words(b);
            _mm256_storeu_si256(k.ls.as_mut_ptr().add(8 * i) as *mut __m256i, ls);
            let mut bias = _mm256_setzero_si256();
            for g in 0..8 {
                let (grid, signs, scale) = avx2::iq2xxs_group(b, ks, ls, g);
                let w = _mm256_sign_epi8(grid, signs);
                let dst = k.codes.as_mut_ptr().add(256 * i + 32 * g);
                _mm256_storeu_si256(dst as *mut __m256i, w);
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, w), scale);
                bias = _mm256_add_epi32(bias, s);
            }
            let out = k.bias.as_mut_ptr().add(8 * i) as *mut __m256i;
            _mm256_storeu_si256(out, _mm256_slli_epi32(bias, 7));
        }
    }

    /// One Q2_K row: the codes `sc·q` (the expanded rows' bytes), `d`,
    /// `dmin` and the 16 minimums per super-block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_q2k(row: &[u8], k: &mut KRow) {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0xF);
        for i in 0..row.len() / 84 {
            let b = row.as_ptr().add(84 * i);
            k.d[i] = avx2::f16_at(b.add(80));
            k.dmin[i] = avx2::f16_at(b.add(82));
            let sc = _mm_loadu_si128(b as *const __m128i);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
            _mm256_storeu_si256(k.mins.as_mut_ptr().add(16 * i) as *mut __m256i, mins);
            for h in 0..2 {
                let mut q = _mm256_loadu_si256(b.add(16 + 32 * h) as *const __m256i);
                for j in 0..4 {
                    let sub = 8 * h + 2 * j;
                    let v = _mm256_and_si256(q, m3);
                    q = _mm256_srli_epi16(q, 2);
                    // Per 16-bit word (two codes ≤ 3) times the sub-block
                    // scale (≤ 15): each byte's product stays below 256.
                    let sc = _mm256_set_m128i(
                        _mm_set1_epi16((*b.add(sub + 1) & 15) as i16),
                        _mm_set1_epi16((*b.add(sub) & 15) as i16),
                    );
                    let dst = k.codes.as_mut_ptr().add(256 * i + 16 * sub);
                    _mm256_storeu_si256(dst as *mut __m256i, _mm256_mullo_epi16(v, sc));
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq2xxs_rt<const R: usize, const T: usize>(
        rows: &[KRow],
        blocks: &[BlockQ8K],
        per_row: usize,
        packed: &KActs,
        toks: &[usize],
        out: &mut [[f32; NR]; MR],
    ) {
        let n = per_row * 256;
        let w: [*const i8; R] = std::array::from_fn(|r| rows[r].codes.as_ptr());
        let ls: [*const i32; R] = std::array::from_fn(|r| rows[r].ls.as_ptr());
        let xu: [*const u8; T] = std::array::from_fn(|t| packed.xu.as_ptr().add(toks[t] * n));
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for i in 0..per_row {
            let mut sumi = [[_mm256_setzero_si256(); T]; R];
            for g in 0..8 {
                let c = 8 * i + g;
                let l: [__m256i; R] = std::array::from_fn(|r| _mm256_set1_epi32(*ls[r].add(c)));
                let x: [__m256i; T] =
                    std::array::from_fn(
                        |t| _mm256_loadu_si256(xu[t].add(32 * c) as *const __m256i),
                    );
                for r in 0..R {
                    let wv = _mm256_loadu_si256(w[r].add(32 * c) as *const __m256i);
                    for t in 0..T {
                        let p = _mm256_maddubs_epi16(x[t], wv);
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(p, l[r]));
                    }
                }
            }
            for r in 0..R {
                let bias = _mm256_loadu_si256(rows[r].bias.as_ptr().add(8 * i) as *const __m256i);
                for t in 0..T {
                    let a = &blocks[toks[t] * per_row + i];
                    let d = rows[r].d[i] * a.d * 0.125;
                    let s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r][t], bias));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc[r][t]);
                }
            }
        }
        for r in 0..R {
            for t in 0..T {
                out[r][t] = avx2::hsum_ps(acc[r][t]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q2k_rt<const R: usize, const T: usize>(
        rows: &[KRow],
        blocks: &[BlockQ8K],
        per_row: usize,
        toks: &[usize],
        out: &mut [[f32; NR]; MR],
    ) {
        let ones = _mm256_set1_epi16(1);
        let w: [*const i8; R] = std::array::from_fn(|r| rows[r].codes.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut accm = [[_mm256_setzero_ps(); T]; R];
        for i in 0..per_row {
            let a: [&BlockQ8K; T] = std::array::from_fn(|t| &blocks[toks[t] * per_row + i]);
            let mut sumi = [[_mm256_setzero_si256(); T]; R];
            for c in 0..8 {
                for r in 0..R {
                    let wv = _mm256_loadu_si256(w[r].add(256 * i + 32 * c) as *const __m256i);
                    for t in 0..T {
                        let x = _mm256_loadu_si256(a[t].qs.as_ptr().add(32 * c) as *const __m256i);
                        let p = _mm256_maddubs_epi16(wv, x);
                        sumi[r][t] = _mm256_add_epi32(sumi[r][t], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            for r in 0..R {
                let mins = _mm256_loadu_si256(rows[r].mins.as_ptr().add(16 * i) as *const __m256i);
                for t in 0..T {
                    let d = rows[r].d[i] * a[t].d;
                    let dmin = rows[r].dmin[i] * a[t].d;
                    let bsums = _mm256_loadu_si256(a[t].bsums.as_ptr() as *const __m256i);
                    let pm = _mm256_madd_epi16(mins, bsums);
                    acc[r][t] = _mm256_fmadd_ps(
                        _mm256_set1_ps(d),
                        _mm256_cvtepi32_ps(sumi[r][t]),
                        acc[r][t],
                    );
                    accm[r][t] =
                        _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm[r][t]);
                }
            }
        }
        for r in 0..R {
            for t in 0..T {
                out[r][t] = avx2::hsum_ps(acc[r][t]) - avx2::hsum_ps(accm[r][t]);
            }
        }
    }
}
