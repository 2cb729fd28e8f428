//! The DeepSeek V4 model: configuration read from metadata, weights bound by
//! name and validated against it.

pub mod config;
mod error;
pub mod weights;

pub use any_model::AnyModel;
pub use config::{AttentionKind, ModelConfig};
pub use error::ModelError;
pub use family::Arch;
pub use weights::{
    CompressorWeights, IndexerWeights, LayerWeights, MtpWeights, TypeShare, Weights,
};

use std::path::Path;

use crate::gguf::GgufFile;

/// An opened model: the mapped file, its configuration and its bound weights.
pub struct ModelFile {
    /// The main file, with the MTP file attached to it when there is one.
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
    /// The MTP draft block (`--mtp-model FILE`), bound at its offsets in
    /// `file` ([`ModelFile::attach_mtp`]).
    pub mtp: Option<MtpWeights>,
    /// The DSpark drafter (`--dspark --mtp-model FILE`), bound at its
    /// offsets in `file` ([`ModelFile::attach_dspark`]).
    pub dspark: Option<dspark::DsparkWeights>,
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
            mtp: None,
            dspark: None,
        })
    }

    /// Opens the MTP draft GGUF at `path` (GGUF.md §7), checks every
    /// tensor against this model's shapes and attaches it: backends then
    /// read its weights through [`ModelFile::file`] like the model's own.
    pub fn attach_mtp(&mut self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        if self.mtp.is_some() {
            return Err(ModelError::Inconsistent(
                "an MTP file is already attached".into(),
            ));
        }
        let f = GgufFile::open(path)?;
        let base = self.file.next_support_base();
        let mtp = MtpWeights::bind(&f, &self.config, base)?;
        self.file.attach(f);
        self.mtp = Some(mtp);
        Ok(())
    }

    /// Opens a DSpark drafter GGUF (`deepseek4-dspark`, docs/SPECULATIVE.md),
    /// checks its keys and every tensor against this model and attaches it
    /// like the MTP file.
    pub fn attach_dspark(&mut self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        if self.dspark.is_some() || self.mtp.is_some() {
            return Err(ModelError::Inconsistent(
                "a drafter file is already attached".into(),
            ));
        }
        let ds = dspark::attach(
            &mut self.file,
            &self.config,
            family::Arch::V4,
            path.as_ref(),
        )?;
        self.dspark = Some(ds);
        Ok(())
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

pub mod any_model;
pub(crate) mod block;
pub mod dspark;
pub mod family;
pub mod forward;
pub mod logits;
pub mod mtp;
pub mod state;
/// DeepSeek V4.1 (`deepseek41`): a second model family beside V4's.
pub mod v41;

/// Backends read weights through the GGUF file alone.
impl AsRef<crate::gguf::GgufFile> for ModelFile {
    fn as_ref(&self) -> &crate::gguf::GgufFile {
        &self.file
    }
}
