//! DeepSeek V4.1 Flash (`general.architecture = "deepseek41"`): its
//! configuration with layer roles and the Engram layout (`config.rs`), its
//! weights by ds4's tensor names (`weights.rs`), and the host-side Engram
//! n-gram hashing (`engram.rs`). docs/V41.md describes the format and the
//! decisions; V4 files go through `model::ModelFile` unchanged.

pub mod config;
pub mod dspark;
pub mod engram;
pub mod engram_reader;
pub mod forward;
pub mod weights;

use std::path::Path;

use crate::gguf::GgufFile;
use crate::model::dspark::{attach as attach_drafter, DsparkWeights};
use crate::model::family::Arch;
use crate::model::ModelError;

pub use config::{EngramConfig, LayerRole, V41Config};
pub use weights::{V41Compressor, V41Engram, V41Indexer, V41LayerWeights, V41Weights};

/// An opened V4.1 model: the mapped file, its configuration and its bound
/// weights. Opening reads no tensor data (the Engram tables included).
pub struct V41ModelFile {
    pub file: GgufFile,
    pub config: V41Config,
    pub weights: V41Weights,
    /// The DSpark drafter (`--dspark --mtp-model FILE`), bound at its
    /// offsets in `file` ([`V41ModelFile::attach_dspark`]).
    pub dspark: Option<DsparkWeights>,
}

impl V41ModelFile {
    pub fn open(path: impl AsRef<Path>) -> Result<V41ModelFile, ModelError> {
        Self::from_file(GgufFile::open(path)?)
    }

    pub fn from_file(file: GgufFile) -> Result<V41ModelFile, ModelError> {
        let config = V41Config::from_gguf(&file)?;
        let weights = V41Weights::bind(&file, &config)?;
        Ok(V41ModelFile {
            file,
            config,
            weights,
            dspark: None,
        })
    }

    /// Opens a `deepseek41-dspark` drafter GGUF, checks its keys and every
    /// tensor against this model and attaches it (as V4's
    /// `ModelFile::attach_dspark`; a V4 drafter is refused by family).
    pub fn attach_dspark(&mut self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        if self.dspark.is_some() {
            return Err(ModelError::Inconsistent(
                "a drafter file is already attached".into(),
            ));
        }
        self.dspark = Some(attach_drafter(
            &mut self.file,
            &self.config,
            Arch::V41,
            path.as_ref(),
        )?);
        Ok(())
    }
}

impl V41ModelFile {
    /// Touches every page of the resident weights (as V4's
    /// `ModelFile::warm`), so a timed run does not pay their page-in; the
    /// Engram tables are skipped: they are read by row, never resident.
    pub fn warm(&self) {
        let tables: Vec<&crate::gguf::TensorRef> = self
            .weights
            .layers
            .iter()
            .filter_map(|l| l.engram.as_ref().map(|e| &e.table))
            .collect();
        let mut sink = 0u8;
        for t in self.weights.all() {
            if tables.iter().any(|x| std::ptr::eq(*x, t)) {
                continue;
            }
            for chunk in t.bytes(&self.file).chunks(1 << 24) {
                sink ^= chunk.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
            }
        }
        std::hint::black_box(sink);
    }
}

impl AsRef<GgufFile> for V41ModelFile {
    fn as_ref(&self) -> &GgufFile {
        &self.file
    }
}
