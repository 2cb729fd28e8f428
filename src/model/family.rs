//! Which model family a GGUF holds: `general.architecture` decides.
//! `deepseek4` (or no key, as older V4 files) is V4 Flash/Pro,
//! `deepseek41` is V4.1 Flash. Drafter files name their target's family
//! the same way (`model::dspark`).

use crate::gguf::GgufFile;
use crate::model::error::ModelError;
use crate::model::v41::config::ARCH as V41_ARCH;

/// Which model family a GGUF holds, from `general.architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `deepseek4` (or no architecture key, as older V4 files): V4 Flash/Pro.
    V4,
    /// `deepseek41`: V4.1 Flash.
    V41,
}

impl Arch {
    pub fn of(file: &GgufFile) -> Result<Arch, ModelError> {
        match file.get_str("general.architecture") {
            None | Some("deepseek4") => Ok(Arch::V4),
            Some(V41_ARCH) => Ok(Arch::V41),
            Some(other) => Err(ModelError::WrongKind(format!(
                "general.architecture is {other:?}; ds4 runs \"deepseek4\" and \"deepseek41\""
            ))),
        }
    }
}
