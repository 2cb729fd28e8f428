//! The checkpoints' number formats decoded to f32 exactly, and the FP4
//! experts repacked into GGUF MXFP4 without loss (GGUF.md §10, QUANTS.md
//! §10–11).
//!
//! * FP8: an `F8_E4M3` weight `[out, in]` with an `F8_E8M0` `.scale`
//!   `[ceil(out/br), ceil(in/bc)]`, one scale per `br × bc` block (the block
//!   of `config.json`: V4 Flash 128 × 128, V4.1 32 × 32);
//! * FP4: an `I8` weight `[out, in/2]` of packed E2M1 codes (element `2j` in
//!   the low nibble of byte `j`, `2j + 1` in the high one) with an `F8_E8M0`
//!   `.scale` `[out, in/32]`, one scale per 32 along a row (routed experts);
//! * `F32`, `F16`, `BF16` widened, `F8_E8M0` read as `2^(e−127)`;
//! * `I64` / `I32` integer tables narrowed to i32, range-checked.
//!
//! Each value is one f32 product of two exact factors (the code's value and
//! a power of two), so it is the exact stored value rounded once; it is
//! exact unless it overflows f32 (only with scale bytes near 254). The
//! E4M3 NaN pattern (`0x7f`/`0xff`) reads as 0, as in ds4's converter
//! (GGUF.md §10). The E8M0 NaN byte 255 (OCP MX) has no f32 value and is an
//! error naming the tensor and the block: no release holds one.

use super::safetensors::{Checkpoint, Dtype, TensorView};
use super::ConvertError;
use crate::quant::f16::{bf16_bits_to_f32, f16_bits_to_f32};
use crate::quant::mxfp4::{BlockMxfp4, QK_MXFP4};
use crate::quant::small_float::{e2m1_decode, e4m3_decode, e8m0_decode};

/// Values per FP4 scale (the OCP MX block, the same as MXFP4's).
pub const FP4_BLOCK: usize = 32;

/// An E4M3FN byte's value; the NaN pattern reads as 0 (GGUF.md §10).
pub fn e4m3_to_f32(b: u8) -> f32 {
    if b & 0x7f == 0x7f {
        0.0
    } else {
        e4m3_decode(b)
    }
}

/// A UE8M0 scale byte's value `2^(e−127)`; `None` for the NaN byte 255.
pub fn e8m0_to_f32(e: u8) -> Option<f32> {
    (e != 0xff).then(|| e8m0_decode(e))
}

/// The scale tensor of a weight: `.weight` → `.scale`.
pub fn scale_name(weight: &str) -> String {
    match weight.strip_suffix(".weight") {
        Some(stem) => format!("{stem}.scale"),
        None => format!("{weight}.scale"),
    }
}

/// How a weight is stored.
#[derive(Clone, Copy, Debug)]
enum Kind<'a> {
    /// F32 / F16 / BF16 / F8_E8M0 values, one per element.
    Plain,
    /// E4M3 codes with E8M0 scales over `block` = `[br, bc]`.
    Fp8 {
        scale: TensorView<'a>,
        block: [usize; 2],
    },
    /// Packed E2M1 codes with E8M0 scales per 32 along a row.
    Fp4 { scale: TensorView<'a> },
}

/// One checkpoint weight as a logical `[rows, cols]` matrix of f32 (a 1-D
/// tensor is one row; more dimensions fold into the rows), decoded a range
/// of rows at a time so no more than the caller's buffer is ever expanded.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub tensor: TensorView<'a>,
    kind: Kind<'a>,
    pub rows: usize,
    pub cols: usize,
}

/// A 2-D stored shape, or an error naming the tensor.
fn matrix(t: &TensorView, what: &str) -> Result<[usize; 2], ConvertError> {
    match *t.shape {
        [r, c] => Ok([r as usize, c as usize]),
        _ => Err(t.error(format!("{what} must be 2-D, the header says {:?}", t.shape))),
    }
}

/// Checks that `scale` is an `F8_E8M0` tensor of shape `want` holding no
/// NaN byte; `per` says what one scale covers, for the messages.
fn check_scale(
    weight: &TensorView,
    scale: &TensorView,
    want: [usize; 2],
    per: &str,
) -> Result<(), ConvertError> {
    if scale.dtype != Dtype::F8E8m0 || scale.shape != [want[0] as u64, want[1] as u64] {
        return Err(weight.error(format!(
            "its scale {} is {} {:?}, expected F8_E8M0 {want:?} (one per {per})",
            scale.name,
            scale.dtype.name(),
            scale.shape
        )));
    }
    if let Some(i) = scale.bytes.iter().position(|&e| e == 0xff) {
        return Err(scale.error(format!(
            "scale byte 255 (E8M0 NaN) at block [{}, {}]",
            i / want[1],
            i % want[1]
        )));
    }
    Ok(())
}

impl<'a> Weight<'a> {
    /// Locates `name` in `ck` with its scale where its dtype needs one, and
    /// checks dtypes and shapes; nothing is decoded yet.
    pub fn open(ck: &'a Checkpoint, name: &str) -> Result<Weight<'a>, ConvertError> {
        let t = ck.tensor(name)?;
        let scale = || {
            let sname = scale_name(name);
            ck.get(&sname).ok_or_else(|| {
                t.error(format!(
                    "{} weight without its scale tensor {sname}",
                    t.dtype.name()
                ))
            })
        };
        let (kind, rows, cols) = match t.dtype {
            Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F8E8m0 => {
                if t.dtype == Dtype::F8E8m0 && t.bytes.contains(&0xff) {
                    return Err(t.error("E8M0 byte 255 (NaN)"));
                }
                let cols = t.shape.last().copied().unwrap_or(1) as usize;
                let rows = t.numel().checked_div(cols).unwrap_or(0);
                (Kind::Plain, rows, cols)
            }
            Dtype::F8E4m3 => {
                let [rows, cols] = matrix(&t, "an FP8 weight")?;
                let block = ck.weight_block_size()?;
                let s = scale()?;
                let want = [rows.div_ceil(block[0]), cols.div_ceil(block[1])];
                check_scale(&t, &s, want, &format!("{} x {} block", block[0], block[1]))?;
                (Kind::Fp8 { scale: s, block }, rows, cols)
            }
            Dtype::I8 => {
                let [rows, half] = matrix(&t, "a packed FP4 weight")?;
                let cols = 2 * half;
                if cols % FP4_BLOCK != 0 {
                    return Err(t.error(format!(
                        "packed FP4 rows of {cols} values are not whole blocks of {FP4_BLOCK}"
                    )));
                }
                let s = scale()?;
                check_scale(&t, &s, [rows, cols / FP4_BLOCK], "32 values of a row")?;
                (Kind::Fp4 { scale: s }, rows, cols)
            }
            other => {
                return Err(t.error(format!(
                    "dtype {} is not a weight format of the checkpoints \
                     (F8_E4M3, packed FP4 in I8, BF16, F16, F32, F8_E8M0)",
                    other.name()
                )))
            }
        };
        Ok(Weight {
            tensor: t,
            kind,
            rows,
            cols,
        })
    }

    /// Whether the weight is packed FP4 (and so repacks to MXFP4).
    pub fn is_fp4(&self) -> bool {
        matches!(self.kind, Kind::Fp4 { .. })
    }

    /// Decodes rows `r0 .. r0 + out.len() / cols` into `out`. Panics if
    /// `out` is not whole rows inside the matrix (a caller's mistake; the
    /// file's bytes were checked at open).
    pub fn rows_f32(&self, r0: usize, out: &mut [f32]) {
        let cols = self.cols;
        assert!(cols > 0 && out.len() % cols == 0 && r0 + out.len() / cols <= self.rows);
        let n = out.len() / cols;
        let bytes = self.tensor.bytes;
        match self.kind {
            Kind::Plain => {
                let sz = self.tensor.dtype.size() as usize;
                let src = &bytes[r0 * cols * sz..(r0 + n) * cols * sz];
                let w = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
                match self.tensor.dtype {
                    Dtype::F32 => src.chunks_exact(4).zip(out.iter_mut()).for_each(|(c, o)| {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }),
                    Dtype::F16 => src
                        .chunks_exact(2)
                        .zip(out.iter_mut())
                        .for_each(|(c, o)| *o = f16_bits_to_f32(w(c))),
                    Dtype::Bf16 => src
                        .chunks_exact(2)
                        .zip(out.iter_mut())
                        .for_each(|(c, o)| *o = bf16_bits_to_f32(w(c))),
                    // F8_E8M0, checked free of 255 at open.
                    _ => src
                        .iter()
                        .zip(out.iter_mut())
                        .for_each(|(&e, o)| *o = e8m0_decode(e)),
                }
            }
            Kind::Fp8 { scale, block } => {
                let lut: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(b as u8));
                let scols = cols.div_ceil(block[1]);
                for (i, orow) in out.chunks_exact_mut(cols).enumerate() {
                    let r = r0 + i;
                    let row = &bytes[r * cols..(r + 1) * cols];
                    let srow = &scale.bytes[(r / block[0]) * scols..][..scols];
                    for ((o, q), &e) in orow
                        .chunks_mut(block[1])
                        .zip(row.chunks(block[1]))
                        .zip(srow)
                    {
                        let s = e8m0_decode(e);
                        for (o, &q) in o.iter_mut().zip(q) {
                            *o = lut[q as usize] * s;
                        }
                    }
                }
            }
            Kind::Fp4 { scale } => {
                let (half, sb) = (cols / 2, cols / FP4_BLOCK);
                for (i, orow) in out.chunks_exact_mut(cols).enumerate() {
                    let r = r0 + i;
                    let row = &bytes[r * half..(r + 1) * half];
                    let srow = &scale.bytes[r * sb..(r + 1) * sb];
                    for ((o, q), &e) in orow
                        .chunks_exact_mut(FP4_BLOCK)
                        .zip(row.chunks_exact(FP4_BLOCK / 2))
                        .zip(srow)
                    {
                        // The block's 16 values, each the same single
                        // product `e2m1 · s` as decoding one by one: a
                        // table read per value instead of a branch and a
                        // multiply (the FP4 decode was 38 % of a q8
                        // conversion's time).
                        let s = e8m0_decode(e);
                        let lut: [f32; 16] = std::array::from_fn(|c| e2m1_decode(c as u8) * s);
                        for (o, &q) in o.chunks_exact_mut(2).zip(q) {
                            o[0] = lut[(q & 0x0f) as usize];
                            o[1] = lut[(q >> 4) as usize];
                        }
                    }
                }
            }
        }
    }

    /// The whole weight as f32, row-major (for tensors that fit in memory).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = vec![0f32; self.rows * self.cols];
        if !v.is_empty() {
            self.rows_f32(0, &mut v);
        }
        v
    }

    /// Repacks rows `r0 .. r0 + n` of a packed FP4 weight into GGUF MXFP4
    /// blocks (type 39, QUANTS.md §11), `cols / 32` per row, without loss:
    /// the scale byte is kept and each E2M1 code moves to MXFP4's nibble
    /// order (element `j` low, `j + 16` high). Codes keep their meaning (the
    /// MXFP4 table is E2M1 doubled, its scale halved), except that the code
    /// for −0 decodes as +0 there. An error for any other kind of weight.
    pub fn rows_mxfp4(&self, r0: usize, n: usize) -> Result<Vec<BlockMxfp4>, ConvertError> {
        let Kind::Fp4 { scale } = self.kind else {
            return Err(self.tensor.error(format!(
                "{} weight: only packed FP4 repacks to MXFP4",
                self.tensor.dtype.name()
            )));
        };
        assert!(r0 + n <= self.rows);
        let (half, sb) = (self.cols / 2, self.cols / FP4_BLOCK);
        let src = &self.tensor.bytes[r0 * half..(r0 + n) * half];
        let scales = &scale.bytes[r0 * sb..(r0 + n) * sb];
        Ok(src
            .chunks_exact(QK_MXFP4 / 2)
            .zip(scales)
            .map(|(packed, &e)| {
                let code = |k: usize| (packed[k / 2] >> (4 * (k % 2))) & 0x0f;
                BlockMxfp4 {
                    e,
                    qs: std::array::from_fn(|j| code(j) | code(j + QK_MXFP4 / 2) << 4),
                }
            })
            .collect())
    }
}

/// An integer table (`I64` or `I32`, e.g. `tid2eid`) as i32, row-major; an
/// I64 value outside i32 is an error naming the tensor and the element.
pub fn to_i32(t: &TensorView) -> Result<Vec<i32>, ConvertError> {
    match t.dtype {
        Dtype::I32 => Ok(t
            .bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        Dtype::I64 => t
            .bytes
            .chunks_exact(8)
            .enumerate()
            .map(|(i, c)| {
                let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
                i32::try_from(v)
                    .map_err(|_| t.error(format!("element {i} = {v} does not fit in i32")))
            })
            .collect(),
        other => Err(t.error(format!(
            "dtype {} is not an integer table (I64 or I32)",
            other.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GGUF.md §10's E4M3 formula, written out, for every byte.
    #[test]
    fn e4m3_matches_the_formula() {
        for b in 0..=255u8 {
            let (exp, man) = ((b >> 3) & 15, b & 7);
            let mag = if b & 0x7f == 0x7f {
                0.0
            } else if exp == 0 {
                man as f64 * 2f64.powi(-9)
            } else {
                (1.0 + man as f64 / 8.0) * 2f64.powi(exp as i32 - 7)
            };
            let want = if b & 0x80 != 0 && b & 0x7f != 0x7f {
                -mag
            } else {
                mag
            };
            assert_eq!(
                e4m3_to_f32(b).to_bits(),
                (want as f32).to_bits(),
                "{b:#04x}"
            );
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
    }

    #[test]
    fn e8m0_is_a_power_of_two_and_255_is_none() {
        for e in 0..255u8 {
            assert_eq!(
                e8m0_to_f32(e).unwrap() as f64,
                2f64.powi(e as i32 - 127),
                "{e}"
            );
        }
        assert_eq!(e8m0_to_f32(255), None);
    }

    #[test]
    fn scale_names() {
        assert_eq!(
            scale_name("layers.0.attn.wq_a.weight"),
            "layers.0.attn.wq_a.scale"
        );
        assert_eq!(scale_name("x"), "x.scale");
    }
}
