//! Speculative decoding as the binaries set it up: the [`Speculator`] the
//! `--spec`/`--mtp`/`--dspark` flags ask for ([`SpecChoice`]) and the
//! one-line report of what it did (docs/SPECULATIVE.md).

use std::path::Path;
use std::sync::Arc;

use crate::app::flags::SpecChoice;
use crate::model::{AnyModel, ModelFile};
use crate::speculate::lookup::PromptLookup;
use crate::speculate::mtp::MtpDrafter;
use crate::speculate::{Drafter, Policy, SpecKind, SpecStats, Speculator};

/// Opens the model at `path` with what `choice` drafts from: with `--mtp`,
/// the MTP file attached (every tensor checked against the model's shapes,
/// a mismatch named). Errors name the file.
pub fn open_model(path: &Path, choice: &SpecChoice) -> Result<AnyModel, String> {
    let at = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let model = AnyModel::open(path).map_err(|e| at(path, &e))?;
    if choice.kind != SpecKind::Mtp {
        return Ok(model);
    }
    let file = choice
        .drafter_file
        .as_deref()
        .ok_or("--mtp needs the drafter's GGUF: --mtp-model FILE")?;
    match model {
        AnyModel::V41(_) => Err(format!(
            "--mtp: {} is a DeepSeek V4.1 model, which has no MTP block (its drafter is DSpark)",
            path.display()
        )),
        AnyModel::V4(m) => {
            drop(m);
            let mut m = ModelFile::open(path).map_err(|e| at(path, &e))?;
            m.attach_mtp(file)
                .map_err(|e| format!("--mtp-model {}: {e}", file.display()))?;
            Ok(AnyModel::V4(Arc::new(m)))
        }
    }
}

/// Whether sessions must be opened with the MTP block
/// ([`crate::session::SessionOptions::mtp`]).
pub fn session_mtp(choice: &SpecChoice) -> bool {
    choice.kind == SpecKind::Mtp
}

/// The speculator `choice` asks for on `model` (`None`: off); a drafter
/// file that does not fit the model is an error naming the mismatch.
pub fn speculator(choice: &SpecChoice, model: &AnyModel) -> Result<Option<Speculator>, String> {
    let drafter: Box<dyn Drafter> = match choice.kind {
        SpecKind::Off => return Ok(None),
        SpecKind::Lookup => Box::new(PromptLookup::new()),
        SpecKind::Mtp => match model {
            AnyModel::V4(m) if m.mtp.is_some() => Box::new(MtpDrafter),
            _ => return Err("--mtp: the model was opened without its MTP file".into()),
        },
        SpecKind::Dspark => {
            return Err(format!(
                "--{}: this build has no {} drafter yet (use --spec lookup)",
                choice.kind.name(),
                choice.kind.name()
            ));
        }
    };
    let policy = if choice.fixed {
        Policy::fixed(choice.max_draft, choice.max_draft)
    } else {
        Policy::new(choice.max_draft)
    };
    Ok(Some(Speculator::new(drafter, policy)))
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
