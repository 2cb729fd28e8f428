//! A job's log-probabilities and echo (docs/CLIENTS.md § Log-probabilities),
//! from the worker's two hooks: [`JobLogprobs::prefill`] (an `echo` prompt
//! evaluated with logits at every position and scored) and [`Recorder`] (a
//! [`TokenPicker`] wrapper that scores each pick from the very logits it
//! was picked from). Plus [`raw_prompt`]: the client's own tokens for echo
//! and token-id prompts. The numbers come from `logprobs.rs`.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::job::Event;
use super::logprobs::{score, score_prompt, Part, TokenLogprob};
use super::request::GenRequest;
use crate::generate::TokenPicker;
use crate::session::{Session, SessionError, SyncStats};
use crate::tokenizer::Tokenizer;

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
        let stats = match self.top {
            Some(k) => score_prompt(sess, tok, prompt, k).map(|e| {
                self.echoed(tok, prompt, Some(e), events);
                SyncStats {
                    reused: 0,
                    evaluated: prompt.len(),
                }
            }),
            None => sess.sync(prompt, &mut |_, _| {}).inspect(|_| {
                self.echoed(tok, prompt, None, events);
            }),
        };
        Some(stats)
    }

    /// The end of an `echo` prefill (a session's or a slot's): the prompt's
    /// entries (with logprobs) and then its text go to the stream, in that
    /// order, and are kept for the final answer.
    pub fn echoed(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        entries: Option<Vec<TokenLogprob>>,
        events: &UnboundedSender<Event>,
    ) {
        if let Some(e) = entries {
            let _ = events.send(Event::Logprobs(e.clone()));
            self.entries = e;
        }
        let text = String::from_utf8_lossy(&tok.decode(prompt)).into_owned();
        let _ = events.send(Event::Text(text.clone()));
        self.echo = Some(text);
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
            scorer: self.pick_scorer(tok, thinking, events),
        }
    }

    /// The scorer of this job's picks (the slot scheduler calls it beside
    /// its own picker; the serial worker through [`Recorder`]).
    pub fn pick_scorer(
        &self,
        tok: Arc<Tokenizer>,
        thinking: bool,
        events: UnboundedSender<Event>,
    ) -> PickScorer {
        PickScorer {
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

/// Scores picked tokens from the logits they were picked from and sends
/// each entry to the stream before the token's text.
pub struct PickScorer {
    top: Option<usize>,
    /// Still before `</think>`.
    reasoning: bool,
    think_close: u32,
    tok: Arc<Tokenizer>,
    events: UnboundedSender<Event>,
    pub entries: Vec<TokenLogprob>,
}

impl PickScorer {
    /// Records the pick `id` made from `logits` (nothing when no
    /// log-probabilities were asked for).
    pub fn record(&mut self, logits: &[f32], id: u32) {
        let Some(k) = self.top else { return };
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
}

/// A picker that scores every token its inner picker picks, from the same
/// logits.
pub struct Recorder<'p> {
    inner: &'p mut dyn TokenPicker,
    pub scorer: PickScorer,
}

impl TokenPicker for Recorder<'_> {
    fn pick(&mut self, logits: &[f32], greedy: bool) -> u32 {
        let id = self.inner.pick(logits, greedy);
        // A dead-end pick is discarded by `generate`: nothing to record.
        if !self.inner.dead_end() {
            self.scorer.record(logits, id);
        }
        id
    }
    // A grammar under the recorder still decides how generation ends.
    fn dead_end(&self) -> bool {
        self.inner.dead_end()
    }
    fn unfinished(&mut self) -> bool {
        self.inner.unfinished()
    }
}
