//! OpenAI chat completions and legacy completions: response bodies
//! (SERVER.md §6.1, §6.2) and SSE chunk sequences (§8.1, §8.2).

use serde_json::{json, Value};

use super::job::{Final, FinishReason, Usage};
use super::StreamFormat;

/// Per-response fields shared by every chunk.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Error => "error",
    }
}

pub fn usage_json(u: &Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached.min(u.prompt), "cache_write_tokens": u.cache_write()}})
}

fn calls_json(f: &Final) -> Value {
    Value::Array(
        f.calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// Non-streaming chat completion body.
pub fn chat_body(m: &Meta, f: &Final) -> String {
    let mut msg = json!({"role": "assistant", "content": f.content});
    if let Some(r) = &f.reasoning {
        msg["reasoning_content"] = json!(r);
    }
    if !f.calls.is_empty() {
        msg["tool_calls"] = calls_json(f);
    }
    let v = json!({"id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_str(f.finish)}],
        "usage": usage_json(&f.usage)});
    format!("{v}\n")
}

/// Non-streaming completions body.
pub fn completion_body(m: &Meta, f: &Final) -> String {
    let v = json!({"id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
        "choices": [{"text": f.text, "index": 0, "finish_reason": finish_str(f.finish)}],
        "usage": usage_json(&f.usage)});
    format!("{v}\n")
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// SSE chunks of `/v1/chat/completions`.
pub struct ChatStream {
    pub meta: Meta,
    pub include_usage: bool,
}

impl ChatStream {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        data(
            json!({"id": self.meta.id, "object": "chat.completion.chunk",
            "created": self.meta.created, "model": self.meta.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    }
}

impl StreamFormat for ChatStream {
    fn start(&mut self, _prompt: usize, _cached: usize) -> Vec<String> {
        vec![self.chunk(json!({"role": "assistant"}), None)]
    }
    fn reasoning(&mut self, r: &str) -> Vec<String> {
        vec![self.chunk(json!({"reasoning_content": r}), None)]
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        vec![self.chunk(json!({"content": t}), None)]
    }
    fn tool_start(&mut self, index: usize, id: &str, name: &str) -> Vec<String> {
        vec![self.chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            None,
        )]
    }
    fn tool_args(&mut self, index: usize, args: &str) -> Vec<String> {
        vec![self.chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]}),
            None,
        )]
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = Vec::new();
        // Calls not streamed live come whole, in one chunk.
        if f.calls.iter().any(|c| !c.streamed) {
            let calls: Vec<Value> = f
                .calls
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.streamed)
                .map(|(i, c)| {
                    json!({"index": i, "id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            out.push(self.chunk(json!({"tool_calls": calls}), None));
        }
        out.push(self.chunk(json!({}), Some(finish_str(f.finish))));
        if self.include_usage {
            out.push(data(
                json!({"id": self.meta.id, "object": "chat.completion.chunk",
                "created": self.meta.created, "model": self.meta.model,
                "choices": [], "usage": usage_json(&f.usage)}),
            ));
        }
        out.push("data: [DONE]\n\n".into());
        out
    }
    fn error(&mut self, msg: &str) -> Vec<String> {
        vec![openai_error_event(msg)]
    }
}

pub fn openai_error_event(msg: &str) -> String {
    format!(
        "event: error\ndata: {}\n\n",
        json!({"error": {"message": msg, "type": "server_error"}})
    )
}

/// SSE chunks of `/v1/completions`.
pub struct CompletionStream {
    pub meta: Meta,
    pub include_usage: bool,
}

impl CompletionStream {
    fn chunk(&self, text: &str, finish: Option<&str>) -> String {
        data(json!({"id": self.meta.id, "object": "text_completion",
            "created": self.meta.created, "model": self.meta.model,
            "choices": [{"text": text, "index": 0, "finish_reason": finish}]}))
    }
}

impl StreamFormat for CompletionStream {
    fn start(&mut self, _prompt: usize, _cached: usize) -> Vec<String> {
        Vec::new()
    }
    fn reasoning(&mut self, r: &str) -> Vec<String> {
        self.text(r)
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        vec![self.chunk(t, None)]
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = vec![self.chunk("", Some(finish_str(f.finish)))];
        if self.include_usage {
            out.push(data(
                json!({"id": self.meta.id, "object": "text_completion",
                "created": self.meta.created, "model": self.meta.model,
                "choices": [], "usage": usage_json(&f.usage)}),
            ));
        }
        out.push("data: [DONE]\n\n".into());
        out
    }
    fn error(&mut self, msg: &str) -> Vec<String> {
        vec![openai_error_event(msg)]
    }
}
