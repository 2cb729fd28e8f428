//! Block formats of the tensors ds4 reads (QUANTS.md).
//!
//! Each format is a `#[repr(C)]` block type with a compile-time size check, a
//! scalar `dequantize_row`, a scalar dot product against f32 and, for the
//! formats the tools write, a quantizer. The loader, the CPU backend, the tools
//! and the tests all share these definitions.

use std::fmt;

pub mod f16;
pub mod iq2_xxs;
pub mod iq2xxs_tables;
mod kquant;
pub mod mxfp4;
pub mod q2_k;
pub mod q4_k;
pub mod q8_0;
pub mod q8_k;
pub mod small_float;

// Block structs are read with bytemuck straight from little-endian file bytes.
#[cfg(target_endian = "big")]
compile_error!("ds4::quant assumes a little-endian host (GGUF fields are little-endian)");

/// Errors of the row-level entry points. Every variant carries the numbers
/// needed to find the offending tensor or call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("type {0} is not supported by this operation")]
    Unsupported(GgmlType),
    #[error("{ty}: {elems} elements is not a multiple of the block size {block}")]
    NotBlockMultiple {
        ty: GgmlType,
        elems: usize,
        block: usize,
    },
    #[error("{ty}: row of {elems} elements needs {expected} bytes, got {found}")]
    ByteLength {
        ty: GgmlType,
        elems: usize,
        expected: usize,
        found: usize,
    },
    #[error("importance has {found} weights for a row of {expected} elements")]
    ImportanceLength { expected: usize, found: usize },
}

/// Checks that `bytes` holds exactly one row of `elems` elements of `ty`.
fn check_row(ty: GgmlType, elems: usize, bytes: usize) -> Result<(), QuantError> {
    let (be, bb) = ty.block_layout();
    if elems % be != 0 {
        return Err(QuantError::NotBlockMultiple {
            ty,
            elems,
            block: be,
        });
    }
    let expected = (elems / be) * bb;
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            elems,
            expected,
            found: bytes,
        });
    }
    Ok(())
}

/// Whether this module can dequantize and dot rows of `ty` (the formats the
/// Flash files use, plus BF16 which converters may write).
pub fn can_compute(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Bf16 | Q8_0 | Q2K | Q4K | Iq2Xxs | Mxfp4)
}

/// Decodes one row of `ty` from `src` into `dst`; `dst.len()` is the element
/// count. Length mismatches and unsupported types are errors, never panics.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !can_compute(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    check_row(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => f16::dequantize_row_f32(src, dst),
        GgmlType::F16 => f16::dequantize_row_f16(src, dst),
        GgmlType::Bf16 => f16::dequantize_row_bf16(src, dst),
        GgmlType::Q8_0 => q8_0::dequantize_row(src, dst),
        GgmlType::Q2K => q2_k::dequantize_row(src, dst),
        GgmlType::Q4K => q4_k::dequantize_row(src, dst),
        GgmlType::Iq2Xxs => iq2_xxs::dequantize_row(src, dst),
        GgmlType::Mxfp4 => mxfp4::dequantize_row(src, dst),
        _ => unreachable!("can_compute admitted {ty}"),
    }
    Ok(())
}

/// Dot product of one row of `ty` with the f32 vector `x` (`x.len()` is the
/// element count). Scalar reference: f32 accumulation, see each format file.
pub fn dot_row(ty: GgmlType, src: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    if !can_compute(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    check_row(ty, x.len(), src.len())?;
    Ok(match ty {
        GgmlType::F32 => f16::dot_row_f32(src, x),
        GgmlType::F16 => f16::dot_row_f16(src, x),
        GgmlType::Bf16 => f16::dot_row_bf16(src, x),
        GgmlType::Q8_0 => q8_0::dot_row(src, x),
        GgmlType::Q2K => q2_k::dot_row(src, x),
        GgmlType::Q4K => q4_k::dot_row(src, x),
        GgmlType::Iq2Xxs => iq2_xxs::dot_row(src, x),
        GgmlType::Mxfp4 => mxfp4::dot_row(src, x),
        _ => unreachable!("can_compute admitted {ty}"),
    })
}

/// Encodes the f32 row `src` as `ty` into `dst` (exactly one row of bytes).
/// `importance`, when given, holds one non-negative weight per element (an
/// imatrix row); the block-scaled K/IQ quantizers minimise the weighted
/// squared error, the others ignore it.
pub fn quantize_row(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    importance: Option<&[f32]>,
) -> Result<(), QuantError> {
    if !can_compute(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    check_row(ty, src.len(), dst.len())?;
    if let Some(w) = importance {
        if w.len() != src.len() {
            return Err(QuantError::ImportanceLength {
                expected: src.len(),
                found: w.len(),
            });
        }
    }
    match ty {
        GgmlType::F32 => f16::quantize_row_f32(src, dst),
        GgmlType::F16 => f16::quantize_row_f16(src, dst),
        GgmlType::Bf16 => f16::quantize_row_bf16(src, dst),
        GgmlType::Q8_0 => q8_0::quantize_row(src, dst, importance),
        GgmlType::Q2K => q2_k::quantize_row(src, dst, importance),
        GgmlType::Q4K => q4_k::quantize_row(src, dst, importance),
        GgmlType::Iq2Xxs => iq2_xxs::quantize_row(src, dst, importance),
        GgmlType::Mxfp4 => mxfp4::quantize_row(src, dst, importance),
        _ => unreachable!("can_compute admitted {ty}"),
    }
    Ok(())
}

/// A ggml tensor type id as stored in the GGUF tensor directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
}

impl GgmlType {
    /// Maps a GGUF type id to a type, `None` for ids this engine does not know.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            16 => Iq2Xxs,
            17 => Iq2Xs,
            18 => Iq3Xxs,
            19 => Iq1S,
            20 => Iq4Nl,
            21 => Iq3S,
            22 => Iq2S,
            23 => Iq4Xs,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => Iq1M,
            30 => Bf16,
            34 => Tq1_0,
            35 => Tq2_0,
            39 => Mxfp4,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            Q8K => 15,
            Iq2Xxs => 16,
            Iq2Xs => 17,
            Iq3Xxs => 18,
            Iq1S => 19,
            Iq4Nl => 20,
            Iq3S => 21,
            Iq2S => 22,
            Iq4Xs => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            Iq1M => 29,
            Bf16 => 30,
            Tq1_0 => 34,
            Tq2_0 => 35,
            Mxfp4 => 39,
        }
    }

    /// (elements per block, bytes per block), from gguf-py 0.19.0.
    pub fn block_layout(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Iq2Xxs => (256, 66),
            Iq2Xs => (256, 74),
            Iq3Xxs => (256, 98),
            Iq1S => (256, 50),
            Iq4Nl => (32, 18),
            Iq3S => (256, 110),
            Iq2S => (256, 82),
            Iq4Xs => (256, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            Iq1M => (256, 56),
            Bf16 => (1, 2),
            Tq1_0 => (256, 54),
            Tq2_0 => (256, 66),
            Mxfp4 => (32, 17),
        }
    }

    pub fn block_elems(self) -> usize {
        self.block_layout().0
    }

    pub fn block_bytes(self) -> usize {
        self.block_layout().1
    }

    /// Bytes of one row of `ne0` elements, `None` if `ne0` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, ne0: u64) -> Option<u64> {
        let (be, bb) = self.block_layout();
        if ne0 % be as u64 != 0 {
            return None;
        }
        (ne0 / be as u64).checked_mul(bb as u64)
    }

    /// Name as printed by gguf-py / llama.cpp (`Q8_0`, `IQ2_XXS`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            Iq2Xxs => "IQ2_XXS",
            Iq2Xs => "IQ2_XS",
            Iq3Xxs => "IQ3_XXS",
            Iq1S => "IQ1_S",
            Iq4Nl => "IQ4_NL",
            Iq3S => "IQ3_S",
            Iq2S => "IQ2_S",
            Iq4Xs => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            Iq1M => "IQ1_M",
            Bf16 => "BF16",
            Tq1_0 => "TQ1_0",
            Tq2_0 => "TQ2_0",
            Mxfp4 => "MXFP4",
        }
    }

    /// Parses a type name case-insensitively (`q8_0`, `iq2_xxs`, `f16`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        (0..64u32)
            .filter_map(GgmlType::from_id)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The blocks of a row, copied out one by one: rows inside a mapped file need
/// not be aligned for the block type.
pub(crate) fn blocks<T: bytemuck::Pod>(src: &[u8]) -> impl Iterator<Item = T> + '_ {
    src.chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}
