//! OpenAI chat completions (`POST /v1/chat/completions`) and legacy
//! completions (`POST /v1/completions`) into a [`GenRequest`]; their
//! responses are `server/openai.rs`.

use serde_json::Value;

use super::format::response_format;
use super::scoring::{chat_scoring, completion_scoring};
use super::thinking::thinking;
use super::tools::tool_lines;
use super::{
    arguments_text, bad, content_text, include_usage, max_tokens, message_array, model, object,
    opt_bool, sampling, script, seed, stop_list, Api, GenRequest, Message, ParseContext, Role,
    ToolCall,
};
use crate::chat::ThinkMode;
use crate::server::error::ApiError;
use crate::server::strict;

/// `POST /v1/chat/completions`.
pub fn parse_chat(body: &[u8], pc: ParseContext) -> Result<GenRequest, ApiError> {
    let m = object(body)?;
    let model = model(&m)?;
    let (mode, _, think_level) = thinking(&m, &model, Api::Chat, pc.ctx)?;
    let msgs = message_array(&m)?;
    let mut messages = Vec::new();
    for v in msgs {
        let Value::Object(o) = v else {
            return Err(bad());
        };
        let role = match o.get("role").and_then(Value::as_str).unwrap_or("user") {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "tool" | "function" => Role::Tool,
            "assistant" => Role::Assistant,
            _ => continue,
        };
        let mut msg = Message::new(role, content_text(o.get("content")));
        if o.contains_key("reasoning_content") {
            msg.reasoning = Some(content_text(o.get("reasoning_content")));
        }
        for c in o
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let args = arguments_text(f.and_then(|f| f.get("arguments")));
            if let (Some(name), Some(arguments)) = (name, args) {
                msg.tool_calls.push(ToolCall {
                    id: c.get("id").and_then(Value::as_str).unwrap_or("").into(),
                    name: name.into(),
                    arguments,
                });
            }
        }
        if let Some(id) = o.get("tool_call_id").and_then(Value::as_str) {
            msg.tool_result_ids.push(id.into());
        }
        messages.push(msg);
    }
    // With a response format the answer is constrained from its first
    // token, so no tool call could be written: tools are not offered.
    let output = response_format(&m)?;
    let tools_disabled =
        matches!(m.get("tool_choice"), Some(Value::String(s)) if s == "none") || output.is_some();
    let asked = sampling(&m, true, true)?;
    Ok(GenRequest {
        seed: seed(&m)?,
        max_tokens: max_tokens(&m, &["max_tokens", "max_completion_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: include_usage(&m)?,
        stop: stop_list(m.get("stop")),
        tool_lines: tool_lines(body)?,
        tools_disabled,
        script: script(&m, pc)?,
        messages,
        output,
        tool_grammar: strict::parse(&m)?,
        scoring: chat_scoring(&m)?,
        ..GenRequest::new(Api::Chat, model, mode, think_level, asked)
    })
}

/// `POST /v1/completions`.
pub fn parse_completions(body: &[u8], pc: ParseContext) -> Result<GenRequest, ApiError> {
    let m = object(body)?;
    let model = model(&m)?;
    let (mode, _, think_level) = thinking(&m, &model, Api::Completions, pc.ctx)?;
    let scoring = completion_scoring(&m)?;
    // A raw prompt has no template, so no thinking mode (which would also
    // override the sampling fields).
    let mode = if scoring.raw_prompt() {
        ThinkMode::None
    } else {
        mode
    };
    let prompt = match m.get("prompt") {
        None => return Err(ApiError::invalid("missing prompt")),
        Some(Value::String(s)) => s.clone(),
        // A batch of texts is refused rather than cut to its first (as a
        // batch of token lists is: `scoring::prompt_ids`).
        Some(Value::Array(a)) if a.len() > 1 && a[0].is_string() => {
            return Err(ApiError::invalid(
                "one prompt per request: send each prompt of a batch in its own request",
            ))
        }
        Some(Value::Array(a)) => a.first().and_then(Value::as_str).unwrap_or("").into(),
        Some(_) => return Err(bad()),
    };
    let asked = sampling(&m, true, true)?;
    Ok(GenRequest {
        seed: seed(&m)?,
        max_tokens: max_tokens(&m, &["max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: include_usage(&m)?,
        stop: stop_list(m.get("stop")),
        tools_disabled: true,
        script: script(&m, pc)?,
        prompt: Some(prompt),
        output: response_format(&m)?,
        scoring,
        ..GenRequest::new(Api::Completions, model, mode, think_level, asked)
    })
}
