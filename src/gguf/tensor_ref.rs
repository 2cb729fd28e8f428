//! A validated tensor's type, shape and absolute extent in its file: what an
//! op needs to read weights, and what a GPU backend needs to upload them by
//! offset without borrowing the file. Made by `model::Weights::bind`.

use super::GgufFile;
use crate::quant::GgmlType;

/// A validated tensor: type, shape and where its bytes are in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order, unused dims 1.
    pub ne: [u64; 4],
    /// Absolute file offset of the first byte.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorRef {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.ne[0]).unwrap_or(0) as usize
    }

    /// Bytes of tensor data inside `file` (the file it was bound from).
    pub fn bytes<'a>(&self, file: &'a GgufFile) -> &'a [u8] {
        file.raw_bytes(self.offset, self.n_bytes)
    }
}
