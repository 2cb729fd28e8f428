//! A GGUF v3 writer for the tools: test-model generator, converters, and the
//! full-shape sparse file whose data region is left as a hole.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use super::value::{MetaArray, MetaValue};
use super::DEFAULT_ALIGNMENT;
use crate::quant::GgmlType;

/// A function producing a tensor's bytes when the file is written, so large
/// files are generated one tensor at a time.
pub type LazyData = Box<dyn FnOnce() -> io::Result<Vec<u8>> + Send>;

enum Data {
    Bytes(Vec<u8>),
    Lazy(LazyData),
    /// Not written: a hole in a sparse file.
    Hole,
}

struct PendingTensor {
    name: String,
    ne: Vec<u64>,
    ty: GgmlType,
    data: std::cell::Cell<Option<Data>>,
    n_bytes: u64,
}

impl PendingTensor {
    fn bytes(&self) -> io::Result<Option<Vec<u8>>> {
        let d = match self.data.take() {
            Some(Data::Bytes(b)) => Some(b),
            Some(Data::Lazy(f)) => Some(f()?),
            Some(Data::Hole) | None => None,
        };
        if let Some(b) = &d {
            if b.len() as u64 != self.n_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "tensor {}: {} bytes produced, {} expected",
                        self.name,
                        b.len(),
                        self.n_bytes
                    ),
                ));
            }
        }
        Ok(d)
    }
}

/// The byte layout of a file to be written ([`GgufWriter::layout`]).
pub struct Layout {
    pub header: Vec<u8>,
    pub data_start: u64,
    pub offsets: Vec<u64>,
    pub file_len: u64,
}

/// Collects metadata and tensors, then writes them in GGUF v3 layout with every
/// tensor at a multiple of the alignment and zero padding in between.
pub struct GgufWriter {
    alignment: u64,
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a key; `general.alignment` (u32) also sets the layout alignment.
    pub fn add_kv(&mut self, key: &str, value: MetaValue) {
        if key == "general.alignment" {
            if let MetaValue::U32(a) = value {
                if a != 0 && a.is_power_of_two() {
                    self.alignment = a as u64;
                }
            }
        }
        self.kvs.push((key.to_string(), value));
    }

    /// The metadata added so far, in order (tools that copy and edit a header).
    pub fn kvs(&self) -> &[(String, MetaValue)] {
        &self.kvs
    }

    pub fn add_u32(&mut self, key: &str, v: u32) {
        self.add_kv(key, MetaValue::U32(v));
    }

    pub fn add_f32(&mut self, key: &str, v: f32) {
        self.add_kv(key, MetaValue::F32(v));
    }

    pub fn add_bool(&mut self, key: &str, v: bool) {
        self.add_kv(key, MetaValue::Bool(v));
    }

    pub fn add_str(&mut self, key: &str, v: &str) {
        self.add_kv(key, MetaValue::String(v.to_string()));
    }

    pub fn add_array(&mut self, key: &str, v: MetaArray) {
        self.add_kv(key, MetaValue::Array(v));
    }

    /// Adds a tensor whose bytes are `data` (must be exactly the size `ne` and
    /// `ty` imply).
    pub fn add_tensor(
        &mut self,
        name: &str,
        ne: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> io::Result<()> {
        let n_bytes = tensor_bytes(name, ne, ty)?;
        if data.len() as u64 != n_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "tensor {name}: {} bytes given, {n_bytes} expected",
                    data.len()
                ),
            ));
        }
        self.push_tensor(name, ne, ty, n_bytes, Data::Bytes(data));
        Ok(())
    }

    /// Adds a tensor whose bytes are produced by `make` at write time.
    pub fn add_tensor_lazy(
        &mut self,
        name: &str,
        ne: &[u64],
        ty: GgmlType,
        make: LazyData,
    ) -> io::Result<()> {
        let n_bytes = tensor_bytes(name, ne, ty)?;
        self.push_tensor(name, ne, ty, n_bytes, Data::Lazy(make));
        Ok(())
    }

    /// Adds a tensor whose data is not written: the file gets a hole there.
    pub fn add_tensor_hole(&mut self, name: &str, ne: &[u64], ty: GgmlType) -> io::Result<()> {
        let n_bytes = tensor_bytes(name, ne, ty)?;
        self.push_tensor(name, ne, ty, n_bytes, Data::Hole);
        Ok(())
    }

    /// Queues tensor `name` of `n_bytes` (what `ne` and `ty` imply) for the
    /// file, in the order added.
    fn push_tensor(&mut self, name: &str, ne: &[u64], ty: GgmlType, n_bytes: u64, data: Data) {
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            ty,
            data: std::cell::Cell::new(Some(data)),
            n_bytes,
        });
    }

    /// Serialises the header (up to, not including, the alignment padding) and
    /// returns it with the relative offset of each tensor and the data size.
    fn header(&self) -> (Vec<u8>, u64) {
        let mut h = Vec::new();
        h.extend_from_slice(&0x4655_4747u32.to_le_bytes());
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &n in &t.ne {
                h.extend_from_slice(&n.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        (h, offset)
    }

    /// Where everything goes, for writers that fill the data region
    /// themselves (the converter writes tensors in parallel at their
    /// offsets): the header bytes before the padding, the data start, each
    /// tensor's absolute offset in the order added, and the file length.
    pub fn layout(&self) -> Layout {
        let (header, data_len) = self.header();
        let data_start = (header.len() as u64).div_ceil(self.alignment) * self.alignment;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut pos = 0u64;
        for t in &self.tensors {
            offsets.push(data_start + pos);
            pos = (pos + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        Layout {
            header,
            data_start,
            offsets,
            file_len: data_start + data_len,
        }
    }

    /// Writes the file (consuming the tensor data). Holes are skipped with a
    /// seek, and the file length is set at the end, so a file made only of
    /// holes costs no disk space.
    pub fn write_to_path(self, path: impl AsRef<Path>) -> io::Result<()> {
        let file = File::create(path.as_ref())?;
        let (header, data_len) = self.header();
        let data_start = (header.len() as u64).div_ceil(self.alignment) * self.alignment;
        let mut w = BufWriter::new(file);
        w.write_all(&header)?;
        w.write_all(&vec![0u8; (data_start - header.len() as u64) as usize])?;
        let mut pos = 0u64;
        for t in &self.tensors {
            if let Some(d) = t.bytes()? {
                w.seek(SeekFrom::Start(data_start + pos))?;
                w.write_all(&d)?;
                let end = pos + t.n_bytes;
                let padded = end.div_ceil(self.alignment) * self.alignment;
                w.write_all(&vec![0u8; (padded - end) as usize])?;
            }
            pos = (pos + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.set_len(data_start + data_len)?;
        file.sync_all()?;
        Ok(())
    }

    /// The whole file in memory (tests; consumes the tensor data); holes
    /// become zeros.
    pub fn to_bytes(self) -> io::Result<Vec<u8>> {
        let (header, data_len) = self.header();
        let data_start = (header.len() as u64).div_ceil(self.alignment) * self.alignment;
        let mut out = header;
        out.resize((data_start + data_len) as usize, 0);
        let mut pos = 0u64;
        for t in &self.tensors {
            if let Some(d) = t.bytes()? {
                let s = (data_start + pos) as usize;
                out[s..s + d.len()].copy_from_slice(&d);
            }
            pos = (pos + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        Ok(out)
    }
}

fn tensor_bytes(name: &str, ne: &[u64], ty: GgmlType) -> io::Result<u64> {
    let bad =
        |msg: String| io::Error::new(io::ErrorKind::InvalidInput, format!("tensor {name}: {msg}"));
    if ne.is_empty() || ne.len() > 8 {
        return Err(bad(format!("{} dimensions", ne.len())));
    }
    let row = ty
        .row_bytes(ne[0])
        .ok_or_else(|| bad(format!("ne0 {} not a multiple of the {} block", ne[0], ty)))?;
    ne[1..]
        .iter()
        .try_fold(row, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| bad("size overflows".into()))
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => h.push(*x),
        MetaValue::I8(x) => h.push(*x as u8),
        MetaValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => h.push(*x as u8),
        MetaValue::String(s) => put_str(h, s),
        MetaValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(a) => put_array(h, a),
    }
}

fn put_array(h: &mut Vec<u8>, a: &MetaArray) {
    h.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                h.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetaArray::U8(v) => h.extend_from_slice(v),
        MetaArray::I8(v) => h.extend(v.iter().map(|&x| x as u8)),
        MetaArray::Bool(v) => h.extend(v.iter().map(|&x| x as u8)),
        MetaArray::U16(v) => each!(v),
        MetaArray::I16(v) => each!(v),
        MetaArray::U32(v) => each!(v),
        MetaArray::I32(v) => each!(v),
        MetaArray::F32(v) => each!(v),
        MetaArray::U64(v) => each!(v),
        MetaArray::I64(v) => each!(v),
        MetaArray::F64(v) => each!(v),
        MetaArray::String(v) => v.iter().for_each(|s| put_str(h, s)),
        MetaArray::Array(v) => v.iter().for_each(|x| put_array(h, x)),
    }
}
