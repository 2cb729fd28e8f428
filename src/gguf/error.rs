//! Errors of the GGUF layer; each variant carries the numbers that explain it.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read the file: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a regular file")]
    NotAFile { path: String },
    #[error("file is too short to be GGUF ({len} bytes)")]
    TooShort { len: u64 },
    #[error("bad magic {found:#010x}: not a GGUF file")]
    BadMagic { found: u32 },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    BadVersion(u32),
    #[error("truncated {what} at byte {offset}: need {need} bytes, file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        file_len: u64,
    },
    #[error("{what} count {count} is absurd (limit {limit})")]
    CountTooLarge {
        what: String,
        count: u64,
        limit: u64,
    },
    #[error("string of {len} bytes at byte {offset} exceeds the limit of {limit}")]
    StringTooLong { offset: u64, len: u64, limit: u64 },
    #[error("string at byte {offset} is not valid UTF-8")]
    BadUtf8 { offset: u64 },
    #[error("metadata key {key:?}: unknown value type {type_id}")]
    BadValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {limit}")]
    NestingTooDeep { key: String, limit: usize },
    #[error("general.alignment must be a non-zero power of two u32, found {0}")]
    BadAlignment(String),
    #[error("tensor {name:?}: {n_dims} dimensions (expected 1..=8)")]
    BadDims { name: String, n_dims: u32 },
    #[error("tensor {name:?}: dimension {dim} is zero")]
    ZeroDim { name: String, dim: usize },
    #[error("tensor {name:?}: element count overflows")]
    ElementOverflow { name: String },
    #[error("tensor {name:?}: ne0 = {ne0} is not a multiple of the {ty} block size {block}")]
    BadRowSize {
        name: String,
        ne0: u64,
        ty: String,
        block: usize,
    },
    #[error("tensor {name:?}: unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error(
        "tensor {name:?}: data ends at byte {end}, past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        end: u64,
        file_len: u64,
    },
    #[error("tensors {a:?} and {b:?} overlap in the data section")]
    TensorOverlap { a: String, b: String },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
}
