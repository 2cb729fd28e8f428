//! Speculative decoding as the binaries set it up: the [`Speculator`] the
//! `--spec`/`--mtp`/`--dspark` flags ask for ([`SpecChoice`]) and the
//! one-line report of what it did (docs/SPECULATIVE.md).

use std::path::Path;
use std::sync::Arc;

use crate::app::flags::SpecChoice;
use crate::model::v41::V41ModelFile;
use crate::model::{AnyModel, ModelFile};
use crate::session::DraftModel;
use crate::speculate::draft_model::ModelDrafter;
use crate::speculate::lookup::PromptLookup;
use crate::speculate::{Drafter, Policy, SpecKind, SpecStats, Speculator};

/// Opens the model at `path` with what `choice` drafts from: with `--mtp`
/// or `--dspark`, the drafter's file attached (its keys and every tensor
/// checked against the model, a mismatch named). Errors name the file.
pub fn open_model(path: &Path, choice: &SpecChoice) -> Result<AnyModel, String> {
    let at = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let model = AnyModel::open(path).map_err(|e| at(path, &e))?;
    let flag = match choice.kind {
        SpecKind::Mtp => "--mtp",
        SpecKind::Dspark => "--dspark",
        _ => return Ok(model),
    };
    let file = choice
        .drafter_file
        .as_deref()
        .ok_or_else(|| format!("{flag} needs the drafter's GGUF: --mtp-model FILE"))?;
    match model {
        AnyModel::V41(_) if choice.kind == SpecKind::Mtp => Err(format!(
            "--mtp: {} is a DeepSeek V4.1 model, which has no MTP block (its drafter is DSpark)",
            path.display()
        )),
        AnyModel::V41(m) => {
            drop(m);
            let mut m = V41ModelFile::open(path).map_err(|e| at(path, &e))?;
            m.attach_dspark(file)
                .map_err(|e| format!("--mtp-model {}: {e}", file.display()))?;
            Ok(AnyModel::V41(Arc::new(m)))
        }
        AnyModel::V4(m) => {
            drop(m);
            let mut m = ModelFile::open(path).map_err(|e| at(path, &e))?;
            let r = if choice.kind == SpecKind::Mtp {
                m.attach_mtp(file)
            } else {
                m.attach_dspark(file)
            };
            r.map_err(|e| format!("--mtp-model {}: {e}", file.display()))?;
            Ok(AnyModel::V4(Arc::new(m)))
        }
    }
}

/// The draft model sessions must be opened with
/// ([`crate::session::SessionOptions::drafter`]).
pub fn session_drafter(choice: &SpecChoice) -> DraftModel {
    match choice.kind {
        SpecKind::Mtp => DraftModel::Mtp,
        SpecKind::Dspark => DraftModel::Dspark,
        _ => DraftModel::None,
    }
}

/// The speculator `choice` asks for on `model` (`None`: off); a drafter
/// file that does not fit the model is an error naming the mismatch.
pub fn speculator(choice: &SpecChoice, model: &AnyModel) -> Result<Option<Speculator>, String> {
    let drafter: Box<dyn Drafter> = match choice.kind {
        SpecKind::Off => return Ok(None),
        SpecKind::Lookup => Box::new(PromptLookup::new()),
        SpecKind::Mtp => match model {
            AnyModel::V4(m) if m.mtp.is_some() => Box::new(ModelDrafter::MTP),
            _ => return Err("--mtp: the model was opened without its MTP file".into()),
        },
        SpecKind::Dspark => match model {
            AnyModel::V4(m) if m.dspark.is_some() => Box::new(ModelDrafter::DSPARK),
            AnyModel::V41(m) if m.dspark.is_some() => Box::new(ModelDrafter::DSPARK),
            _ => return Err("--dspark: the model was opened without its DSpark file".into()),
        },
    };
    let max_draft = clamp_to_block(choice, model);
    let policy = if choice.fixed {
        Policy::fixed(max_draft, max_draft)
    } else {
        Policy::new(max_draft)
    };
    Ok(Some(Speculator::new(drafter, policy)))
}

/// The draft length `choice` asks for, clamped to the DSpark file's block
/// (it drafts one block per call), with a note when it had to be.
fn clamp_to_block(choice: &SpecChoice, model: &AnyModel) -> usize {
    let block = match model {
        AnyModel::V4(m) => m.dspark.as_ref(),
        AnyModel::V41(m) => m.dspark.as_ref(),
    }
    .filter(|_| choice.kind == SpecKind::Dspark)
    .map(|ds| ds.config.block_size);
    match block {
        Some(b) if choice.max_draft > b => {
            crate::log_line!(
                "ds4: --draft {}: the DSpark file drafts blocks of {b}; drafting at most {b}",
                choice.max_draft
            );
            b
        }
        _ => choice.max_draft,
    }
}

/// `speculation (lookup): 120 drafted, 84 kept (70.0 %), 2.40 tokens per
/// verify step, 35 verify and 12 plain steps`.
pub fn line(name: &str, st: &SpecStats) -> String {
    format!(
        "speculation ({name}): {} drafted, {} kept ({:.1} %), {:.2} tokens per verify step, \
         {} verify and {} plain steps",
        st.drafted,
        st.accepted,
        100.0 * st.acceptance(),
        st.tokens_per_verify(),
        st.verify_steps,
        st.plain_steps
    )
}
