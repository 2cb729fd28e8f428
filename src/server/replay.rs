//! Where an assistant turn's tool calls come from when a prompt is
//! rendered again: the exact sampled DSML block (the worker's tool memory,
//! PROMPT.md §5.3) or, without it, the canonical block of the model's
//! template. Both renderers (`render`, `render_v41`) ask through this.

/// Looks up the exact sampled block of a turn's calls (tool memory).
pub trait ReplayLookup {
    fn block_for(&mut self, ids: &[&str]) -> Option<String>;
}

/// No memory: always canonical.
pub struct NoReplay;

impl ReplayLookup for NoReplay {
    fn block_for(&mut self, _ids: &[&str]) -> Option<String> {
        None
    }
}
