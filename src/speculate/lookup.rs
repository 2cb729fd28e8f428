//! Prompt lookup (`--spec lookup`): the drafter without a model. The
//! longest recent n-gram ending the context (6 tokens down to 2) is looked
//! up among the context's earlier n-grams, and the tokens that followed its
//! most recent earlier occurrence are proposed. Coding agents re-emit long
//! spans of the files they were sent, which this finds at once.
//!
//! The index is kept across calls: each call adds the n-grams of the
//! tokens appended since the last one, so a step costs a few hash lookups
//! whatever the context length. A context that does not continue the one
//! indexed (a new request) is indexed afresh.

use std::collections::HashMap;

use super::{DraftContext, Drafter};

/// Longest and shortest n-gram looked up.
pub const MAX_NGRAM: usize = 6;
pub const MIN_NGRAM: usize = 2;

/// The prompt-lookup drafter.
#[derive(Default)]
pub struct PromptLookup {
    /// The context indexed so far.
    seen: Vec<u32>,
    /// Per n-gram length (index n − MIN_NGRAM): hash of the n tokens
    /// ending at `e` (exclusive) → the latest such `e` that has a token
    /// after it (`e < seen.len()`).
    index: Vec<HashMap<u64, usize>>,
    /// n-grams ending before this position are indexed.
    indexed_to: usize,
}

fn hash(gram: &[u32]) -> u64 {
    // FNV-1a over the ids; collisions are checked against the tokens.
    gram.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl PromptLookup {
    pub fn new() -> PromptLookup {
        PromptLookup {
            index: (MIN_NGRAM..=MAX_NGRAM).map(|_| HashMap::new()).collect(),
            ..Default::default()
        }
    }

    /// Brings the index to `ctx`: appends when `ctx` continues what was
    /// indexed, starts over otherwise.
    fn sync(&mut self, ctx: &[u32]) {
        let continues = ctx.len() >= self.seen.len() && ctx[..self.seen.len()] == self.seen[..];
        if !continues {
            self.seen.clear();
            self.indexed_to = 0;
            for m in &mut self.index {
                m.clear();
            }
        }
        self.seen.extend_from_slice(&ctx[self.seen.len()..]);
        // n-grams ending at e (exclusive) for e < len: each has a follower.
        let len = self.seen.len();
        for e in self.indexed_to.max(MIN_NGRAM)..len {
            for n in MIN_NGRAM..=MAX_NGRAM.min(e) {
                let h = hash(&self.seen[e - n..e]);
                self.index[n - MIN_NGRAM].insert(h, e);
            }
        }
        self.indexed_to = len.max(self.indexed_to);
    }

    /// Up to `k` tokens after the most recent earlier occurrence of the
    /// longest n-gram ending `ctx`.
    pub fn lookup(&mut self, ctx: &[u32], k: usize) -> Vec<u32> {
        self.sync(ctx);
        let len = self.seen.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (MIN_NGRAM..=MAX_NGRAM.min(len)).rev() {
            let gram = &self.seen[len - n..];
            let Some(&e) = self.index[n - MIN_NGRAM].get(&hash(gram)) else {
                continue;
            };
            if e >= len || self.seen[e - n..e] != *gram {
                continue;
            }
            return self.seen[e..len.min(e + k)].to_vec();
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn draft(&mut self, cx: &DraftContext<'_>, k: usize) -> Vec<u32> {
        let mut ctx = Vec::with_capacity(cx.tokens.len() + 1);
        ctx.extend_from_slice(cx.tokens);
        ctx.push(cx.next);
        self.lookup(&ctx, k)
    }

    fn cheap(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_latest_longest_match() {
        let mut d = PromptLookup::new();
        // "1 2 3 4 5 … 1 2 3 9 … 1 2 3" → the latest "1 2 3" went on with 9.
        let ctx = [1, 2, 3, 4, 5, 6, 1, 2, 3, 9, 8, 7, 1, 2, 3];
        assert_eq!(d.lookup(&ctx, 3), vec![9, 8, 7]);
        // A longer match wins over a later shorter one.
        let ctx = [5, 1, 2, 3, 4, 6, 1, 2, 3, 7, 0, 5, 1, 2, 3];
        assert_eq!(d.lookup(&ctx, 2), vec![4, 6]);
    }

    #[test]
    fn continues_and_restarts() {
        let mut d = PromptLookup::new();
        assert!(d.lookup(&[1, 2, 3], 4).is_empty());
        assert_eq!(d.lookup(&[1, 2, 3, 1, 2], 4), vec![3, 1, 2]);
        assert_eq!(d.lookup(&[1, 2, 3, 1, 2, 3], 2), vec![1, 2]);
        // Not a continuation: indexed afresh.
        assert!(d.lookup(&[7, 8, 9], 4).is_empty());
        assert_eq!(d.lookup(&[7, 8, 9, 7, 8], 1), vec![9]);
        assert!(d.lookup(&[7, 8, 9, 7, 8], 0).is_empty());
    }

    #[test]
    fn proposal_stops_at_the_context_end() {
        let mut d = PromptLookup::new();
        // The match "4 4" ends at 3; its followers run to the end.
        assert_eq!(d.lookup(&[4, 4, 4], 5), vec![4]);
    }
}
