//! The prompt text of a request for a DeepSeek V4.1 model, after the
//! official `encoding/encoding.py` (`encode_messages`; docs/V41.md § CLI
//! and server). The pieces come from `chat::v41`; this file decides which
//! goes where, message by message as the encoder does:
//!
//! * messages render in order; tool results (and a user message right
//!   after them, or after another user message) merge into one user turn,
//!   blocks joined by a blank line, results sorted by the order of the
//!   calls of the assistant turn before them;
//! * `<｜System｜>` opens index 0 when it holds the effort line or a system
//!   message; a later system message gets its own and, like a user turn,
//!   is followed by the assistant header when an assistant turn (or the
//!   end) comes next;
//! * the tools prompt follows the first system message (an empty one is
//!   put first when the request has none);
//! * thinking at level > 0: `<think>` after the last user turn's header,
//!   earlier turns' reasoning dropped — unless the request offers tools,
//!   when every turn keeps its reasoning and header `<think>`.
//!
//! Client text is escaped as for V4 (`esc_markers`, plus `<｜System｜>`);
//! assistant content, reasoning and calls are the model's own and written
//! as given.

use std::borrow::Cow;

use super::replay::ReplayLookup;
use super::request::{Api, GenRequest, Message, Role};
use crate::chat::template::{esc_markers, MARKER_BREAK, TOOL_RESULT_CLOSE, TOOL_RESULT_OPEN};
use crate::chat::v41::{
    self, assistant_prefix, ASSISTANT, EOS, SYSTEM, THINK_CLOSE, THINK_OPEN, USER,
};
use crate::chat::DEFAULT_SYSTEM;

/// Client text with chat markers broken, `<｜System｜>` included.
fn esc(s: &str) -> String {
    let e = esc_markers(s);
    if e.contains(SYSTEM) {
        let broken = format!("<{MARKER_BREAK}{}", &SYSTEM[1..]);
        e.replace(SYSTEM, &broken)
    } else {
        e.into_owned()
    }
}

/// A tool result block (`tool_output_template`), its text escaped.
fn result_block(raw: &str) -> String {
    format!(
        "{TOOL_RESULT_OPEN}{}{TOOL_RESULT_CLOSE}",
        esc(&crate::chat::template::esc_result(raw))
    )
}

/// One message after the encoder's merge step.
enum Item<'a> {
    System {
        text: Cow<'a, str>,
        tools: bool,
    },
    /// The blocks of one user turn, each with the tool-call id it answers
    /// (`None` for text).
    User(Vec<(Option<String>, String)>),
    Assistant(&'a Message),
}

/// The V4.1 level this request is rendered at (0 = no thinking).
pub fn level(req: &GenRequest) -> u8 {
    req.dialect
        .level(req.mode, req.think_level.effort, req.think_level.explicit)
}

/// The whole prompt text of a request for a V4.1 model.
pub fn render(req: &GenRequest, replay: &mut dyn ReplayLookup) -> String {
    let level = level(req);
    if req.api == Api::Completions {
        let prompt = esc(req.prompt.as_deref().unwrap_or(""));
        return v41::single_turn(level, DEFAULT_SYSTEM, &prompt);
    }
    let items = merge(&req.messages, req.tools_active());
    let mut out = String::from(v41::BOS);
    render_items(&items, req, level, replay, &mut out);
    out
}

/// The live-continuation tail: EOS closing the turn the session holds,
/// then the new messages (an assistant message always with its
/// reasoning when thinking), then the assistant header.
pub fn render_tail(msgs: &[Message], req: &GenRequest, replay: &mut dyn ReplayLookup) -> String {
    let level = level(req);
    let items = merge(msgs, false);
    let mut out = String::from(EOS);
    for it in &items {
        match it {
            Item::System { text, .. } => {
                out.push_str(SYSTEM);
                out.push_str(text);
            }
            Item::User(blocks) => user(blocks, &mut out),
            Item::Assistant(m) => {
                out.push_str(ASSISTANT);
                if level > 0 {
                    out.push_str(THINK_OPEN);
                    out.push_str(m.reasoning.as_deref().unwrap_or(""));
                }
                out.push_str(THINK_CLOSE);
                assistant_body(m, replay, &mut out);
            }
        }
    }
    out.push_str(&assistant_prefix(level));
    out
}

fn merge(msgs: &[Message], tools: bool) -> Vec<Item<'_>> {
    let mut items: Vec<Item<'_>> = Vec::new();
    if tools && msgs.first().is_none_or(|m| m.role != Role::System) {
        items.push(Item::System {
            text: Cow::Borrowed(""),
            tools: true,
        });
    }
    let mut order: Vec<String> = Vec::new();
    for m in msgs {
        let blocks: Vec<(Option<String>, String)> = match m.role {
            Role::System => {
                let first = items.is_empty();
                items.push(Item::System {
                    text: Cow::Owned(esc(&m.content)),
                    tools: tools && first,
                });
                continue;
            }
            Role::Assistant => {
                if !m.tool_calls.is_empty() {
                    order = m.tool_calls.iter().map(|c| c.id.clone()).collect();
                }
                items.push(Item::Assistant(m));
                continue;
            }
            Role::Tool => vec![(m.tool_result_ids.first().cloned(), result_block(&m.content))],
            Role::User => user_blocks(m),
        };
        match items.last_mut() {
            Some(Item::User(b)) => b.extend(blocks),
            _ => items.push(Item::User(blocks)),
        }
        if let Some(Item::User(b)) = items.last_mut() {
            sort_results(b, &order);
        }
    }
    items
}

/// A user message's blocks: its text pieces and Anthropic tool results in
/// their order (empty text pieces between results are left out).
fn user_blocks(m: &Message) -> Vec<(Option<String>, String)> {
    if m.tool_results.is_empty() {
        return vec![(None, esc(&m.content))];
    }
    let mut out = Vec::new();
    let mut at = 0;
    for (i, r) in m.tool_results.iter().enumerate() {
        let upto = r.at.clamp(at, m.content.len());
        let text = m.content.get(at..upto).unwrap_or("");
        if !text.is_empty() {
            out.push((None, esc(text)));
        }
        out.push((m.tool_result_ids.get(i).cloned(), result_block(&r.text)));
        at = upto;
    }
    let rest = m.content.get(at..).unwrap_or("");
    if !rest.is_empty() {
        out.push((None, esc(rest)));
    }
    out
}

/// Tool results in the order of the calls they answer (other blocks stay
/// where they are); unknown ids sort first, as the encoder's default 0.
fn sort_results(blocks: &mut [(Option<String>, String)], order: &[String]) {
    let rank = |id: &Option<String>| {
        id.as_ref()
            .and_then(|id| order.iter().position(|o| o == id))
            .unwrap_or(0)
    };
    let slots: Vec<usize> = (0..blocks.len())
        .filter(|&i| blocks[i].0.is_some() || blocks[i].1.starts_with(TOOL_RESULT_OPEN))
        .collect();
    if slots.len() < 2 || order.is_empty() {
        return;
    }
    let mut results: Vec<(Option<String>, String)> =
        slots.iter().map(|&i| blocks[i].clone()).collect();
    results.sort_by_key(|b| rank(&b.0));
    for (&i, b) in slots.iter().zip(results) {
        blocks[i] = b;
    }
}

fn user(blocks: &[(Option<String>, String)], out: &mut String) {
    out.push_str(USER);
    let texts: Vec<&str> = blocks.iter().map(|(_, t)| t.as_str()).collect();
    out.push_str(&texts.join("\n\n"));
}

fn assistant_body(m: &Message, replay: &mut dyn ReplayLookup, out: &mut String) {
    out.push_str(&m.content);
    if !m.tool_calls.is_empty() {
        let ids: Vec<&str> = m.tool_calls.iter().map(|c| c.id.as_str()).collect();
        let replayed = if ids.iter().all(|i| !i.is_empty()) {
            replay.block_for(&ids)
        } else {
            None
        };
        out.push_str(&replayed.unwrap_or_else(|| {
            let calls: Vec<(&str, &str)> = m
                .tool_calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect();
            v41::calls_block(&calls)
        }));
    }
    out.push_str(EOS);
}

fn render_items(
    items: &[Item<'_>],
    req: &GenRequest,
    level: u8,
    replay: &mut dyn ReplayLookup,
    out: &mut String,
) {
    let thinking = level > 0;
    let drop = !req.tools_active();
    let last_user = items.iter().enumerate().rposition(|(i, it)| match it {
        Item::User(_) => true,
        Item::System { .. } => i > 0,
        Item::Assistant(_) => false,
    });
    for (i, it) in items.iter().enumerate() {
        let system_here = matches!(it, Item::System { .. });
        if i == 0 && (thinking || system_here) {
            out.push_str(SYSTEM);
        }
        if i == 0 && thinking {
            out.push_str(&v41::effort_line(level));
        }
        let asks = match it {
            Item::System { text, tools } => {
                if i > 0 {
                    out.push_str(SYSTEM);
                }
                out.push_str(text);
                if *tools {
                    out.push_str("\n\n");
                    out.push_str(&v41::tools_prompt(&py_tool_lines(&req.tool_lines)));
                }
                i > 0
            }
            Item::User(blocks) => {
                user(blocks, out);
                true
            }
            Item::Assistant(m) => {
                if thinking && (!drop || last_user.is_none_or(|l| i > l)) {
                    out.push_str(m.reasoning.as_deref().unwrap_or(""));
                    out.push_str(THINK_CLOSE);
                }
                assistant_body(m, replay, out);
                false
            }
        };
        let next_is_assistant = match items.get(i + 1) {
            None => true,
            Some(n) => matches!(n, Item::Assistant(_)),
        };
        if asks && next_is_assistant {
            out.push_str(ASSISTANT);
            let open = thinking && (!drop || last_user.is_none_or(|l| i >= l));
            out.push_str(if open { THINK_OPEN } else { THINK_CLOSE });
        }
    }
}

/// The request's tool schemas as the encoder writes them (`to_json` of
/// each function object); a line that does not parse stays as given.
fn py_tool_lines(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) => v41::to_json(&v),
            Err(_) => l.clone(),
        })
        .collect()
}
