//! The portable dot-product kernels: plain Rust integer arithmetic, the same
//! sums the SIMD kernels compute (exact per block, scaled once per block),
//! so every path agrees with this one up to f32 summation order.

use super::act::BlockQ8x32;
use crate::quant::f16::f16_bits_to_f32;
use crate::quant::mxfp4::{e8m0_to_f32_half, KVALUES};
use crate::quant::q4_k::unpack_scales;
use crate::quant::q8_k::BlockQ8K;
use crate::quant::{iq2_xxs, q2_k};

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

pub fn q2k(row: &[u8], y: &[BlockQ8K]) -> f32 {
    q2_k::dot_q8k(row, y)
}

pub fn iq2xxs(row: &[u8], y: &[BlockQ8K]) -> f32 {
    iq2_xxs::dot_q8k(row, y)
}

/// Q4_K: per 32-value sub-block `sc·Σ q·a`, the min term through `bsums`.
pub fn q4k(row: &[u8], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in row.chunks_exact(144).zip(y) {
        let d = f16_at(b, 0) * a.d;
        let dmin = f16_at(b, 2) * a.d;
        let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
        let (sc, m) = unpack_scales(scales);
        let qs = &b[16..144];
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for c in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * c + l];
                lo += (q & 15) as i32 * a.qs[64 * c + l] as i32;
                hi += (q >> 4) as i32 * a.qs[64 * c + 32 + l] as i32;
            }
            sum_q += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
        }
        for (j, &mj) in m.iter().enumerate() {
            sum_m += mj as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
        }
        acc += d * sum_q as f32 - dmin * sum_m as f32;
    }
    acc
}

pub fn q8_0(row: &[u8], y: &[BlockQ8x32]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in row.chunks_exact(34).zip(y) {
        let s: i32 = b[2..34]
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| w as i8 as i32 * x as i32)
            .sum();
        acc += f16_at(b, 0) * a.d * s as f32;
    }
    acc
}

pub fn mxfp4(row: &[u8], y: &[BlockQ8x32]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in row.chunks_exact(17).zip(y) {
        let mut s = 0i32;
        for (l, &q) in b[1..17].iter().enumerate() {
            s += KVALUES[(q & 15) as usize] as i32 * a.qs[l] as i32;
            s += KVALUES[(q >> 4) as usize] as i32 * a.qs[l + 16] as i32;
        }
        acc += e8m0_to_f32_half(b[0]) * a.d * s as f32;
    }
    acc
}

pub fn f32(row: &[u8], x: &[f32]) -> f32 {
    crate::quant::f16::dot_row_f32(row, x)
}

pub fn f16(row: &[u8], x: &[f32]) -> f32 {
    crate::quant::f16::dot_row_f16(row, x)
}

pub fn bf16(row: &[u8], x: &[f32]) -> f32 {
    crate::quant::f16::dot_row_bf16(row, x)
}

pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}
