//! Log-probabilities of a job (docs/CLIENTS.md § Log-probabilities): the
//! prompt's tokens scored for completions `echo`, and every generated token
//! with its top alternatives. The numbers are the engine's own log-softmax
//! ([`LogSoftmax`], shared with `ds4 --dump-logprobs`) over the raw logits,
//! before temperature or any filter: the model's distribution, whatever the
//! sampler then did with it.
//!
//! The worker calls this module from two places: [`JobLogprobs::prefill`]
//! (echo: the prompt evaluated with logits at every position) and
//! [`Recorder`] (a [`TokenPicker`] wrapper that scores each pick from the
//! very logits it was picked from). The wire shapes live in `openai.rs`.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::job::Event;
use super::request::GenRequest;
use crate::generate::TokenPicker;
use crate::sampler::{top_ids, LogSoftmax};
use crate::session::{Session, SessionError, SyncStats};
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
    let v = sess.model().config.n_vocab;
    Ok(tokens
        .iter()
        .enumerate()
        .map(|(i, &id)| match i {
            0 => TokenLogprob {
                id,
                bytes: tok.token_bytes(id).unwrap_or(&[]).to_vec(),
                logprob: None,
                top: Vec::new(),
                part: Part::Prompt,
            },
            _ => score(tok, &rows[(i - 1) * v..i * v], id, k, Part::Prompt),
        })
        .collect())
}

/// The prompt of a completions request whose tokens are the client's own
/// (`echo`, or a prompt of token ids): its text and tokens, without the
/// chat template. Text is encoded as rendered text is (a chat marker in it
/// becomes its control token, as in a pre-rendered prompt). `None` for
/// every other request.
pub fn raw_prompt(
    req: &GenRequest,
    tok: &Tokenizer,
) -> Result<Option<(String, Vec<u32>)>, ApiError> {
    if !req.scoring.raw_prompt() {
        return Ok(None);
    }
    let (text, ids) = match &req.scoring.prompt_ids {
        Some(ids) => {
            let vocab = tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(&format!(
                    "prompt token id {bad} is outside the vocabulary ({vocab} tokens)"
                )));
            }
            let text = String::from_utf8_lossy(&tok.decode(ids)).into_owned();
            (text, ids.clone())
        }
        None => {
            let text = req.prompt.clone().unwrap_or_default();
            let ids = tok.encode_chat(&text);
            (text, ids)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("empty prompt: there is nothing to score"));
    }
    Ok(Some((text, ids)))
}

/// A job's log-probability state, from prefill to the final answer.
#[derive(Debug, Default)]
pub struct JobLogprobs {
    /// Alternatives per token; `None`: no log-probabilities asked for.
    pub top: Option<usize>,
    /// The echoed prompt text (completions `echo`).
    pub echo: Option<String>,
    /// The prompt's entries (echo with logprobs), then the generated ones.
    pub entries: Vec<TokenLogprob>,
}

impl JobLogprobs {
    pub fn new(req: &GenRequest) -> JobLogprobs {
        JobLogprobs {
            top: req.scoring.top,
            echo: None,
            entries: Vec::new(),
        }
    }

    /// Prefill of an `echo` request: the prompt scored at every position
    /// (with logprobs) or brought in as usual (`None`: the caller's
    /// prefill). Streaming clients get the echo as the first text.
    pub fn prefill(
        &mut self,
        req: &GenRequest,
        sess: &mut Session,
        tok: &Tokenizer,
        prompt: &[u32],
        events: &UnboundedSender<Event>,
    ) -> Option<Result<SyncStats, SessionError>> {
        if !req.scoring.echo {
            return None;
        }
        let text = String::from_utf8_lossy(&tok.decode(prompt)).into_owned();
        let stats = match self.top {
            Some(k) => match score_prompt(sess, tok, prompt, k) {
                Ok(e) => {
                    let _ = events.send(Event::Logprobs(e.clone()));
                    self.entries = e;
                    Ok(SyncStats {
                        reused: 0,
                        evaluated: prompt.len(),
                    })
                }
                Err(e) => Err(e),
            },
            None => sess.sync(prompt, &mut |_, _| {}),
        };
        if stats.is_ok() {
            let _ = events.send(Event::Text(text.clone()));
            self.echo = Some(text);
        }
        Some(stats)
    }

    /// Wraps the job's picker so that each pick is scored.
    pub fn recorder<'p>(
        &self,
        inner: &'p mut dyn TokenPicker,
        tok: Arc<Tokenizer>,
        thinking: bool,
        events: UnboundedSender<Event>,
    ) -> Recorder<'p> {
        Recorder {
            inner,
            top: self.top,
            reasoning: thinking,
            think_close: tok.specials().think_close,
            tok,
            events,
            entries: Vec::new(),
        }
    }

    /// The entries the answer carries: the prompt's, then the generated
    /// tokens that made it into the text (a token past a stop-sequence cut
    /// is dropped; a picked EOS is kept, as the last entry). `None` when
    /// none were asked for.
    pub fn finish(
        mut self,
        generated: Vec<TokenLogprob>,
        text_bytes: usize,
        eos: u32,
    ) -> Option<Vec<TokenLogprob>> {
        self.top?;
        let mut at = 0;
        for e in generated {
            if at >= text_bytes && e.id != eos && !e.bytes.is_empty() {
                break;
            }
            at += e.bytes.len();
            self.entries.push(e);
        }
        Some(self.entries)
    }
}

/// A picker that scores every token its inner picker picks, from the same
/// logits, and sends the entry to the stream before the token's text.
pub struct Recorder<'p> {
    inner: &'p mut dyn TokenPicker,
    top: Option<usize>,
    /// Still before `</think>`.
    reasoning: bool,
    think_close: u32,
    tok: Arc<Tokenizer>,
    events: UnboundedSender<Event>,
    pub entries: Vec<TokenLogprob>,
}

impl TokenPicker for Recorder<'_> {
    fn pick(&mut self, logits: &[f32], greedy: bool) -> u32 {
        let id = self.inner.pick(logits, greedy);
        if let Some(k) = self.top {
            let part = if self.reasoning {
                Part::Reasoning
            } else {
                Part::Content
            };
            if id == self.think_close {
                self.reasoning = false;
            }
            let e = score(&self.tok, logits, id, k, part);
            let _ = self.events.send(Event::Logprobs(vec![e.clone()]));
            self.entries.push(e);
        }
        id
    }
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
