//! Anthropic messages: the response body (SERVER.md §6.3) and the event
//! sequence `message_start` … `message_stop` (§8.3).

use serde_json::{json, Value};

use super::job::{Final, FinishReason, Usage};
use super::openai::Meta;
use super::StreamFormat;

pub fn stop_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Error => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
    }
}

fn usage_json(u: &Usage) -> Value {
    let cached = u.cached.min(u.prompt);
    let mut v = json!({"input_tokens": u.prompt - cached - u.cache_write(), "output_tokens": u.completion,
        "cache_read_input_tokens": cached, "cache_creation_input_tokens": u.cache_write()});
    u.add_speculative(&mut v);
    v
}

fn input_object(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

pub fn body(m: &Meta, f: &Final) -> String {
    let mut blocks = Vec::new();
    if let Some(r) = &f.reasoning {
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": m.id}));
    }
    if !f.content.is_empty() {
        blocks.push(json!({"type": "text", "text": f.content}));
    }
    for c in &f.calls {
        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name,
            "input": input_object(&c.arguments)}));
    }
    if blocks.is_empty() || (blocks.len() == 1 && f.reasoning.is_some()) {
        blocks.push(json!({"type": "text", "text": ""}));
    }
    let v = json!({"id": m.id, "type": "message", "role": "assistant", "model": m.model,
        "content": blocks, "stop_reason": stop_reason(f.finish), "stop_sequence": null,
        "usage": usage_json(&f.usage)});
    format!("{v}\n")
}

fn event(name: &str, v: Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Open {
    None,
    Thinking,
    Text,
}

pub struct MessagesStream {
    pub meta: Meta,
    index: usize,
    open: Open,
    thought: bool,
    wrote_text: bool,
    tool_open: bool,
}

impl MessagesStream {
    pub fn new(meta: Meta) -> MessagesStream {
        MessagesStream {
            meta,
            index: 0,
            open: Open::None,
            thought: false,
            wrote_text: false,
            tool_open: false,
        }
    }

    fn close(&mut self, out: &mut Vec<String>) {
        match self.open {
            Open::None => return,
            Open::Thinking => out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "signature_delta", "signature": self.meta.id}}),
            )),
            Open::Text => {}
        }
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.index}),
        ));
        self.index += 1;
        self.open = Open::None;
    }

    fn open_block(&mut self, out: &mut Vec<String>, kind: Open) {
        if self.open == kind {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        self.open = kind;
    }

    /// `delta` into the block of kind `kind`, opened first when another
    /// (or none) is open.
    fn delta(&mut self, kind: Open, delta: Value) -> Vec<String> {
        let mut out = Vec::new();
        self.open_block(&mut out, kind);
        out.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
        out
    }
}

impl StreamFormat for MessagesStream {
    fn start(&mut self, prompt: usize, cached: usize) -> Vec<String> {
        let u = Usage {
            prompt,
            cached,
            ..Usage::default()
        };
        vec![event(
            "message_start",
            json!({"type": "message_start", "message": {"id": self.meta.id, "type": "message",
                "role": "assistant", "model": self.meta.model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": usage_json(&u)}}),
        )]
    }
    fn reasoning(&mut self, r: &str) -> Vec<String> {
        self.thought = true;
        self.delta(
            Open::Thinking,
            json!({"type": "thinking_delta", "thinking": r}),
        )
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        self.wrote_text = true;
        self.delta(Open::Text, json!({"type": "text_delta", "text": t}))
    }
    fn tool_start(&mut self, _index: usize, id: &str, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        self.tool_open = true;
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        ));
        out
    }
    fn tool_args(&mut self, _index: usize, args: &str) -> Vec<String> {
        vec![event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index,
                "delta": {"type": "input_json_delta", "partial_json": args}}),
        )]
    }
    fn tool_end(&mut self, _index: usize) -> Vec<String> {
        self.tool_open = false;
        let out = vec![event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.index}),
        )];
        self.index += 1;
        out
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        if self.tool_open {
            // A call cut off mid-stream still gets its block closed.
            out.extend(self.tool_end(0));
        }
        for c in f.calls.iter().filter(|c| !c.streamed) {
            out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.index,
                    "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
            ));
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
            ));
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
        if !self.wrote_text && f.calls.is_empty() {
            self.open_block(&mut out, Open::Text);
            self.close(&mut out);
        }
        out.push(event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(f.finish), "stop_sequence": null},
                "usage": {"output_tokens": f.usage.completion}}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }
    fn error(&mut self, msg: &str) -> Vec<String> {
        vec![event(
            "error",
            json!({"type": "error", "error": {"type": "api_error", "message": msg}}),
        )]
    }
}
