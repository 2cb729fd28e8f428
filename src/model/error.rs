//! Errors found while reading a model's configuration and binding its weights.

use thiserror::Error;

use crate::gguf::GgufError;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("metadata key {key}: missing")]
    MissingKey { key: String },
    #[error("metadata key {key}: expected {expected}, found {found}")]
    BadKey {
        key: String,
        expected: String,
        found: String,
    },
    #[error("tensor {name}: missing")]
    MissingTensor { name: String },
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor {name}: type {found} not accepted here (accepted: {accepted})")]
    BadType {
        name: String,
        found: String,
        accepted: String,
    },
    #[error("tensor {name}: {msg}")]
    BadTensor { name: String, msg: String },
    #[error("inconsistent model: {0}")]
    Inconsistent(String),
    #[error("not a DeepSeek V4 model file: {0}")]
    WrongKind(String),
}
