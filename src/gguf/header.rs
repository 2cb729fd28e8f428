//! Bounded parsing of the GGUF header: magic, version, metadata, tensor directory.
//!
//! Every length read from the file is checked against the bytes that remain
//! before memory is reserved for it, so the work and memory spent on a file
//! are proportional to its actual size, whatever its header claims.

use super::error::GgufError;
use super::value::{MetaArray, MetaValue, ValueType};
use super::DEFAULT_ALIGNMENT;
use crate::quant::GgmlType;

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian

/// Caps on header fields. The defaults are far above anything a DeepSeek V4
/// file needs (1,328 tensors; a 129,280-entry vocabulary) yet small enough that
/// a crafted header cannot make the parser allocate without bound.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_tensors: u64,
    pub max_kvs: u64,
    pub max_string_len: u64,
    pub max_array_len: u64,
    pub max_nesting: usize,
    pub max_dims: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_tensors: 1 << 20,
            max_kvs: 1 << 20,
            max_string_len: 1 << 26,
            max_array_len: 1 << 28,
            max_nesting: 8,
            max_dims: 8,
        }
    }
}

/// One entry of the tensor directory, with its byte size resolved.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub type_id: u32,
    /// `None` for a type id this engine does not know (size unknown).
    pub ty: Option<GgmlType>,
    /// Offset relative to the data section.
    pub offset: u64,
    /// Size in bytes (0 for an unknown type).
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

#[derive(Clone, Debug)]
pub struct ParsedHeader {
    pub version: u32,
    pub alignment: u64,
    pub kvs: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                need: n,
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str, limits: &Limits) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > limits.max_string_len {
            return Err(GgufError::StringTooLong {
                offset: at,
                len,
                limit: limits.max_string_len,
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { offset: at })
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in
    /// what remains, before anything is allocated for them.
    fn check_count(
        &self,
        what: &str,
        count: u64,
        min_size: u64,
        limit: u64,
    ) -> Result<(), GgufError> {
        if count > limit {
            return Err(GgufError::CountTooLarge {
                what: what.to_string(),
                count,
                limit,
            });
        }
        let need = count.saturating_mul(min_size);
        if need > self.remaining() {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                need,
                file_len: self.buf.len() as u64,
            });
        }
        Ok(())
    }
}

/// Parses and validates the header of a GGUF image.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<ParsedHeader, GgufError> {
    if buf.len() < 24 {
        return Err(GgufError::TooShort {
            len: buf.len() as u64,
        });
    }
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.u32("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    // v2 and v3 share the little-endian layout; v1 used 32-bit counts.
    if version != 2 && version != 3 {
        return Err(GgufError::BadVersion(version));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // A key/value record is at least 8 (key length) + 4 (type) + 1 bytes.
    c.check_count("metadata", n_kv, 13, limits.max_kvs)?;
    // A tensor record is at least 8 (name length) + 4 + 8 + 4 + 8 bytes.
    c.check_count("tensor", n_tensors, 32, limits.max_tensors)?;

    let mut kvs = Vec::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let key = c.string("metadata key", limits)?;
        let type_id = c.u32("metadata value type")?;
        let vt = ValueType::from_id(type_id).ok_or_else(|| GgufError::BadValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = read_value(&mut c, vt, &key, limits, 0)?;
        kvs.push((key, value));
    }

    let alignment = match kvs.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => return Err(GgufError::BadAlignment(v.summary())),
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        tensors.push(read_tensor_info(&mut c, limits)?);
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    check_tensor_extents(&tensors, data_offset, file_len)?;

    Ok(ParsedHeader {
        version,
        alignment,
        kvs,
        tensors,
        data_offset,
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, limits: &Limits) -> Result<TensorInfo, GgufError> {
    let name = c.string("tensor name", limits)?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims > limits.max_dims {
        return Err(GgufError::BadDims { name, n_dims });
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    if let Some(dim) = ne.iter().position(|&n| n == 0) {
        return Err(GgufError::ZeroDim { name, dim });
    }
    let n_elements = ne
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| GgufError::ElementOverflow { name: name.clone() })?;
    let ty = GgmlType::from_id(type_id);
    let n_bytes = match ty {
        None => 0,
        Some(ty) => {
            let row = ty.row_bytes(ne[0]).ok_or_else(|| GgufError::BadRowSize {
                name: name.clone(),
                ne0: ne[0],
                ty: ty.name().to_string(),
                block: ty.block_elems(),
            })?;
            row.checked_mul(n_elements / ne[0])
                .ok_or_else(|| GgufError::ElementOverflow { name: name.clone() })?
        }
    };
    Ok(TensorInfo {
        name,
        ne,
        type_id,
        ty,
        offset,
        n_bytes,
    })
}

/// Every tensor of known size must lie inside the file, and no two may share bytes.
fn check_tensor_extents(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
        if t.n_bytes > 0 {
            spans.push((t.offset, t.offset + t.n_bytes, i));
        }
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::TensorOverlap {
                a: tensors[w[0].2].name.clone(),
                b: tensors[w[1].2].name.clone(),
            });
        }
    }
    Ok(())
}

fn read_value(
    c: &mut Cursor<'_>,
    vt: ValueType,
    key: &str,
    limits: &Limits,
    depth: usize,
) -> Result<MetaValue, GgufError> {
    let what = "metadata value";
    Ok(match vt {
        ValueType::U8 => MetaValue::U8(c.array::<1>(what)?[0]),
        ValueType::I8 => MetaValue::I8(c.array::<1>(what)?[0] as i8),
        ValueType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => MetaValue::U32(c.u32(what)?),
        ValueType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::Bool => MetaValue::Bool(c.array::<1>(what)?[0] != 0),
        ValueType::String => MetaValue::String(c.string(what, limits)?),
        ValueType::U64 => MetaValue::U64(c.u64(what)?),
        ValueType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(what)?)),
        ValueType::Array => MetaValue::Array(read_array(c, key, limits, depth + 1)?),
    })
}

fn read_array(
    c: &mut Cursor<'_>,
    key: &str,
    limits: &Limits,
    depth: usize,
) -> Result<MetaArray, GgufError> {
    if depth > limits.max_nesting {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            limit: limits.max_nesting,
        });
    }
    let type_id = c.u32("array element type")?;
    let et = ValueType::from_id(type_id).ok_or_else(|| GgufError::BadValueType {
        key: key.to_string(),
        type_id,
    })?;
    let n = c.u64("array length")?;
    c.check_count(
        &format!("array {key:?}"),
        n,
        et.min_encoded_size(),
        limits.max_array_len,
    )?;
    let n = n as usize;

    macro_rules! fixed {
        ($variant:ident, $t:ty, $size:expr) => {{
            let bytes = c.take((n * $size) as u64, "array data")?;
            MetaArray::$variant(
                bytes
                    .chunks_exact($size)
                    .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or([0; $size])))
                    .collect(),
            )
        }};
    }
    Ok(match et {
        ValueType::U8 => MetaArray::U8(c.take(n as u64, "array data")?.to_vec()),
        ValueType::I8 => MetaArray::I8(
            c.take(n as u64, "array data")?
                .iter()
                .map(|&b| b as i8)
                .collect(),
        ),
        ValueType::Bool => MetaArray::Bool(
            c.take(n as u64, "array data")?
                .iter()
                .map(|&b| b != 0)
                .collect(),
        ),
        ValueType::U16 => fixed!(U16, u16, 2),
        ValueType::I16 => fixed!(I16, i16, 2),
        ValueType::U32 => fixed!(U32, u32, 4),
        ValueType::I32 => fixed!(I32, i32, 4),
        ValueType::F32 => fixed!(F32, f32, 4),
        ValueType::U64 => fixed!(U64, u64, 8),
        ValueType::I64 => fixed!(I64, i64, 8),
        ValueType::F64 => fixed!(F64, f64, 8),
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string("array string", limits)?);
            }
            MetaArray::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, limits, depth + 1)?);
            }
            MetaArray::Array(v)
        }
    })
}
