//! An opened model of either family ([`Arch`], `model::family`).
//! [`AnyModel`] is what the session, the binaries and the server open; what
//! the two families share is read through it without matching on the
//! family.

use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::model::config::CoreConfig;
use crate::model::family::Arch;
use crate::model::v41::V41ModelFile;
use crate::model::{ModelError, ModelFile};

/// An opened model of either family, recognised by `general.architecture`.
#[derive(Clone)]
pub enum AnyModel {
    V4(Arc<ModelFile>),
    V41(Arc<V41ModelFile>),
}

impl AnyModel {
    /// Opens a V4 or V4.1 GGUF (nothing read beyond the header).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<AnyModel, ModelError> {
        let file = crate::gguf::GgufFile::open(path.as_ref())?;
        Ok(match Arch::of(&file)? {
            Arch::V4 => {
                drop(file);
                AnyModel::V4(Arc::new(ModelFile::open(path)?))
            }
            Arch::V41 => AnyModel::V41(Arc::new(V41ModelFile::from_file(file)?)),
        })
    }

    pub fn arch(&self) -> Arch {
        match self {
            AnyModel::V4(_) => Arch::V4,
            AnyModel::V41(_) => Arch::V41,
        }
    }

    pub fn file(&self) -> &crate::gguf::GgufFile {
        match self {
            AnyModel::V4(m) => &m.file,
            AnyModel::V41(m) => &m.file,
        }
    }

    /// The hyper-parameters both families have.
    pub fn config(&self) -> &CoreConfig {
        match self {
            AnyModel::V4(m) => &m.config,
            AnyModel::V41(m) => &m.config,
        }
    }

    pub fn n_layer(&self) -> usize {
        self.config().n_layer
    }

    /// Weight bytes one decoded token reads (routed experts at top-k of n;
    /// never V4.1's Engram tables, read by row from the file).
    pub fn active_bytes_per_token(&self) -> u64 {
        match self {
            AnyModel::V4(m) => m.weights.active_bytes_per_token(&m.config),
            AnyModel::V41(m) => m.weights.active_bytes_per_token(&m.config),
        }
    }

    /// Faults the resident weights' pages in (V4.1: not the Engram tables).
    pub fn warm(&self) {
        match self {
            AnyModel::V4(m) => m.warm(&mut |_, _| {}),
            AnyModel::V41(m) => m.warm(),
        }
    }

    /// Routed-expert quant bits for KVC headers (4 iff layer 0's routed
    /// gate experts are Q4_K, else 2; KVCACHE.md §4.1).
    pub fn routed_quant_bits(&self) -> u8 {
        let ty = match self {
            AnyModel::V4(m) => m.weights.layers.first().map(|l| l.ffn.gate_exps.ty),
            AnyModel::V41(m) => m.weights.layers.first().map(|l| l.ffn.gate_exps.ty),
        };
        if ty == Some(crate::quant::GgmlType::Q4K) {
            4
        } else {
            2
        }
    }

    /// The vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.config().n_vocab
    }

    /// The V4 model, if this is one.
    pub fn v4(&self) -> Option<&Arc<ModelFile>> {
        match self {
            AnyModel::V4(m) => Some(m),
            AnyModel::V41(_) => None,
        }
    }

    /// The file the backends read weights from.
    pub fn weight_file(&self) -> Arc<dyn AsRef<GgufFile> + Send + Sync> {
        match self {
            AnyModel::V4(m) => m.clone(),
            AnyModel::V41(m) => m.clone(),
        }
    }
}
