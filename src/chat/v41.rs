//! The DeepSeek V4.1 chat template as text (docs/V41.md § CLI and server),
//! after the official `encoding/encoding.py` (`encode_messages`): the
//! `<｜System｜>` marker, the reasoning-effort line, the V4.1 tools prompt
//! and the DSML tags with their leading space. V4's template
//! ([`super::template`]) is unchanged; the model's architecture picks one.
//!
//! What differs from V4: thinking is a level 1–100 written once, right
//! after BOS, as `<｜System｜>Reasoning Effort: N (range 1-100, …)\n\n`
//! (level 0 = no thinking: no line, `</think>` after `<｜Assistant｜>`); a
//! system message at index 0 shares that `<｜System｜>` (one is written when
//! there is an effort line or a system message), a later system message
//! gets its own; tool results sit in one user turn joined by a blank line,
//! in the order of the calls; DSML tags are `<｜DSML｜ calls>`,
//! `<｜DSML｜ invoke …>`, `<｜DSML｜ parameter …>`.

use crate::tokenizer::Tokenizer;

pub use super::template::{ASSISTANT, BOS, EOS, THINK_CLOSE, THINK_OPEN, USER};

/// The V4.1 system marker (a control token in the V4.1 vocabulary).
pub const SYSTEM: &str = crate::tokenizer::markers::SYSTEM;

/// The default level: the official encoder's default effort, 75 (research
/// note §5 item 10; docs/V41.md says where the sources disagree).
pub const DEFAULT_LEVEL: u8 = 75;
/// `max`.
pub const MAX_LEVEL: u8 = 100;

/// DSML tags, V4.1 spelling (leading space after `｜DSML｜`).
pub const CALLS_OPEN: &str = "<｜DSML｜ calls>";
pub const CALLS_CLOSE: &str = "</｜DSML｜ calls>";
pub const INVOKE_OPEN: &str = "<｜DSML｜ invoke";
pub const INVOKE_CLOSE: &str = "</｜DSML｜ invoke>";
pub const PARAM_OPEN: &str = "<｜DSML｜ parameter";
pub const PARAM_CLOSE: &str = "</｜DSML｜ parameter>";

/// The tools prompt before the schema lines (official `TOOLS_TEMPLATE`).
pub const TOOLS_HEADER: &str = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
/// The tools prompt after the schema lines (ends in a newline).
pub const TOOLS_FOOTER: &str = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/// The effort line of level `level` (1–100).
pub fn effort_line(level: u8) -> String {
    format!(
        "Reasoning Effort: {level} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )
}

/// An effort name of the official API → level (`none` → 0). The official
/// encoder's names; see docs/V41.md for the two tables in circulation.
pub fn level_of_name(name: &str) -> Option<u8> {
    Some(match name {
        "none" => 0,
        "minimal" | "low" => 50,
        "medium" | "high" | "xhigh" => DEFAULT_LEVEL,
        "max" => MAX_LEVEL,
        _ => return None,
    })
}

/// BOS, then `<｜System｜>` with the effort line (level > 0) and the
/// system text when there is either: the start of every V4.1 prompt.
pub fn start(level: u8, system: &str) -> String {
    let mut s = String::from(BOS);
    if level > 0 || !system.is_empty() {
        s.push_str(SYSTEM);
    }
    if level > 0 {
        s.push_str(&effort_line(level));
    }
    s.push_str(system);
    s
}

/// `<｜Assistant｜>` then `<think>` (level > 0) or `</think>`.
pub fn assistant_prefix(level: u8) -> String {
    format!(
        "{ASSISTANT}{}",
        if level > 0 { THINK_OPEN } else { THINK_CLOSE }
    )
}

/// One system message, one user message (the CLI's one-shot prompt and
/// `/v1/completions`), `system` and `prompt` written as given.
pub fn single_turn(level: u8, system: &str, prompt: &str) -> String {
    let mut s = start(level, system);
    s.push_str(USER);
    s.push_str(prompt);
    s.push_str(&assistant_prefix(level));
    s
}

/// The tools prompt with its schema lines (one JSON object per line).
pub fn tools_prompt(lines: &[String]) -> String {
    format!(
        "{TOOLS_HEADER}{}{TOOLS_FOOTER}",
        super::template::esc_markers(&lines.join("\n"))
    )
}

/// A JSON value as the official encoder writes it (Python's
/// `json.dumps(v, ensure_ascii=False)`): `", "` between items, `": "`
/// after keys, keys in their given order, non-ASCII text as is.
pub fn to_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(to_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(o) => {
            let items: Vec<String> = o
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), to_json(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The DSML block of an assistant turn's calls, `(name, arguments JSON)`
/// each, as the official encoder writes it (with its leading blank line):
/// string values raw with `string="true"`, others as [`to_json`]. Arguments
/// that are not a JSON object go in as one `arguments` string parameter.
pub fn calls_block(calls: &[(&str, &str)]) -> String {
    use serde_json::Value;
    let invokes: Vec<String> = calls
        .iter()
        .map(|(name, args)| {
            let params: Vec<String> = match serde_json::from_str::<Value>(args) {
                Ok(Value::Object(map)) => map
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => param(k, true, s),
                        other => param(k, false, &to_json(other)),
                    })
                    .collect(),
                _ => vec![param("arguments", true, args)],
            };
            format!(
                "{INVOKE_OPEN} name=\"{name}\">\n{}\n{INVOKE_CLOSE}",
                params.join("\n")
            )
        })
        .collect();
    format!("\n\n{CALLS_OPEN}\n{}\n{CALLS_CLOSE}", invokes.join("\n"))
}

fn param(name: &str, string: bool, value: &str) -> String {
    format!("{PARAM_OPEN} name=\"{name}\" string=\"{string}\">{value}{PARAM_CLOSE}")
}

/// `<｜System｜>` as tokens: its own id when the vocabulary has it (the
/// V4.1 tokenizer), else its text.
fn system_ids(tok: &Tokenizer) -> Vec<u32> {
    match tok.token_id(SYSTEM) {
        Some(id) => vec![id],
        None => tok.encode_plain(SYSTEM),
    }
}

/// [`start`] as tokens, each piece tokenized on its own (markers by id).
pub fn transcript_start(tok: &Tokenizer, system: &str, level: u8) -> Vec<u32> {
    let mut out = vec![tok.specials().bos];
    if level > 0 || !system.is_empty() {
        out.extend(system_ids(tok));
    }
    if level > 0 {
        out.extend(tok.encode_plain(&effort_line(level)));
    }
    if !system.is_empty() {
        out.extend(tok.encode_plain(system));
    }
    out
}

/// The one-shot prompt of `ds4 -p` on a V4.1 model (a prompt starting with
/// BOS is taken as already rendered, as for V4).
pub fn one_shot_prompt(tok: &Tokenizer, system: &str, prompt: &str, level: u8) -> Vec<u32> {
    if prompt.starts_with(BOS) {
        return tok.encode_chat(prompt);
    }
    let mode = if level > 0 {
        super::ThinkMode::High
    } else {
        super::ThinkMode::None
    };
    let mut out = transcript_start(tok, system, level);
    out.extend(super::user_turn(tok, prompt, mode));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The official encoder's bytes for one system and one user message,
    /// as ds4's own V4.1 render test and the vendored encoders give them.
    #[test]
    fn single_turns_match_the_encoder() {
        assert_eq!(
            single_turn(0, "S", "U"),
            "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U<｜Assistant｜></think>"
        );
        assert_eq!(
            single_turn(75, "", "U"),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n<｜User｜>U<｜Assistant｜><think>"
        );
        assert_eq!(
            single_turn(0, "", "U"),
            "<｜begin▁of▁sentence｜><｜User｜>U<｜Assistant｜></think>"
        );
    }
}
