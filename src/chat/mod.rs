//! Chat for the CLI (PROMPT.md §2, §10): the thinking modes, and the token
//! sequence of a one-shot prompt or of a REPL transcript. The template text
//! itself lives in [`template`], shared with the server's renderer.
//!
//! The CLI tokenizes each piece on its own: markers come from their ids and
//! the user's and system text go through `encode_plain`, so a marker typed
//! in a prompt is ordinary text and needs no escaping here (the server,
//! which keys its caches on one rendered text, escapes instead).

pub mod template;
pub mod v41;

pub use template::{DEFAULT_SYSTEM, THINK_MAX_PREFIX};

use crate::tokenizer::Tokenizer;

/// The chat template a model speaks, from its architecture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// DeepSeek V4: [`template`].
    #[default]
    V4,
    /// DeepSeek V4.1: [`v41`]; `default_level` is written for requests
    /// that think without naming an effort (the server's `--think-level`;
    /// 0 = requests that say nothing about thinking do not think).
    V41 { default_level: u8 },
}

impl Dialect {
    /// The V4.1 level of a request: `mode` after the request's fields,
    /// `effort` the level it named (if any), `explicit` whether it said
    /// anything about thinking. Always 0 for V4.
    pub fn level(self, mode: ThinkMode, effort: Option<u8>, explicit: bool) -> u8 {
        let Dialect::V41 { default_level } = self else {
            return 0;
        };
        if !mode.thinks() {
            return 0;
        }
        match effort {
            Some(e) if e > 0 => e,
            _ if default_level == 0 && !explicit => 0,
            _ if default_level == 0 => v41::DEFAULT_LEVEL,
            _ if mode == ThinkMode::Max => v41::MAX_LEVEL,
            _ => default_level,
        }
    }
}

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

    /// The mode a `--think-level` names on a V4 model, which has no
    /// levels: 0 = none, 100 = max, anything else = high.
    pub fn of_level(level: u8) -> ThinkMode {
        match level {
            0 => ThinkMode::None,
            l if l >= v41::MAX_LEVEL => ThinkMode::Max,
            _ => ThinkMode::High,
        }
    }

    /// The V4.1 level of this mode, `high` being `level` (0 = none).
    pub fn v41_level(self, level: u8) -> u8 {
        match self {
            ThinkMode::None => 0,
            ThinkMode::High if (1..v41::MAX_LEVEL).contains(&level) => level,
            ThinkMode::High => v41::DEFAULT_LEVEL,
            ThinkMode::Max => v41::MAX_LEVEL,
        }
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
