//! `ds4-quantize`: tools around ds4's GGUF files (docs/TOOLS.md).
//!
//! * [`compare`]: per-tensor errors between two GGUFs of the same model
//!   (`--compare`), and a file made of one's tensors with some taken from
//!   the other (`--splice`);
//! * [`output`]: the output written under a temporary name and renamed when
//!   complete, and tensor name patterns.
//!
//! Conversion of the official checkpoints is not here yet (docs/TOOLS.md).

pub mod compare;
pub mod output;

/// Every failure of the tools; each names the file and, where there is one,
/// the tensor.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{file}: {msg}")]
    Input { file: String, msg: String },
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
}
