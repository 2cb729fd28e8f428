//! Anthropic messages (`POST /v1/messages`) into a [`GenRequest`]: the
//! `system` field, text / thinking / `tool_use` / `tool_result` blocks;
//! the responses are `server/anthropic.rs`.

use serde_json::Value;

use super::thinking::thinking;
use super::tools::tool_lines;
use super::{
    bad, content_text, max_tokens, message_array, model, object, opt_bool, sampling, script,
    stop_list, Api, GenRequest, Message, ParseContext, Role, ToolCall, ToolResultBlock,
};
use crate::server::error::ApiError;
use crate::server::strict;

/// Anthropic `system`: string or parts, `x-anthropic-` parts dropped.
fn anthropic_system(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    let parts: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("text").and_then(Value::as_str).map(String::from),
                _ => None,
            })
            .collect(),
        Some(_) => return Err(bad()),
    };
    let mut out = String::new();
    for p in parts.iter().filter(|p| !p.starts_with("x-anthropic-")) {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(p);
    }
    Ok(Some(out))
}

/// `POST /v1/messages`.
pub fn parse_messages(body: &[u8], pc: ParseContext) -> Result<GenRequest, ApiError> {
    let m = object(body)?;
    let model = model(&m)?;
    let (mode, _, think_level) = thinking(&m, &model, Api::Messages, pc.ctx)?;
    let msgs = message_array(&m)?;
    let mut messages = Vec::new();
    if let Some(s) = anthropic_system(m.get("system"))? {
        messages.push(Message::new(Role::System, s));
    }
    for v in msgs {
        let Value::Object(o) = v else {
            return Err(bad());
        };
        let role = match o.get("role").and_then(Value::as_str).unwrap_or("user") {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => continue,
        };
        let mut msg = Message::new(role, String::new());
        match o.get("content") {
            Some(Value::String(s)) => msg.content = s.clone(),
            Some(Value::Array(blocks)) => {
                for b in blocks {
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            msg.content
                                .push_str(b.get("text").and_then(Value::as_str).unwrap_or(""));
                        }
                        Some("thinking") => {
                            let r = msg.reasoning.get_or_insert_with(String::new);
                            r.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""));
                        }
                        Some("tool_use") => msg.tool_calls.push(ToolCall {
                            id: b.get("id").and_then(Value::as_str).unwrap_or("").into(),
                            name: b.get("name").and_then(Value::as_str).unwrap_or("").into(),
                            arguments: b
                                .get("input")
                                .map(|i| i.to_string())
                                .unwrap_or_else(|| "{}".into()),
                        }),
                        Some("tool_result") => {
                            msg.tool_results.push(ToolResultBlock {
                                at: msg.content.len(),
                                text: content_text(b.get("content")),
                            });
                            if let Some(id) = b.get("tool_use_id").and_then(Value::as_str) {
                                msg.tool_result_ids.push(id.into());
                            }
                        }
                        _ => {}
                    }
                }
            }
            None | Some(Value::Null) => {}
            Some(_) => return Err(bad()),
        }
        messages.push(msg);
    }
    let tools_disabled = m
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
        == Some("none");
    let asked = sampling(&m, false, true)?;
    Ok(GenRequest {
        max_tokens: max_tokens(&m, &["max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        stop: stop_list(m.get("stop_sequences")),
        tool_lines: tool_lines(body)?,
        tools_disabled,
        script: script(&m, pc)?,
        messages,
        tool_grammar: strict::parse(&m)?,
        ..GenRequest::new(Api::Messages, model, mode, think_level, asked)
    })
}
