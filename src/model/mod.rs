//! The DeepSeek V4 model: configuration read from metadata, weights bound by
//! name and validated against it.

pub mod config;
mod error;
pub mod weights;

pub use config::{AttentionKind, ModelConfig, RopeConfig, Yarn};
pub use error::ModelError;
pub use weights::{
    CompressorWeights, IndexerWeights, LayerWeights, MtpWeights, TensorRef, Weights,
};

use std::path::Path;

use crate::gguf::GgufFile;

/// An opened model: the mapped file, its configuration and its bound weights.
pub struct ModelFile {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
}

impl ModelFile {
    /// Maps, parses and validates a main-model GGUF. Reads no tensor data.
    pub fn open(path: impl AsRef<Path>) -> Result<ModelFile, ModelError> {
        let file = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::bind(&file, &config)?;
        Ok(ModelFile {
            file,
            config,
            weights,
        })
    }
}

pub mod forward;
pub mod state;
