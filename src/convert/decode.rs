//! The checkpoints' number formats, decoded exactly (QUANTS.md §10,
//! GGUF.md §10):
//!
//! * FP8 E4M3 weights with E8M0 (or f32) scales over `br × bc` blocks: V4
//!   128 × 128, V4.1 32 × 32 (the block is read off the two shapes);
//! * FP4 E2M1 routed experts, two codes a byte (element `2j` in the low
//!   nibble of byte `j`), one E8M0 scale per 32 along a row;
//! * BF16 / F16 / F32 / F64 widened, I64 / I32 narrowed to i32.
//!
//! Every value is produced as an f32 that equals the stored value (FP8 ×
//! scale and FP4 × scale are exact in f32 for every finite input), so a
//! conversion to F32 or BF16 loses nothing. NaN codes and NaN scales are
//! errors naming the tensor and the position: a real weight never holds one.
//! FP4 experts also repack to GGUF MXFP4 without going through f32.

use super::safetensors::{Checkpoint, Dtype, HfTensor};
use super::ConvertError;
use crate::quant::f16::{bf16_bits_to_f32, f16_bits_to_f32};
use crate::quant::mxfp4::BlockMxfp4;
use crate::quant::small_float::{e2m1_decode, e4m3_decode, e8m0_decode};

/// How a logical `[rows, cols]` matrix is stored.
#[derive(Clone, Copy)]
pub enum Encoding<'a> {
    /// F32 / F16 / BF16 / F64 values.
    Float,
    /// E4M3 codes, scales `[ceil(rows/br), ceil(cols/bc)]`.
    Fp8 {
        scale: HfTensor<'a>,
        br: usize,
        bc: usize,
    },
    /// Packed E2M1 codes `[rows, cols/2]`, E8M0 scales `[rows, cols/32]`.
    Fp4 { scale: HfTensor<'a> },
    /// I64 / I32 integers.
    Int,
}

/// One checkpoint tensor read as a logical `[rows, cols]` matrix.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub weight: HfTensor<'a>,
    pub enc: Encoding<'a>,
    pub rows: usize,
    pub cols: usize,
}

/// The name of a weight's scale tensor: `.weight` → `.scale`.
pub fn scale_name(weight: &str) -> String {
    match weight.strip_suffix(".weight") {
        Some(stem) => format!("{stem}.scale"),
        None => format!("{weight}.scale"),
    }
}

impl<'a> Source<'a> {
    /// Finds `name` in `ck` and checks it against the logical shape the
    /// configuration implies (`shape`, HF order; 1-D tensors are one row).
    pub fn resolve(ck: &'a Checkpoint, name: &str, shape: &[u64]) -> Result<Source<'a>, ConvertError> {
        let weight = ck.get(name).ok_or_else(|| ConvertError::Tensor {
            file: ck.dir.display().to_string(),
            tensor: name.to_string(),
            msg: "missing from the checkpoint (config.json implies it)".into(),
        })?;
        let e = weight.entry;
        let bad = |msg: String| ConvertError::Tensor {
            file: weight.file(),
            tensor: name.to_string(),
            msg,
        };
        let (rows, cols) = match shape {
            [c] => (1usize, *c as usize),
            [r, c] => (*r as usize, *c as usize),
            _ => return Err(bad(format!("unexpected logical shape {shape:?}"))),
        };
        let stored = e.shape.clone();
        let same = |want: &[u64]| stored == want || (shape.len() == 1 && stored == [1, want[0]]);
        let enc = match e.dtype {
            Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F64 => {
                if !same(shape) {
                    return Err(bad(format!(
                        "shape {stored:?} but config.json implies {shape:?}"
                    )));
                }
                Encoding::Float
            }
            Dtype::I64 | Dtype::I32 => {
                if !same(shape) {
                    return Err(bad(format!(
                        "shape {stored:?} but config.json implies {shape:?}"
                    )));
                }
                Encoding::Int
            }
            Dtype::F8E4m3 => {
                if !same(shape) {
                    return Err(bad(format!(
                        "shape {stored:?} but config.json implies {shape:?}"
                    )));
                }
                let sname = scale_name(name);
                let scale = ck.get(&sname).ok_or_else(|| ConvertError::Tensor {
                    file: weight.file(),
                    tensor: name.to_string(),
                    msg: format!("FP8 weight without its scale tensor {sname}"),
                })?;
                let ss = &scale.entry.shape;
                if !matches!(scale.entry.dtype, Dtype::F8E8m0 | Dtype::U8 | Dtype::F32) {
                    return Err(bad(format!(
                        "scale {sname} has dtype {} (expected F8_E8M0 or F32)",
                        scale.entry.dtype.name()
                    )));
                }
                let (sr, sc) = match ss.as_slice() {
                    [c] => (1u64, *c),
                    [r, c] => (*r, *c),
                    _ => return Err(bad(format!("scale {sname} has shape {ss:?}"))),
                };
                let block = |n: usize, s: u64| -> Option<usize> {
                    if s == 0 {
                        return None;
                    }
                    let b = n.div_ceil(s as usize);
                    (n.div_ceil(b) as u64 == s).then_some(b)
                };
                match (block(rows, sr), block(cols, sc)) {
                    (Some(br), Some(bc)) => Encoding::Fp8 { scale, br, bc },
                    _ => {
                        return Err(bad(format!(
                            "scale {sname} shape {ss:?} tiles no block grid over {shape:?}"
                        )))
                    }
                }
            }
            Dtype::I8 | Dtype::U8 if shape.len() == 2 && stored == [shape[0], shape[1] / 2] => {
                if cols % 32 != 0 {
                    return Err(bad(format!(
                        "FP4 row of {cols} values is not a whole number of 32-blocks"
                    )));
                }
                let sname = scale_name(name);
                let scale = ck.get(&sname).ok_or_else(|| ConvertError::Tensor {
                    file: weight.file(),
                    tensor: name.to_string(),
                    msg: format!("FP4 weight without its scale tensor {sname}"),
                })?;
                let want = [rows as u64, cols as u64 / 32];
                if scale.entry.shape != want
                    || !matches!(scale.entry.dtype, Dtype::F8E8m0 | Dtype::U8)
                {
                    return Err(bad(format!(
                        "FP4 scale {sname} is {} {:?}, expected F8_E8M0 {want:?}",
                        scale.entry.dtype.name(),
                        scale.entry.shape
                    )));
                }
                Encoding::Fp4 { scale }
            }
            other => {
                return Err(bad(format!(
                    "dtype {} {stored:?} cannot hold the logical {shape:?} weight \
                     (expected FP8, packed FP4, BF16, F16 or F32)",
                    other.name()
                )))
            }
        };
        Ok(Source {
            weight,
            enc,
            rows,
            cols,
        })
    }

    fn nan_error(&self, what: &str, index: usize) -> ConvertError {
        ConvertError::Tensor {
            file: self.weight.file(),
            tensor: self.weight.name.to_string(),
            msg: format!("{what} at element {index} is NaN"),
        }
    }

    /// Decodes rows `r0..r0 + out.len()/cols` into `out` (exact).
    pub fn rows_f32(&self, r0: usize, out: &mut [f32]) -> Result<(), ConvertError> {
        let cols = self.cols;
        let n = out.len() / cols;
        let bytes = self.weight.bytes();
        match self.enc {
            Encoding::Float => {
                let sz = self.weight.entry.dtype.size() as usize;
                let src = &bytes[r0 * cols * sz..(r0 + n) * cols * sz];
                let dt = self.weight.entry.dtype;
                for (o, c) in out.iter_mut().zip(src.chunks_exact(sz)) {
                    *o = match dt {
                        Dtype::F32 => f32::from_le_bytes(c.try_into().unwrap()),
                        Dtype::F16 => f16_bits_to_f32(u16::from_le_bytes(c.try_into().unwrap())),
                        Dtype::Bf16 => bf16_bits_to_f32(u16::from_le_bytes(c.try_into().unwrap())),
                        _ => f64::from_le_bytes(c.try_into().unwrap()) as f32,
                    };
                }
            }
            Encoding::Int => {
                let v = self.rows_i32(r0, n)?;
                for (o, x) in out.iter_mut().zip(v) {
                    *o = x as f32;
                }
            }
            Encoding::Fp8 { scale, br, bc } => {
                let lut = e4m3_lut();
                let sbytes = scale.bytes();
                let scols = cols.div_ceil(bc);
                for i in 0..n {
                    let r = r0 + i;
                    let row = &bytes[r * cols..(r + 1) * cols];
                    let orow = &mut out[i * cols..(i + 1) * cols];
                    for (b, (ochunk, chunk)) in
                        orow.chunks_mut(bc).zip(row.chunks(bc)).enumerate()
                    {
                        let si = (r / br) * scols + b;
                        let s = scale_value(scale.entry.dtype, sbytes, si)
                            .ok_or_else(|| self.nan_error("scale", si))?;
                        for (j, (o, &q)) in ochunk.iter_mut().zip(chunk).enumerate() {
                            let v = lut[q as usize];
                            if v.is_nan() {
                                return Err(self.nan_error("E4M3 code", r * cols + b * bc + j));
                            }
                            *o = v * s;
                        }
                    }
                }
            }
            Encoding::Fp4 { scale } => {
                let sbytes = scale.bytes();
                let half = cols / 2;
                for i in 0..n {
                    let r = r0 + i;
                    let row = &bytes[r * half..(r + 1) * half];
                    let orow = &mut out[i * cols..(i + 1) * cols];
                    for (b, (ochunk, chunk)) in
                        orow.chunks_mut(32).zip(row.chunks(16)).enumerate()
                    {
                        let e = sbytes[r * (cols / 32) + b];
                        let s = e8m0_decode(e);
                        if s.is_nan() {
                            return Err(self.nan_error("E8M0 scale", r * (cols / 32) + b));
                        }
                        for (j, &q) in chunk.iter().enumerate() {
                            ochunk[2 * j] = e2m1_decode(q & 15) * s;
                            ochunk[2 * j + 1] = e2m1_decode(q >> 4) * s;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Rows as i32 (I64 narrowed with a range check).
    pub fn rows_i32(&self, r0: usize, n: usize) -> Result<Vec<i32>, ConvertError> {
        let cols = self.cols;
        let bytes = self.weight.bytes();
        let dt = self.weight.entry.dtype;
        let sz = dt.size() as usize;
        let src = &bytes[r0 * cols * sz..(r0 + n) * cols * sz];
        src.chunks_exact(sz)
            .enumerate()
            .map(|(i, c)| {
                let v = match dt {
                    Dtype::I64 => i64::from_le_bytes(c.try_into().unwrap()),
                    Dtype::I32 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
                    _ => {
                        return Err(ConvertError::Tensor {
                            file: self.weight.file(),
                            tensor: self.weight.name.to_string(),
                            msg: format!("dtype {} is not an integer table", dt.name()),
                        })
                    }
                };
                i32::try_from(v).map_err(|_| ConvertError::Tensor {
                    file: self.weight.file(),
                    tensor: self.weight.name.to_string(),
                    msg: format!("value {v} at element {} does not fit i32", r0 * cols + i),
                })
            })
            .collect()
    }

    /// Repacks FP4 rows into MXFP4 blocks without loss; `None` when the
    /// source is not packed FP4. Each block is decoded back and compared
    /// with the source values (the repack is checked, not assumed).
    pub fn rows_mxfp4(&self, r0: usize, n: usize, out: &mut [u8]) -> Option<Result<(), ConvertError>> {
        let Encoding::Fp4 { scale } = self.enc else {
            return None;
        };
        let cols = self.cols;
        let bytes = self.weight.bytes();
        let sbytes = scale.bytes();
        let nb = cols / 32;
        let mut check = [0f32; 32];
        for i in 0..n {
            let r = r0 + i;
            let row = &bytes[r * cols / 2..(r + 1) * cols / 2];
            for b in 0..nb {
                let e = sbytes[r * nb + b];
                if e == 0xff {
                    return Some(Err(self.nan_error("E8M0 scale", r * nb + b)));
                }
                let src = &row[16 * b..16 * b + 16];
                let code = |k: usize| (src[k / 2] >> (4 * (k % 2))) & 15;
                let mut blk = BlockMxfp4 { e, qs: [0; 16] };
                for j in 0..16 {
                    blk.qs[j] = code(j) | (code(j + 16) << 4);
                }
                let o = (i * nb + b) * 17;
                out[o..o + 17].copy_from_slice(bytemuck::bytes_of(&blk));
                crate::quant::mxfp4::dequantize_row(&out[o..o + 17], &mut check);
                let s = e8m0_decode(e);
                for (k, &v) in check.iter().enumerate() {
                    if v != e2m1_decode(code(k)) * s {
                        return Some(Err(ConvertError::Tensor {
                            file: self.weight.file(),
                            tensor: self.weight.name.to_string(),
                            msg: format!("MXFP4 repack mismatch at row {r}, block {b}"),
                        }));
                    }
                }
            }
        }
        Some(Ok(()))
    }

    /// Whether the values are the checkpoint's packed FP4.
    pub fn is_fp4(&self) -> bool {
        matches!(self.enc, Encoding::Fp4 { .. })
    }

    /// Releases the pages of the weight and its scale (bounded memory).
    pub fn release(&self) {
        self.weight.shard.release(self.weight.entry);
        match self.enc {
            Encoding::Fp8 { scale, .. } | Encoding::Fp4 { scale } => {
                scale.shard.release(scale.entry)
            }
            _ => {}
        }
    }
}

fn scale_value(dt: Dtype, bytes: &[u8], i: usize) -> Option<f32> {
    let v = match dt {
        Dtype::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
        _ => e8m0_decode(bytes[i]),
    };
    (!v.is_nan()).then_some(v)
}

fn e4m3_lut() -> &'static [f32; 256] {
    static LUT: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| std::array::from_fn(|b| e4m3_decode(b as u8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_is_exact() {
        // Every finite code decodes to (1 + m/8)·2^(e−7) or m·2^−9, checked
        // in f64 against the format's definition (QUANTS.md §10).
        for b in 0..=255u8 {
            let (s, e, m) = (b >> 7, ((b >> 3) & 15) as i32, (b & 7) as f64);
            let want = if e == 15 && m == 7.0 {
                f64::NAN
            } else if e == 0 {
                m * 2f64.powi(-9)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            let want = if s == 1 { -want } else { want };
            let got = e4m3_lut()[b as usize] as f64;
            assert!(got == want || (got.is_nan() && want.is_nan()), "{b:#x}");
        }
    }
}
