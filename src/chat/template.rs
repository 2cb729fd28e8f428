//! The DeepSeek V4 chat template as text (PROMPT.md §1–§4): the markers, the
//! Think Max prefix, the tools prompt, the single-turn layout, and the two
//! escapes applied to text a client controls. The CLI (`chat`) and the
//! server (`server::render`) both build their prompts from these pieces, so
//! the protocol is spelled in one place.
//!
//! Escaping, and why it is done in the text (docs/SECURITY.md § Prompt content):
//!
//! * [`esc_result`]: `</tool_result>` inside a tool result (PROMPT.md §3.3).
//! * [`esc_markers`]: a chat marker inside client text (user, system, tool
//!   results, tool schemas, the completions prompt) would otherwise be cut
//!   out as its control token by `Tokenizer::encode_chat`: a tool result
//!   could close the turn and open a fake user or assistant turn. ds4 and
//!   PROMPT.md §1.1 leave this open; we break each such occurrence with an
//!   invisible U+2060 WORD JOINER after its first character. The server keys
//!   every cache (live reuse by decoded text, disk checkpoints by rendered
//!   bytes) on the rendered text, so the text alone must fix the tokens:
//!   `encode_chat(text)` stays a function of the text, and the tokens decode
//!   back to the text byte for byte. Splitting the prompt into "special" and
//!   "plain" segments instead would keep the bytes but give one text two
//!   tokenizations, which those caches cannot tell apart.

use std::borrow::Cow;

pub use crate::tokenizer::markers::{ASSISTANT, BOS, DSML, EOS, THINK_CLOSE, THINK_OPEN, USER};
use crate::tokenizer::CHAT_MARKERS;

/// Inserted right after BOS in Think Max mode (476 bytes, ends in `\n\n`).
pub const THINK_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// The CLI's default system text, also the fixed system text of
/// `/v1/completions` (no trailing period, as ds4).
pub const DEFAULT_SYSTEM: &str = "You are a helpful assistant";

/// Wraps one tool result (PROMPT.md §3.3).
pub const TOOL_RESULT_OPEN: &str = "<tool_result>";
pub const TOOL_RESULT_CLOSE: &str = "</tool_result>";

pub(crate) const TOOLS_HEADER: &str = "## Tools\n\nYou have access to a set of tools to help answer the user question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as raw text and set `string=\"true\"`. Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
pub(crate) const TOOLS_FOOTER: &str = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the exact parameter names from the schemas.";

/// What [`esc_markers`] inserts after the first character of a marker:
/// U+2060 WORD JOINER, invisible and without a line-break opportunity, so
/// the text reads the same while no longer spelling the marker.
pub const MARKER_BREAK: char = '\u{2060}';

/// `TOOLS_PROMPT(schemas)` (PROMPT.md §4.2). The schema lines are client
/// text (tool descriptions often come from third parties), so their
/// markers are broken like any other client text.
pub fn tools_prompt(lines: &[String]) -> String {
    format!(
        "{TOOLS_HEADER}{}{TOOLS_FOOTER}",
        esc_markers(&lines.join("\n"))
    )
}

/// Tool result text: only `</tool_result>` is escaped (its first `<`).
pub fn esc_result(s: &str) -> String {
    s.replace(TOOL_RESULT_CLOSE, "&lt;/tool_result>")
}

/// The markers broken in client text: the seven chat markers and V4.1's
/// `<｜System｜>`, which the tokenizer takes as a marker wherever the
/// vocabulary has it.
const ESCAPED_MARKERS: [&str; 8] = [
    CHAT_MARKERS[0],
    CHAT_MARKERS[1],
    CHAT_MARKERS[2],
    CHAT_MARKERS[3],
    CHAT_MARKERS[4],
    CHAT_MARKERS[5],
    CHAT_MARKERS[6],
    crate::tokenizer::markers::SYSTEM,
];

/// Client text with every chat marker broken by [`MARKER_BREAK`], so that
/// `Tokenizer::encode_chat` tokenizes it as ordinary text. Text without a
/// marker (every ordinary conversation) is returned unchanged, byte for
/// byte.
pub fn esc_markers(s: &str) -> Cow<'_, str> {
    if !ESCAPED_MARKERS.iter().any(|m| s.contains(m)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        out.push(c);
        rest = &rest[c.len_utf8()..];
        // Every marker starts with `<` or `｜`; breaking right after that
        // character leaves no marker, and scanning on from the next
        // character also breaks a marker that starts inside this one
        // (`<｜DSML｜` breaks at the bar).
        let at_marker = ESCAPED_MARKERS
            .iter()
            .any(|m| m.starts_with(c) && rest.starts_with(&m[c.len_utf8()..]));
        if at_marker {
            out.push(MARKER_BREAK);
        }
    }
    Cow::Owned(out)
}

/// One wrapped tool result from its raw text: both escapes applied.
pub fn tool_result(raw: &str) -> String {
    let mut s = String::from(TOOL_RESULT_OPEN);
    s.push_str(&esc_markers(&esc_result(raw)));
    s.push_str(TOOL_RESULT_CLOSE);
    s
}

/// The marker that ends the assistant prefix: `<think>` when thinking.
pub fn think_marker(think: bool) -> &'static str {
    if think {
        THINK_OPEN
    } else {
        THINK_CLOSE
    }
}

/// BOS, the Think Max prefix if `max`, the system text (as given).
pub fn start(max: bool, system: &str) -> String {
    let mut s = String::from(BOS);
    if max {
        s.push_str(THINK_MAX_PREFIX);
    }
    s.push_str(system);
    s
}

/// `<｜Assistant｜>` then `<think>` or `</think>`.
pub fn assistant_prefix(think: bool) -> String {
    format!("{ASSISTANT}{}", think_marker(think))
}

/// The single-turn layout of the CLI's one-shot prompt and of
/// `/v1/completions` (PROMPT.md §3.4): `system` and `prompt` are written as
/// given, so the caller decides whether they are escaped.
pub fn single_turn(max: bool, think: bool, system: &str, prompt: &str) -> String {
    let mut s = start(max, system);
    s.push_str(USER);
    s.push_str(prompt);
    s.push_str(&assistant_prefix(think));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_broken_and_plain_text_is_untouched() {
        assert!(matches!(esc_markers("plain < | ｜ text"), Cow::Borrowed(_)));
        for m in ESCAPED_MARKERS {
            let e = esc_markers(m);
            assert!(ESCAPED_MARKERS.iter().all(|x| !e.contains(x)), "{m}");
            assert_eq!(e.replace(MARKER_BREAK, ""), m);
        }
        let nasty = "<｜DSML｜DSML｜<think></think><｜<｜User｜>>";
        let e = esc_markers(nasty);
        assert!(CHAT_MARKERS.iter().all(|x| !e.contains(x)), "{e}");
        assert_eq!(e.replace(MARKER_BREAK, ""), nasty);
    }
}
