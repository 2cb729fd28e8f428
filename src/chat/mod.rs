//! Chat for the CLI (PROMPT.md §2, §10): the thinking modes, and the token
//! sequence of a one-shot prompt or of a REPL transcript. The template text
//! itself lives in [`template`], shared with the server's renderer.
//!
//! The CLI tokenizes each piece on its own: markers come from their ids and
//! the user's and system text go through `encode_plain`, so a marker typed
//! in a prompt is ordinary text and needs no escaping here (the server,
//! which keys its caches on one rendered text, escapes instead).

pub mod template;

pub use template::{DEFAULT_SYSTEM, THINK_MAX_PREFIX};

use crate::tokenizer::Tokenizer;

/// Think Max needs at least this context; below it `max` acts as `high`.
pub const THINK_MAX_MIN_CTX: usize = 393_216;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkMode {
    None,
    High,
    Max,
}

impl ThinkMode {
    /// Think Max downgrades to high when the context is below 384 Ki tokens.
    pub fn effective(self, ctx: usize) -> ThinkMode {
        if self == ThinkMode::Max && ctx < THINK_MAX_MIN_CTX {
            ThinkMode::High
        } else {
            self
        }
    }

    pub fn thinks(self) -> bool {
        self != ThinkMode::None
    }
}

/// BOS, [Think Max prefix], [system text]: the start of every transcript.
pub fn transcript_start(tok: &Tokenizer, system: &str, mode: ThinkMode) -> Vec<u32> {
    let sp = tok.specials();
    let mut out = vec![sp.bos];
    if mode == ThinkMode::Max {
        out.extend(tok.encode_plain(THINK_MAX_PREFIX));
    }
    if !system.is_empty() {
        out.extend(tok.encode_plain(system));
    }
    out
}

/// One user turn: `<｜User｜>` text `<｜Assistant｜>` then `<think>` or `</think>`.
pub fn user_turn(tok: &Tokenizer, text: &str, mode: ThinkMode) -> Vec<u32> {
    let sp = tok.specials();
    let mut out = vec![sp.user];
    out.extend(tok.encode_plain(text));
    out.push(sp.assistant);
    out.push(if mode.thinks() {
        sp.think_open
    } else {
        sp.think_close
    });
    out
}

/// The one-shot prompt of `ds4 -p`: each piece tokenized on its own. A prompt
/// that starts with the BOS string is taken as already rendered: its
/// markers are meant (the operator's own input, not client text).
pub fn one_shot_prompt(tok: &Tokenizer, system: &str, prompt: &str, mode: ThinkMode) -> Vec<u32> {
    if prompt.starts_with(template::BOS) {
        return tok.encode_chat(prompt);
    }
    let mut out = transcript_start(tok, system, mode);
    out.extend(user_turn(tok, prompt, mode));
    out
}

/// The same prompt as text (exact bytes; the tokens above decode to it).
pub fn render_one_shot(system: &str, prompt: &str, mode: ThinkMode) -> String {
    template::single_turn(mode == ThinkMode::Max, mode.thinks(), system, prompt)
}
