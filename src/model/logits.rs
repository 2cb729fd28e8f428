//! Which positions of a recorded step get logits: what a graph is recorded
//! for (generation, scoring, a batched step), read by both families' head.

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token of the step (generation).
    Last,
    /// Every token of the step (validation, perplexity).
    All,
    /// The last row of each session's piece, in row `state` of a fixed
    /// value of `n` rows (a step of up to `n` sessions, issue 18): a
    /// prefill piece pays the vocabulary projection once, not per row.
    LastPerState(usize),
}
