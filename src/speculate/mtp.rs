//! The MTP drafter: V4 Flash's MTP block (MODEL.md §6), run by the session
//! that holds the target's state ([`Session::mtp_draft`]; the session must
//! be opened with [`crate::session::SessionOptions::mtp`]).

use super::{DraftContext, Drafter};
use crate::session::{Session, SessionError};

/// Drafts with the session's MTP block: greedy, one block step per token.
#[derive(Clone, Copy, Debug, Default)]
pub struct MtpDrafter;

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    /// Without a session there is nothing to run the block on.
    fn draft(&mut self, _cx: &DraftContext<'_>, _k: usize) -> Vec<u32> {
        Vec::new()
    }

    fn draft_in(
        &mut self,
        sess: &mut Session,
        next: u32,
        k: usize,
    ) -> Result<Vec<u32>, SessionError> {
        sess.mtp_draft(next, k)
    }
}
