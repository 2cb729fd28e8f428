//! The mapping from a normalised request to its exact prompt text
//! (PROMPT.md §3, §4.2, §5.3): system block with the tools prompt first,
//! turns, tool results, assistant tool calls as exact replayed DSML or
//! canonical DSML. The template pieces and the escapes come from
//! `chat::template`; this file only decides which piece goes where.
//!
//! Client text (user and system content, tool results, tool schemas, the
//! completions prompt) goes through `esc_markers`, so a chat marker inside
//! it never becomes a control token. Assistant content, reasoning and tool
//! calls are the model's own output replayed and are written as given:
//! escaping them would change the tokens the live session and the disk
//! checkpoints hold for them (docs/SECURITY.md § Prompt content).

use serde_json::Value;

use super::request::{Api, GenRequest, Message, Role, ToolCall};
use crate::chat::template::{
    self, assistant_prefix, esc_markers, tools_prompt, ASSISTANT, THINK_CLOSE, THINK_OPEN, USER,
};
use crate::chat::{Dialect, ThinkMode, DEFAULT_SYSTEM};

use crate::chat::template::EOS;

const PARAM_CLOSE: &str = "</｜DSML｜parameter>";

fn attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Canonical DSML for a list of calls in the request's dialect.
pub fn canonical_dsml_for(req: &GenRequest, calls: &[ToolCall]) -> String {
    if req.dialect == Dialect::V4 {
        return canonical_dsml(calls);
    }
    let c: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    crate::chat::v41::calls_block(&c)
}

/// Canonical DSML for a list of calls (PROMPT.md §5.3 step 2).
pub fn canonical_dsml(calls: &[ToolCall]) -> String {
    let mut out = String::from("\n\n<｜DSML｜tool_calls>\n");
    for c in calls {
        out.push_str(&format!("<｜DSML｜invoke name=\"{}\">\n", attr(&c.name)));
        match serde_json::from_str::<Value>(&c.arguments) {
            Ok(Value::Object(map)) => {
                for (k, v) in &map {
                    let (is_str, body) = match v {
                        Value::String(s) => {
                            (true, s.replace(PARAM_CLOSE, "&lt;/｜DSML｜parameter>"))
                        }
                        other => (
                            false,
                            other
                                .to_string()
                                .replace(PARAM_CLOSE, "\\u003c/｜DSML｜parameter>"),
                        ),
                    };
                    out.push_str(&format!(
                        "<｜DSML｜parameter name=\"{}\" string=\"{is_str}\">{body}{PARAM_CLOSE}\n",
                        attr(k)
                    ));
                }
            }
            _ => out.push_str(&format!(
                "<｜DSML｜parameter name=\"arguments\" string=\"true\">{}{PARAM_CLOSE}\n",
                c.arguments.replace(PARAM_CLOSE, "&lt;/｜DSML｜parameter>")
            )),
        }
        out.push_str("</｜DSML｜invoke>\n");
    }
    out.push_str("</｜DSML｜tool_calls>");
    out
}

pub use super::replay::{NoReplay, ReplayLookup};

fn tool_calls_text(calls: &[ToolCall], replay: &mut dyn ReplayLookup) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    if ids.iter().all(|i| !i.is_empty()) {
        if let Some(b) = replay.block_for(&ids) {
            return b;
        }
    }
    canonical_dsml(calls)
}

/// The whole prompt text of a request (PROMPT.md §3.3 and §3.4).
pub fn render(req: &GenRequest, replay: &mut dyn ReplayLookup) -> String {
    if req.dialect != Dialect::V4 {
        return super::render_v41::render(req, replay);
    }
    let mode = req.mode;
    if req.api == Api::Completions {
        let prompt = esc_markers(req.prompt.as_deref().unwrap_or(""));
        return template::single_turn(
            mode == ThinkMode::Max,
            mode.thinks(),
            DEFAULT_SYSTEM,
            &prompt,
        );
    }
    render_messages(&req.messages, req, replay)
}

fn render_messages(msgs: &[Message], req: &GenRequest, replay: &mut dyn ReplayLookup) -> String {
    let think = req.mode.thinks();
    let tools_active = req.tools_active();
    let tool_context = tools_active
        || msgs.iter().any(|m| !m.tool_calls.is_empty())
        || (req.api != Api::Messages && msgs.iter().any(|m| m.role == Role::Tool));
    let mut system = String::new();
    if tools_active {
        system.push_str(&tools_prompt(&req.tool_lines));
    }
    for m in msgs.iter().filter(|m| m.role == Role::System) {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&esc_markers(&m.content));
    }
    let last_user = msgs
        .iter()
        .rposition(|m| matches!(m.role, Role::User | Role::Tool));
    let mut out = template::start(req.mode == ThinkMode::Max, &system);
    let (mut pending_assistant, mut pending_tool) = (false, false);
    for (i, m) in msgs.iter().enumerate() {
        match m.role {
            Role::System => {}
            Role::User | Role::Tool => {
                user_turn(m, &mut pending_tool, &mut out);
                pending_assistant = true;
            }
            Role::Assistant => {
                if pending_assistant {
                    out.push_str(ASSISTANT);
                    if think && (tool_context || last_user.is_none_or(|l| i > l)) {
                        out.push_str(THINK_OPEN);
                        out.push_str(m.reasoning.as_deref().unwrap_or(""));
                    }
                    out.push_str(THINK_CLOSE);
                }
                assistant_body(m, replay, &mut out);
                pending_assistant = false;
                pending_tool = false;
            }
        }
    }
    if pending_assistant {
        out.push_str(&assistant_prefix(think));
    }
    out
}

/// The live-continuation tail (PROMPT.md §3.5): EOS, the trailing new
/// messages by the §3.3 rules (an assistant message always with its
/// reasoning in thinking mode), then the assistant prefix.
pub fn render_tail(msgs: &[Message], req: &GenRequest, replay: &mut dyn ReplayLookup) -> String {
    if req.dialect != Dialect::V4 {
        return super::render_v41::render_tail(msgs, req, replay);
    }
    let think = req.mode.thinks();
    let mut out = String::from(EOS);
    let mut pending_tool = false;
    for m in msgs {
        match m.role {
            Role::System => {}
            Role::User | Role::Tool => user_turn(m, &mut pending_tool, &mut out),
            Role::Assistant => {
                out.push_str(ASSISTANT);
                if think {
                    out.push_str(THINK_OPEN);
                    out.push_str(m.reasoning.as_deref().unwrap_or(""));
                }
                out.push_str(THINK_CLOSE);
                assistant_body(m, replay, &mut out);
                pending_tool = false;
            }
        }
    }
    out.push_str(&assistant_prefix(think));
    out
}

/// A user or tool message (§3.3): a user turn, or a tool result, where a
/// run of tool results shares one user marker (`pending_tool`: the turn
/// before was a tool result).
fn user_turn(m: &Message, pending_tool: &mut bool, out: &mut String) {
    match m.role {
        Role::User => {
            out.push_str(USER);
            user_body(m, out);
            *pending_tool = false;
        }
        Role::Tool => {
            if !*pending_tool {
                out.push_str(USER);
            }
            out.push_str(&template::tool_result(&m.content));
            *pending_tool = true;
        }
        Role::System | Role::Assistant => {}
    }
}

/// An assistant message after its header and thinking part: its text, its
/// tool calls (the exact sampled block when the tool memory has it), EOS.
fn assistant_body(m: &Message, replay: &mut dyn ReplayLookup, out: &mut String) {
    out.push_str(&m.content);
    out.push_str(&tool_calls_text(&m.tool_calls, replay));
    out.push_str(EOS);
}

/// A user message's body: its text, with any Anthropic tool results
/// wrapped at the offsets where they stood among the text blocks.
fn user_body(m: &Message, out: &mut String) {
    let mut at = 0;
    for r in &m.tool_results {
        // `at` came from the parser's own `content.len()`; `get` keeps a
        // hand-built message with a bad offset from panicking.
        let upto = r.at.clamp(at, m.content.len());
        out.push_str(&esc_markers(m.content.get(at..upto).unwrap_or("")));
        out.push_str(&template::tool_result(&r.text));
        at = upto;
    }
    out.push_str(&esc_markers(m.content.get(at..).unwrap_or("")));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::{parse_chat, ParseContext};

    const PC: ParseContext = ParseContext {
        ctx: 100_000,
        allow_script: false,
    };

    #[test]
    fn prompt_md_example_1_and_2() {
        let r = parse_chat(r#"{"model":"deepseek-chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What is Redis?"},{"role":"assistant","content":"An in-memory data store."},{"role":"user","content":"Is it single-threaded?"}]}"#.as_bytes(), PC).unwrap();
        assert_eq!(render(&r, &mut NoReplay), "<｜begin▁of▁sentence｜>You are terse.<｜User｜>What is Redis?<｜Assistant｜></think>An in-memory data store.<｜end▁of▁sentence｜><｜User｜>Is it single-threaded?<｜Assistant｜></think>");
        let r = parse_chat(r#"{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"What is 2+2?"},{"role":"assistant","reasoning_content":"Simple arithmetic: 2+2=4.","content":"4"},{"role":"user","content":"And times 3?"}]}"#.as_bytes(), PC).unwrap();
        assert_eq!(render(&r, &mut NoReplay), "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>And times 3?<｜Assistant｜><think>");
    }

    #[test]
    fn prompt_md_example_3_tools() {
        let body = r#"{"model":"deepseek-v4-flash","messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"How many lines in a.c?"},{"role":"assistant","content":"","reasoning_content":"I should count the lines.","tool_calls":[{"id":"call_0123456789abcdef0123456789abcdef","type":"function","function":{"name":"bash","arguments":"{\"command\":\"wc -l a.c\",\"timeout\":10}"}}]},{"role":"tool","tool_call_id":"call_0123456789abcdef0123456789abcdef","content":"42 a.c"}],"tools":[{"type":"function","function":{"name":"bash","description":"Run a shell command.","parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}},"required":["command"]}}}]}"#;
        let r = parse_chat(body.as_bytes(), PC).unwrap();
        let text = render(&r, &mut NoReplay);
        assert!(text.starts_with("<｜begin▁of▁sentence｜>## Tools\n\nYou have access"));
        assert_eq!(template::TOOLS_HEADER.len(), 1183);
        assert_eq!(template::TOOLS_FOOTER.len(), 146);
        assert!(text.contains("### Available Tool Schemas\n\n{\"name\":\"bash\",\"description\":\"Run a shell command.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"}},\"required\":[\"command\"]}}\n\nYou MUST"));
        assert!(text.ends_with("...from the schemas.\n\nYou are a coding agent.<｜User｜>How many lines in a.c?<｜Assistant｜><think>I should count the lines.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">wc -l a.c</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>42 a.c</tool_result><｜Assistant｜><think>".trim_start_matches("...")));
    }
}
