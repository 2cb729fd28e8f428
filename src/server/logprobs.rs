//! Log-probabilities of a job (docs/CLIENTS.md § Log-probabilities): the
//! prompt's tokens scored for completions `echo`, and every generated token
//! with its top alternatives. The numbers are the engine's own log-softmax
//! ([`LogSoftmax`], shared with `ds4 --dump-logprobs`) over the raw logits,
//! before temperature or any filter: the model's distribution, whatever the
//! sampler then did with it.
//!
//! What a job does with them (echo prefill, the recording picker) is in
//! `scoring.rs`; the wire shapes live in `openai.rs`.

use crate::sampler::{top_ids, LogSoftmax};
use crate::session::{Session, SessionError};
use crate::tokenizer::Tokenizer;

/// Which part of the output a token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// An echoed prompt token.
    Prompt,
    /// Generated before `</think>` (the `</think>` token included).
    Reasoning,
    /// Generated visible text (and the closing EOS, when one was picked).
    Content,
}

/// One alternative at a position.
#[derive(Clone, Debug, PartialEq)]
pub struct Alt {
    pub id: u32,
    pub bytes: Vec<u8>,
    pub logprob: f64,
}

/// One scored token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub bytes: Vec<u8>,
    /// `None` for the first prompt token: nothing before it predicts it.
    pub logprob: Option<f64>,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<Alt>,
    pub part: Part,
}

/// Scores `id` against one row of logits, with `k` alternatives.
pub fn score(tok: &Tokenizer, logits: &[f32], id: u32, k: usize, part: Part) -> TokenLogprob {
    let ls = LogSoftmax::new(logits);
    let bytes = |id: u32| tok.token_bytes(id).unwrap_or(&[]).to_vec();
    TokenLogprob {
        id,
        bytes: bytes(id),
        logprob: logits.get(id as usize).map(|&l| ls.of(l)),
        top: top_ids(logits, k)
            .into_iter()
            .map(|i| Alt {
                id: i as u32,
                bytes: bytes(i as u32),
                logprob: ls.of(logits[i]),
            })
            .collect(),
        part,
    }
}

/// Evaluates `tokens` from an empty state with logits at every position
/// and scores each token from the row before it (the first gets `None`).
/// The session ends holding `tokens`, ready to generate after them.
pub fn score_prompt(
    sess: &mut Session,
    tok: &Tokenizer,
    tokens: &[u32],
    k: usize,
) -> Result<Vec<TokenLogprob>, SessionError> {
    let rows = sess.score(tokens)?;
    let v = sess.n_vocab();
    let mut out = vec![first_prompt_entry(tok, tokens[0])];
    out.extend(score_following(tok, &rows, v, &tokens[1..], k));
    Ok(out)
}

/// The entry of a prompt's first token: nothing before it predicts it.
pub fn first_prompt_entry(tok: &Tokenizer, id: u32) -> TokenLogprob {
    TokenLogprob {
        id,
        bytes: tok.token_bytes(id).unwrap_or(&[]).to_vec(),
        logprob: None,
        top: Vec::new(),
        part: Part::Prompt,
    }
}

/// Prompt entries for `next` scored from `rows` (`vocab` floats each): row
/// `i` holds the logits after the token before `next[i]`. Rows beyond
/// `next` are not read, so a piece's last row may stand without a token
/// after it.
pub fn score_following(
    tok: &Tokenizer,
    rows: &[f32],
    vocab: usize,
    next: &[u32],
    k: usize,
) -> Vec<TokenLogprob> {
    rows.chunks_exact(vocab)
        .zip(next)
        .map(|(row, &id)| score(tok, row, id, k, Part::Prompt))
        .collect()
}

/// Byte offsets of each entry's start in the concatenated bytes, as
/// character offsets of the text those bytes decode to (a token that starts
/// inside a character gets the offset of that character's end).
pub fn char_offsets(entries: &[TokenLogprob], start: usize) -> Vec<usize> {
    let mut at = start;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        out.push(at);
        at += chars(&e.bytes);
    }
    out
}

/// Characters that start in `bytes` (UTF-8 lead bytes and ASCII).
pub fn chars(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| (b & 0xC0) != 0x80).count()
}

/// A token's text for the completions shape: the text when its bytes are
/// whole UTF-8, else `bytes:\xNN…` (OpenAI's spelling for a token that
/// splits a character).
pub fn token_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::from("bytes:");
            for b in bytes {
                s.push_str(&format!("\\x{b:02x}"));
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: &[u8]) -> TokenLogprob {
        TokenLogprob {
            id: 1,
            bytes: bytes.to_vec(),
            logprob: Some(0.0),
            top: Vec::new(),
            part: Part::Content,
        }
    }

    #[test]
    fn offsets_count_characters_and_split_tokens_spell_bytes() {
        // "é" split over two tokens, then "a".
        let e = [entry(b"x"), entry(&[0xC3]), entry(&[0xA9]), entry(b"a")];
        assert_eq!(char_offsets(&e, 0), vec![0, 1, 2, 2]);
        assert_eq!(token_text(&[0xC3]), "bytes:\\xc3");
        assert_eq!(token_text("é".as_bytes()), "é");
    }

    #[test]
    fn log_softmax_sums_to_one_and_ranks_ties_by_id() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, f32::NEG_INFINITY];
        let ls = LogSoftmax::new(&logits);
        let p: f64 = logits.iter().map(|&l| ls.of(l).exp()).sum();
        assert!((p - 1.0).abs() < 1e-12, "{p}");
        assert_eq!(top_ids(&logits, 3), vec![1, 2, 0]);
        assert_eq!(top_ids(&logits, 9), vec![1, 2, 0, 3, 4]);
        assert!(top_ids(&logits, 0).is_empty());
    }
}
