//! Speculative decoding as the binaries set it up: the [`Speculator`] the
//! `--spec`/`--mtp`/`--dspark` flags ask for ([`SpecChoice`]) and the
//! one-line report of what it did (docs/SPECULATIVE.md).

use crate::app::flags::SpecChoice;
use crate::model::AnyModel;
use crate::speculate::lookup::PromptLookup;
use crate::speculate::{Drafter, Policy, SpecKind, SpecStats, Speculator};

/// The speculator `choice` asks for on `model` (`None`: off); a drafter
/// file that does not fit the model is an error naming the mismatch.
pub fn speculator(choice: &SpecChoice, model: &AnyModel) -> Result<Option<Speculator>, String> {
    let drafter: Box<dyn Drafter> = match choice.kind {
        SpecKind::Off => return Ok(None),
        SpecKind::Lookup => Box::new(PromptLookup::new()),
        SpecKind::Mtp | SpecKind::Dspark => {
            let _ = model;
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
