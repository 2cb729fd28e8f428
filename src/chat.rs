//! Chat rendering for the CLI (PROMPT.md §2, §10): the token sequence of a
//! one-shot prompt or of a REPL transcript, with the three thinking modes.

use crate::tokenizer::Tokenizer;

/// Think Max needs at least this context; below it `max` acts as `high`.
pub const THINK_MAX_MIN_CTX: usize = 393_216;

/// Inserted right after BOS in Think Max mode (476 bytes, ends in `\n\n`).
pub const THINK_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// The CLI's default system text (no trailing period, as ds4).
pub const DEFAULT_SYSTEM: &str = "You are a helpful assistant";

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
/// that starts with the BOS string is taken as already rendered.
pub fn one_shot_prompt(tok: &Tokenizer, system: &str, prompt: &str, mode: ThinkMode) -> Vec<u32> {
    let bos = tok.token_str(tok.specials().bos).unwrap_or_default();
    if !bos.is_empty() && prompt.starts_with(bos) {
        return tok.encode_chat(prompt);
    }
    let mut out = transcript_start(tok, system, mode);
    out.extend(user_turn(tok, prompt, mode));
    out
}

/// The same prompt as text (exact bytes; the tokens above decode to it).
pub fn render_one_shot(system: &str, prompt: &str, mode: ThinkMode) -> String {
    let mut s = String::from("<｜begin▁of▁sentence｜>");
    if mode == ThinkMode::Max {
        s.push_str(THINK_MAX_PREFIX);
    }
    s.push_str(system);
    s.push_str("<｜User｜>");
    s.push_str(prompt);
    s.push_str("<｜Assistant｜>");
    s.push_str(if mode.thinks() { "<think>" } else { "</think>" });
    s
}
