//! `ds4-quantize`: make ds4's GGUF files from the official DeepSeek
//! checkpoints (docs/TOOLS.md).
//!
//! * [`safetensors`]: the shards, mapped, one tensor at a time;
//! * [`decode`]: FP8 / FP4 / BF16 / … decoded exactly, FP4 repacked to MXFP4;
//! * [`layout`]: `config.json` → ds4's tensor directory and metadata, and
//!   the checkpoint tensor each output tensor comes from;
//! * [`recipe`]: the type of each output tensor (ds4's mixes, recipe files);
//! * [`imatrix`]: llama.cpp's imatrix GGUF, read and written;
//! * [`run`]: the conversion itself (parallel, bounded memory, temporary
//!   name, progress);
//! * [`compare`]: per-tensor errors between two GGUFs, and splicing.

pub mod compare;
pub mod decode;
pub mod imatrix;
pub mod layout;
pub mod recipe;
pub mod run;
pub mod safetensors;

pub use run::{convert, ConvertOptions, ConvertReport};

/// Every failure of the tools; each names the file and, where there is one,
/// the tensor.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{file}: {msg}")]
    Checkpoint { file: String, msg: String },
    #[error("{file}: tensor {tensor}: {msg}")]
    Tensor {
        file: String,
        tensor: String,
        msg: String,
    },
    #[error("{file}: {msg}")]
    Output { file: String, msg: String },
    #[error("{0}")]
    Usage(String),
    #[error("interrupted")]
    Interrupted,
    #[error("internal error: {0}")]
    Internal(String),
}
