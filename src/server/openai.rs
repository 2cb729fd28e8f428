//! OpenAI chat completions and legacy completions: response bodies
//! (SERVER.md §6.1, §6.2) and SSE chunk sequences (§8.1, §8.2), with the
//! `logprobs` objects in OpenAI's two shapes (docs/CLIENTS.md).

use serde_json::{json, Value};

use super::job::{Final, FinishReason, Usage};
use super::logprobs::{char_offsets, chars, token_text, Part, TokenLogprob};
use super::StreamFormat;

/// Per-response fields shared by every chunk.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Meta {
    /// One streamed event of `object` (`chat.completion.chunk`,
    /// `text_completion`) with these `choices`.
    fn event(&self, object: &str, choices: Value) -> String {
        data(
            json!({"id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices}),
        )
    }

    /// The end of a stream of `object` events: the usage event when the
    /// client asked for it (`stream_options.include_usage`), then `[DONE]`.
    fn end_events(&self, object: &str, usage: Option<&Usage>) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(u) = usage {
            out.push(data(json!({"id": self.id, "object": object,
                "created": self.created, "model": self.model, "choices": [],
                "usage": usage_json(u)})));
        }
        out.push("data: [DONE]\n\n".into());
        out
    }
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
    let mut v = json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached.min(u.prompt), "cache_write_tokens": u.cache_write()}});
    if u.drafted > 0 {
        // OpenAI's own fields for predicted tokens kept and discarded.
        v["completion_tokens_details"] = json!({"accepted_prediction_tokens": u.accepted,
            "rejected_prediction_tokens": u.drafted - u.accepted});
    }
    u.add_speculative(&mut v);
    v
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

/// The chat shape: `{"content": [ENTRY…], "refusal": null}`, each ENTRY
/// `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
/// "bytes"}…]}`; the reasoning's tokens, when there are any, in
/// `"reasoning_content"` beside `"content"`. `split`: tell reasoning from
/// content (false when the model never closed its thinking: the whole
/// text is then content).
pub fn chat_logprobs(entries: &[TokenLogprob], split: bool) -> Value {
    let one = |bytes: &[u8], lp: Option<f64>| json!({"token": String::from_utf8_lossy(bytes), "logprob": lp, "bytes": bytes});
    let entry = |e: &TokenLogprob| {
        let mut v = one(&e.bytes, e.logprob);
        v["top_logprobs"] = e
            .top
            .iter()
            .map(|a| one(&a.bytes, Some(a.logprob)))
            .collect();
        v
    };
    let reasoning: Vec<Value> = entries
        .iter()
        .filter(|e| split && e.part == Part::Reasoning)
        .map(entry)
        .collect();
    let content: Vec<Value> = entries
        .iter()
        .filter(|e| !(split && e.part == Part::Reasoning))
        .map(entry)
        .collect();
    let mut v = json!({"content": content, "refusal": null});
    if !reasoning.is_empty() {
        v["reasoning_content"] = Value::Array(reasoning);
    }
    v
}

/// The completions shape: parallel lists `tokens`, `token_logprobs`,
/// `top_logprobs` (an object token → logprob, most likely first; `null` for
/// the first prompt token) and `text_offset` (characters into the text,
/// counted from `start`).
pub fn completion_logprobs(entries: &[TokenLogprob], start: usize) -> Value {
    let tops: Vec<Value> = entries
        .iter()
        .map(|e| match e.logprob {
            None => Value::Null,
            Some(_) => {
                let mut m = serde_json::Map::new();
                for a in &e.top {
                    // Two tokens with one spelling: the likelier one stays.
                    m.entry(token_text(&a.bytes)).or_insert(json!(a.logprob));
                }
                Value::Object(m)
            }
        })
        .collect();
    json!({
        "tokens": entries.iter().map(|e| token_text(&e.bytes)).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": tops,
        "text_offset": char_offsets(entries, start),
    })
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
    let mut v = json!({"id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_str(f.finish)}],
        "usage": usage_json(&f.usage)});
    if let Some(lp) = &f.logprobs {
        v["choices"][0]["logprobs"] = chat_logprobs(lp, f.saw_think_close);
    }
    format!("{v}\n")
}

/// Non-streaming completions body.
pub fn completion_body(m: &Meta, f: &Final) -> String {
    let mut v = json!({"id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
        "choices": [{"text": f.text, "index": 0, "finish_reason": finish_str(f.finish)}],
        "usage": usage_json(&f.usage)});
    if let Some(lp) = &f.logprobs {
        v["choices"][0]["logprobs"] = completion_logprobs(lp, 0);
    }
    format!("{v}\n")
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// SSE chunks of `/v1/chat/completions`.
pub struct ChatStream {
    pub meta: Meta,
    pub include_usage: bool,
    /// Scored tokens not shown yet: they ride on the next text chunk.
    pending: Vec<TokenLogprob>,
}

impl ChatStream {
    pub fn new(meta: Meta, include_usage: bool) -> ChatStream {
        ChatStream {
            meta,
            include_usage,
            pending: Vec::new(),
        }
    }

    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> String {
        let mut choice = json!({"index": 0, "delta": delta, "finish_reason": finish});
        if !self.pending.is_empty() {
            choice["logprobs"] = chat_logprobs(&std::mem::take(&mut self.pending), true);
        }
        self.meta.event("chat.completion.chunk", json!([choice]))
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
    fn logprobs(&mut self, entries: Vec<TokenLogprob>) -> Vec<String> {
        self.pending.extend(entries);
        Vec::new()
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = Vec::new();
        if !self.pending.is_empty() {
            out.push(self.chunk(json!({}), None));
        }
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
        let usage = self.include_usage.then_some(&f.usage);
        out.extend(self.meta.end_events("chat.completion.chunk", usage));
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
    /// Scored tokens not shown yet: they ride on the next text chunk.
    pending: Vec<TokenLogprob>,
    /// Characters of text the shown entries cover (their `text_offset`s
    /// continue from here).
    shown_chars: usize,
}

impl CompletionStream {
    pub fn new(meta: Meta, include_usage: bool) -> CompletionStream {
        CompletionStream {
            meta,
            include_usage,
            pending: Vec::new(),
            shown_chars: 0,
        }
    }

    fn chunk(&mut self, text: &str, finish: Option<&str>) -> String {
        let mut choice = json!({"text": text, "index": 0, "finish_reason": finish});
        if !self.pending.is_empty() {
            let entries = std::mem::take(&mut self.pending);
            choice["logprobs"] = completion_logprobs(&entries, self.shown_chars);
            self.shown_chars += entries.iter().map(|e| chars(&e.bytes)).sum::<usize>();
        }
        self.meta.event("text_completion", json!([choice]))
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
    fn logprobs(&mut self, entries: Vec<TokenLogprob>) -> Vec<String> {
        self.pending.extend(entries);
        Vec::new()
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = vec![self.chunk("", Some(finish_str(f.finish)))];
        let usage = self.include_usage.then_some(&f.usage);
        out.extend(self.meta.end_events("text_completion", usage));
        out
    }
    fn error(&mut self, msg: &str) -> Vec<String> {
        vec![openai_error_event(msg)]
    }
}
