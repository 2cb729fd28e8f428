//! GGUF container: a memory-mapped file, its metadata and zero-copy tensor views.
//!
//! The parser (`header.rs`) is bounded: every count, length and offset read from
//! the file is checked against the bytes that are actually there before
//! anything is allocated for it, so a crafted or truncated file yields a
//! [`GgufError`], never a panic, a hang or an out-of-memory. Tensor data is
//! never touched while loading: a file whose data region is a hole loads as
//! fast as a real one.

mod error;
mod header;
mod tensor_ref;
mod value;
pub mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use error::GgufError;
pub use header::{Limits, ParsedHeader, TensorInfo};
pub use tensor_ref::TensorRef;
pub use value::{MetaArray, MetaValue, ValueType};
pub use writer::GgufWriter;

use crate::quant::GgmlType;

/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The bytes of a GGUF file: a read-only memory map, or an owned buffer (tests).
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened, parsed and bounds-checked GGUF file.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    header: ParsedHeader,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
    /// Files attached after this one ([`GgufFile::attach`]), each at the
    /// base of its own offset range, in ascending order.
    support: Vec<(u64, GgufFile)>,
}

/// Where the offset range of an attached file starts: past the end of the
/// file before it, rounded up to this (a multiple of every GGUF alignment
/// and of the backends' upload alignment).
const SUPPORT_ALIGN: u64 = 1 << 20;

/// A zero-copy view of one tensor.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// Dimensions in GGUF order (`ne[0]` is contiguous); unused entries are 1.
    pub ne: [u64; 4],
    pub n_dims: usize,
    pub data: &'a [u8],
}

impl Tensor<'_> {
    pub fn dims(&self) -> &[u64] {
        &self.ne[..self.n_dims]
    }

    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Bytes of one row (`ne[0]` elements).
    pub fn row_bytes(&self) -> usize {
        // Validated at parse time: ne0 is a whole number of blocks.
        self.ty.row_bytes(self.ne[0]).unwrap_or(0) as usize
    }

    /// Number of rows across all outer dimensions.
    pub fn n_rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Row `r` (counting across all outer dimensions), `None` if out of range.
    pub fn row(&self, r: usize) -> Option<&[u8]> {
        let rb = self.row_bytes();
        self.data
            .get(r.checked_mul(rb)?..r.checked_mul(rb)?.checked_add(rb)?)
    }
}

impl GgufFile {
    /// Opens and maps `path`, then parses and checks the header.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| GgufError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        let meta = file.metadata().map_err(|e| GgufError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        if !meta.is_file() {
            return Err(GgufError::NotAFile {
                path: path.display().to_string(),
            });
        }
        let len = meta.len();
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process; ds4 never
            // writes model files, and a concurrent truncation by another process is
            // outside what any mmap-based loader can defend against.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::Io {
                path: path.display().to_string(),
                source: e,
            })?;
            Bytes::Mapped(map)
        };
        Self::from_bytes(path, bytes)
    }

    /// Parses a GGUF image held in memory (tests, fuzzing).
    pub fn from_vec(data: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_bytes(PathBuf::from("<memory>"), Bytes::Owned(data))
    }

    fn from_bytes(path: PathBuf, bytes: Bytes) -> Result<GgufFile, GgufError> {
        let header = header::parse(bytes.as_slice(), &Limits::default())?;
        let mut kv_index = HashMap::with_capacity(header.kvs.len());
        for (i, (k, _)) in header.kvs.iter().enumerate() {
            if kv_index.insert(k.clone(), i).is_some() {
                return Err(GgufError::DuplicateKey(k.clone()));
            }
        }
        let mut tensor_index = HashMap::with_capacity(header.tensors.len());
        for (i, t) in header.tensors.iter().enumerate() {
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
        }
        Ok(GgufFile {
            path,
            bytes,
            header,
            kv_index,
            tensor_index,
            support: Vec::new(),
        })
    }

    /// Where the next file [`GgufFile::attach`] takes would start.
    pub fn next_support_base(&self) -> u64 {
        let end = match self.support.last() {
            Some((base, f)) => base + f.file_len(),
            None => self.file_len(),
        };
        end.div_ceil(SUPPORT_ALIGN) * SUPPORT_ALIGN
    }

    /// Attaches a second file (a drafter's weights, GGUF.md §7) to this
    /// one: its bytes are read through [`GgufFile::raw_bytes`] at offsets
    /// from the returned base on, so a [`TensorRef`] bound against it with
    /// that base (`model::MtpWeights::bind`) names its bytes the way a
    /// tensor of this file does, and every backend uploads or reads it
    /// through the one weight file it was given. Returns the base.
    pub fn attach(&mut self, other: GgufFile) -> u64 {
        let base = self.next_support_base();
        self.support.push((base, other));
        base
    }

    /// The attached files, with their bases.
    pub fn attached(&self) -> impl Iterator<Item = (u64, &GgufFile)> {
        self.support.iter().map(|(b, f)| (*b, f))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// File offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    pub fn file_len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.header.kvs.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.kv_index.get(key).map(|&i| &self.header.kvs[i].1)
    }

    /// The tensor directory in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// A zero-copy view of tensor `name`, `None` if absent. Tensors of a type
    /// this engine does not know give an error (their size is unknown).
    pub fn tensor(&self, name: &str) -> Result<Option<Tensor<'_>>, GgufError> {
        match self.tensor_info(name) {
            None => Ok(None),
            Some(info) => self.view(info).map(Some),
        }
    }

    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> Result<Tensor<'a>, GgufError> {
        let ty = info.ty.ok_or_else(|| GgufError::UnknownTensorType {
            name: info.name.clone(),
            type_id: info.type_id,
        })?;
        let start = self.header.data_offset + info.offset;
        let end = start + info.n_bytes;
        // Bounds were checked at parse time; `get` keeps this panic-free anyway.
        let data = self
            .bytes
            .as_slice()
            .get(start as usize..end as usize)
            .ok_or_else(|| GgufError::TensorOutOfBounds {
                name: info.name.clone(),
                end,
                file_len: self.file_len(),
            })?;
        let mut ne = [1u64; 4];
        for (d, &n) in info.ne.iter().enumerate().take(4) {
            ne[d] = n;
        }
        Ok(Tensor {
            name: &info.name,
            ty,
            ne,
            n_dims: info.ne.len(),
            data,
        })
    }

    // Typed metadata accessors. A value of another type counts as absent
    // for the strict getters, as ds4 does.

    pub fn get_u32(&self, key: &str) -> Option<u32> {
        match self.get(key)? {
            MetaValue::U32(v) => Some(*v),
            _ => None,
        }
    }

    /// Any non-negative integer type, widened.
    pub fn get_uint(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any float or integer type, widened to f64.
    pub fn get_float(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        match self.get(key)? {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl GgufFile {
    /// Raw bytes at an absolute extent that was validated at parse time
    /// (a [`TensorRef`]); an out-of-range request gives an empty slice.
    pub fn raw_bytes(&self, offset: u64, len: u64) -> &[u8] {
        if let Some((base, f)) = self.support.iter().rev().find(|(b, _)| offset >= *b) {
            return f.raw_bytes(offset - base, len);
        }
        let b = self.bytes.as_slice();
        usize::try_from(offset)
            .ok()
            .zip(usize::try_from(offset.saturating_add(len)).ok())
            .and_then(|(s, e)| b.get(s..e))
            .unwrap_or(&[])
    }
}

impl AsRef<GgufFile> for GgufFile {
    fn as_ref(&self) -> &GgufFile {
        self
    }
}
