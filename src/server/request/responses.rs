//! OpenAI Responses (`POST /v1/responses`) into a [`GenRequest`]: the
//! `input` items (messages, reasoning, calls and their outputs) folded into
//! one transcript; the response object and events are `server/responses.rs`.

use serde_json::{Map, Value};

use super::format::text_format;
use super::thinking::thinking;
use super::tools::tool_lines;
use super::{
    arguments_text, bad, content_text, max_tokens, model, object, opt_bool, opt_str, sampling,
    script, Api, GenRequest, Message, ParseContext, Role, ToolCall,
};
use crate::server::error::ApiError;
use crate::server::strict;

/// Text blocks of a Responses message; other block types reject the request.
fn responses_content(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) => {
            let mut out = String::new();
            for b in a {
                match b.get("type").and_then(Value::as_str) {
                    Some(
                        "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text",
                    ) => out.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad()),
    }
}

/// `POST /v1/responses`.
pub fn parse_responses(body: &[u8], pc: ParseContext) -> Result<GenRequest, ApiError> {
    let m = object(body)?;
    let model = model(&m)?;
    let (mode, summary, think_level) = thinking(&m, &model, Api::Responses, pc.ctx)?;
    no_server_state(&m)?;
    let tools_disabled = tools_disabled(&m)?;
    let output = text_format(&m)?;
    let mut messages = Vec::new();
    if let Some(i) = opt_str(&m, "instructions")?.filter(|s| !s.is_empty()) {
        messages.push(Message::new(Role::System, i));
    }
    match m.get("input") {
        None => return Err(ApiError::invalid("missing input")),
        Some(Value::String(s)) => messages.push(Message::new(Role::User, s.clone())),
        Some(Value::Array(items)) => messages = Transcript::new(messages).read(items)?,
        Some(_) => return Err(bad()),
    }
    let asked = sampling(&m, false, false)?;
    Ok(GenRequest {
        max_tokens: max_tokens(&m, &["max_output_tokens", "max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        tool_lines: tool_lines(body)?,
        tools_disabled: tools_disabled || output.is_some(),
        script: script(&m, pc)?,
        messages,
        reasoning_summary: summary,
        output,
        tool_grammar: strict::parse(&m)?,
        ..GenRequest::new(Api::Responses, model, mode, think_level, asked)
    })
}

/// The server keeps no conversation: `previous_response_id` and
/// `conversation` are refused, the client replays the full input.
fn no_server_state(m: &Map<String, Value>) -> Result<(), ApiError> {
    for k in ["previous_response_id", "conversation"] {
        if m.get(k).is_some_and(|v| !v.is_null()) {
            let what = if k == "conversation" {
                "conversation is not supported; replay full input instead".to_string()
            } else {
                "previous_response_id is not supported; replay full input instead".to_string()
            };
            return Err(ApiError::invalid(&what));
        }
    }
    Ok(())
}

/// `tool_choice`: `none` turns the tools off, `auto` (or nothing) keeps
/// them; any other choice (a forced call) is refused.
fn tools_disabled(m: &Map<String, Value>) -> Result<bool, ApiError> {
    match m.get("tool_choice") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(s)) if s == "none" => Ok(true),
        Some(Value::String(s)) if s == "auto" => Ok(false),
        Some(Value::String(s)) => Err(ApiError::invalid(&format!("tool_choice={s} not supported"))),
        Some(_) => Err(ApiError::invalid("forced tool_choice not supported")),
    }
}

/// The messages an `input` array builds, item by item. Reasoning items
/// wait in `pending` for the assistant message (or call) they precede;
/// anything else closes them into an assistant message of their own.
struct Transcript {
    messages: Vec<Message>,
    pending: Option<String>,
}

impl Transcript {
    /// After `messages` (the instructions, if any).
    fn new(messages: Vec<Message>) -> Transcript {
        Transcript {
            messages,
            pending: None,
        }
    }

    /// Every item in order, then the reasoning still pending.
    fn read(mut self, items: &[Value]) -> Result<Vec<Message>, ApiError> {
        for it in items {
            let Value::Object(o) = it else {
                return Err(bad());
            };
            self.item(o)?;
        }
        self.close_reasoning();
        Ok(self.messages)
    }

    /// One input item; an unknown type, or one not `completed`, rejects
    /// the request.
    fn item(&mut self, o: &Map<String, Value>) -> Result<(), ApiError> {
        if o.get("status")
            .is_some_and(|s| !s.is_null() && s.as_str() != Some("completed"))
        {
            return Err(bad());
        }
        let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
        match ty {
            "message" => self.message(o)?,
            "reasoning" => self.reasoning(o),
            "function_call"
            | "custom_tool_call"
            | "local_shell_call"
            | "web_search_call"
            | "tool_search_call"
            | "image_generation_call" => self.call(ty, o),
            t if t.ends_with("_output") => self.output(o),
            "compaction" | "context_compaction" => {}
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// Pending reasoning becomes an assistant message of its own.
    fn close_reasoning(&mut self) {
        if let Some(r) = self.pending.take() {
            let mut a = Message::new(Role::Assistant, String::new());
            a.reasoning = Some(r);
            self.messages.push(a);
        }
    }

    /// A message item; an assistant message takes the pending reasoning.
    /// Unknown roles are skipped.
    fn message(&mut self, o: &Map<String, Value>) -> Result<(), ApiError> {
        let role = match o.get("role").and_then(Value::as_str).unwrap_or("user") {
            "system" | "developer" => Role::System,
            "assistant" => Role::Assistant,
            "user" => Role::User,
            _ => return Ok(()),
        };
        let content = responses_content(o.get("content"))?;
        if role != Role::Assistant {
            self.close_reasoning();
        }
        let mut msg = Message::new(role, content);
        if role == Role::Assistant {
            msg.reasoning = self.pending.take();
        }
        self.messages.push(msg);
        Ok(())
    }

    /// A reasoning item: its summary and content, added to the pending
    /// reasoning.
    fn reasoning(&mut self, o: &Map<String, Value>) {
        let mut parts = Vec::new();
        for k in ["summary", "content"] {
            let t = responses_content(o.get(k)).unwrap_or_default();
            if !t.is_empty() {
                parts.push(t);
            }
        }
        let t = parts.join("\n");
        match &mut self.pending {
            Some(p) => p.push_str(&t),
            None => self.pending = Some(t),
        }
    }

    /// A call item (`ty`): joins the last assistant message, unless
    /// reasoning is pending, which opens a new one.
    fn call(&mut self, ty: &str, o: &Map<String, Value>) {
        let name = match ty {
            "local_shell_call" => "local_shell".to_string(),
            "tool_search_call" => "tool_search".to_string(),
            "web_search_call" | "image_generation_call" => ty.to_string(),
            _ => format!(
                "{}{}",
                o.get("namespace").and_then(Value::as_str).unwrap_or(""),
                o.get("name").and_then(Value::as_str).unwrap_or("")
            ),
        };
        let args = ["action", "arguments", "input"]
            .iter()
            .find_map(|k| arguments_text(o.get(*k)))
            .unwrap_or_else(|| "{}".into());
        let call = ToolCall {
            id: call_id(o),
            name,
            arguments: args,
        };
        match self.messages.last_mut() {
            Some(last) if last.role == Role::Assistant && self.pending.is_none() => {
                last.tool_calls.push(call)
            }
            _ => {
                let mut a = Message::new(Role::Assistant, String::new());
                a.reasoning = self.pending.take();
                a.tool_calls.push(call);
                self.messages.push(a);
            }
        }
    }

    /// A `*_output` item: the result of a call, as a tool message.
    fn output(&mut self, o: &Map<String, Value>) {
        self.close_reasoning();
        let content = match o.get("output").or_else(|| o.get("result")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.iter().all(|b| b.get("text").is_some()) => {
                content_text(Some(&Value::Array(a.clone())))
            }
            Some(v) => v.to_string(),
            None => o.get("tools").map(|v| v.to_string()).unwrap_or_default(),
        };
        let mut msg = Message::new(Role::Tool, content);
        msg.tool_result_ids.push(call_id(o));
        self.messages.push(msg);
    }
}

/// The call id of a call or output item (`call_id`, else `id`).
fn call_id(o: &Map<String, Value>) -> String {
    o.get("call_id")
        .or_else(|| o.get("id"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}
