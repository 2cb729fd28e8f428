//! The worker's live-reuse decision as pure functions (KVCACHE.md §2, the
//! rules that keep the live KV slot: the Responses visible transcript, the
//! token prefix, the thinking-visible transcript and the decoded text). They
//! take the live state as plain data and return where the new text starts,
//! so the fuzz target `reuse_plan` and the property tests drive them without
//! a model.
//!
//! The one trap: token text is byte-level BPE, so the live tokens may
//! decode to bytes that end inside a UTF-8 character (a reply cut by
//! `max_tokens` in the middle of a CJK character or an emoji). A request
//! that resends the history with that character completed then starts with
//! those bytes, but the rest cannot be sliced off as text. Such a prefix is
//! not reusable: the plan falls back to the cold path (issue 25, item 1).

/// How a request continues the live session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LivePlan {
    /// Keep every live token and append the tokens of `text[from..]`;
    /// `from` is always a character boundary of `text`.
    Append { from: usize, source: &'static str },
    /// The request's own tokens begin with the live tokens.
    Tokens,
    /// Nothing live is reusable.
    Cold,
}

/// The live state the decision reads. `thinking_visible` is the remembered
/// thinking-turn transcript, given only when it was bound at the live
/// length and the request is chat-style.
pub struct Live<'a> {
    pub tokens: &'a [u32],
    pub thinking_visible: Option<&'a str>,
}

/// Where the new text starts when `text` continues `prefix` at a character
/// boundary; `None` when it does not continue it or when the prefix ends
/// inside a character of `text`.
pub fn continuation(text: &str, prefix: &[u8]) -> Option<usize> {
    (text.as_bytes().starts_with(prefix) && text.is_char_boundary(prefix.len()))
        .then_some(prefix.len())
}

/// As [`continuation`], but `text` must also be longer than `prefix` (a
/// remembered transcript alone leaves nothing to answer).
pub fn strict_continuation(text: &str, prefix: &[u8]) -> Option<usize> {
    continuation(text, prefix).filter(|&n| n < text.len())
}

/// Rules 4-6 in order: the token prefix, the thinking-visible transcript,
/// then the decoded live text. `full` is the request's own tokenization;
/// `decode` yields the live tokens' bytes and is called only when needed.
pub fn plan_live(
    live: &Live<'_>,
    text: &str,
    full: &[u32],
    decode: impl FnOnce() -> Vec<u8>,
) -> LivePlan {
    if live.tokens.is_empty() {
        return LivePlan::Cold;
    }
    if full.starts_with(live.tokens) {
        return LivePlan::Tokens;
    }
    if let Some(from) = live
        .thinking_visible
        .and_then(|v| strict_continuation(text, v.as_bytes()))
    {
        return LivePlan::Append {
            from,
            source: "thinking-visible",
        };
    }
    match continuation(text, &decode()) {
        Some(from) => LivePlan::Append {
            from,
            source: "memory-text",
        },
        None => LivePlan::Cold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Rng;

    /// The case: the reply ended with `d7 9b d7` (a Hebrew letter and
    /// the first byte of the next), the history came back with `d7 99`.
    #[test]
    fn a_prefix_that_splits_a_character_is_cold() {
        let text = "prompt כי and a new turn";
        let cut = "prompt כ".len() + 1;
        let decoded = text.as_bytes()[..cut].to_vec();
        let live = Live {
            tokens: &[1, 2, 3],
            thinking_visible: None,
        };
        assert_eq!(plan_live(&live, text, &[9], || decoded), LivePlan::Cold);
        let whole = text.as_bytes()[..cut + 1].to_vec();
        assert_eq!(
            plan_live(&live, text, &[9], || whole),
            LivePlan::Append {
                from: cut + 1,
                source: "memory-text"
            }
        );
    }

    #[test]
    fn rules_apply_in_order() {
        let live = Live {
            tokens: &[1, 2],
            thinking_visible: Some("ab"),
        };
        assert_eq!(
            plan_live(&live, "abc", &[1, 2, 3], Vec::new),
            LivePlan::Tokens
        );
        assert_eq!(
            plan_live(&live, "abc", &[7], || b"a".to_vec()),
            LivePlan::Append {
                from: 2,
                source: "thinking-visible"
            }
        );
        // The transcript alone is not a continuation; the decoded text is.
        assert_eq!(
            plan_live(&live, "ab", &[7], || b"a".to_vec()),
            LivePlan::Append {
                from: 1,
                source: "memory-text"
            }
        );
        assert_eq!(
            plan_live(&live, "xy", &[7], || b"a".to_vec()),
            LivePlan::Cold
        );
        let empty = Live {
            tokens: &[],
            thinking_visible: None,
        };
        assert_eq!(plan_live(&empty, "", &[], Vec::new), LivePlan::Cold);
    }

    /// Random texts of 1- to 4-byte characters, cut at every kind of byte
    /// offset: an `Append` always starts at a character boundary, and a
    /// whole-character prefix is never refused.
    #[test]
    fn random_cuts_never_split_a_character() {
        const CHARS: [char; 8] = ['a', ' ', '\n', 'é', 'כ', '中', '😀', '<'];
        let mut rng = Rng::new(0x5eed25);
        for _ in 0..20_000 {
            let n = (rng.next_u64() % 12) as usize;
            let text: String = (0..n)
                .map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize])
                .collect();
            let cut = (rng.next_u64() % (text.len() as u64 + 1)) as usize;
            let mut prefix = text.as_bytes()[..cut].to_vec();
            if rng.next_u64() % 4 == 0 {
                prefix.push((rng.next_u64() & 0xff) as u8);
            }
            let live = Live {
                tokens: &[1],
                thinking_visible: None,
            };
            let plan = plan_live(&live, &text, &[2], || prefix.clone());
            let expect_reuse =
                text.as_bytes().starts_with(&prefix) && text.is_char_boundary(prefix.len());
            match plan {
                LivePlan::Append { from, .. } => {
                    assert!(expect_reuse, "{text:?} {prefix:?}");
                    assert_eq!(from, prefix.len());
                    assert!(text.get(from..).is_some());
                }
                LivePlan::Cold => assert!(!expect_reuse, "{text:?} {prefix:?}"),
                LivePlan::Tokens => unreachable!("the token prefix never matches here"),
            }
        }
    }
}
