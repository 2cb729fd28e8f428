//! The draft models' drafter: V4 Flash's MTP block (MODEL.md §6) or
//! DeepSeek's DSpark, run by the session that holds the target's state
//! ([`Session::model_draft`]; the session must be opened with
//! [`crate::session::SessionOptions::drafter`]).

use super::{DraftContext, Drafter};
use crate::session::{Session, SessionError};

/// Drafts with the session's draft model, greedy.
#[derive(Clone, Copy, Debug)]
pub struct ModelDrafter {
    name: &'static str,
}

impl ModelDrafter {
    /// The MTP block (`--mtp`).
    pub const MTP: ModelDrafter = ModelDrafter { name: "mtp" };
    /// DSpark (`--dspark`).
    pub const DSPARK: ModelDrafter = ModelDrafter { name: "dspark" };
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        self.name
    }

    /// DSpark drafts its whole block in one run, whatever is asked.
    fn costs_per_call(&self) -> bool {
        self.name == "dspark"
    }

    /// Without a session there is nothing to run the model on.
    fn draft(&mut self, _cx: &DraftContext<'_>, _k: usize) -> Vec<u32> {
        Vec::new()
    }

    fn draft_in(
        &mut self,
        sess: &mut Session,
        next: u32,
        k: usize,
    ) -> Result<Vec<u32>, SessionError> {
        sess.model_draft(next, k)
    }
}
