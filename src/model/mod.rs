//! The DeepSeek V4 model: configuration read from metadata, weights bound by
//! name and validated against it.

pub mod config;
mod error;
pub mod weights;

pub use arch::{AnyModel, Arch};
pub use config::{AttentionKind, ModelConfig};
pub use error::ModelError;
pub use weights::{
    CompressorWeights, IndexerWeights, LayerWeights, MtpWeights, TypeShare, Weights,
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
    /// Reads every page of the weights once so the first tokens do not pay
    /// for page faults; `progress(done, total)` in bytes.
    pub fn warm(&self, progress: &mut dyn FnMut(u64, u64)) {
        let total = self.weights.total_bytes();
        let mut done = 0u64;
        let mut sink = 0u8;
        for t in self.weights.all() {
            for chunk in t.bytes(&self.file).chunks(1 << 24) {
                sink ^= chunk.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
                done += chunk.len() as u64;
                progress(done, total);
            }
        }
        std::hint::black_box(sink);
    }
}

pub mod arch;
pub(crate) mod block;
pub mod forward;
pub mod logits;
pub mod state;
/// DeepSeek V4.1 (`deepseek41`): a second model family beside V4's.
pub mod v41;

/// Backends read weights through the GGUF file alone.
impl AsRef<crate::gguf::GgufFile> for ModelFile {
    fn as_ref(&self) -> &crate::gguf::GgufFile {
        &self.file
    }
}
