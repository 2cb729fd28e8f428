//! OpenAI Responses: the response object (SERVER.md §6.4) and the event
//! lifecycle `response.created` … `response.completed` (§8.4).

use serde_json::{json, Value};

use super::job::{Final, FinishReason, Usage};
use super::openai::Meta;
use super::StreamFormat;

fn usage_json(u: &Usage) -> Value {
    let mut v = json!({"input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached.min(u.prompt), "cache_write_tokens": u.cache_write()},
        "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion});
    u.add_speculative(&mut v);
    v
}

/// `resp_`/`rs_`/`msg_`/`fc_` + 24 hex chars.
pub fn item_id(prefix: &str) -> String {
    use std::io::Read;
    let mut b = [0u8; 12];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b.copy_from_slice(&t.to_le_bytes()[..12]);
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}{hex}")
}

fn status(f: &Final) -> (&'static str, &'static str) {
    match f.finish {
        FinishReason::Length => ("incomplete", "incomplete"),
        FinishReason::Error => ("failed", "incomplete"),
        _ => ("completed", "completed"),
    }
}

fn call_item(id: &str, status: &str, c: &super::job::OutCall, args: &str) -> Value {
    json!({"id": id, "type": "function_call", "status": status, "name": c.name,
        "call_id": c.id, "arguments": args})
}

/// Output items and ids: reasoning (opt-in), message, calls.
struct Items {
    reasoning_id: String,
    message_id: String,
    call_ids: Vec<String>,
}

fn response_object(m: &Meta, resp_id: &str, f: &Final, items: &[Value]) -> Value {
    let (s, _) = status(f);
    let mut v = json!({"id": resp_id, "object": "response", "created_at": m.created,
        "status": s, "model": m.model});
    match f.finish {
        FinishReason::Error => {
            v["error"] = json!({"code": "server_error", "message": "generation failed"})
        }
        FinishReason::Length => v["incomplete_details"] = json!({"reason": "max_tokens"}),
        _ => {}
    }
    v["output"] = Value::Array(items.to_vec());
    v["usage"] = usage_json(&f.usage);
    v
}

fn output_items(f: &Final, summary: bool, ids: &Items) -> Vec<Value> {
    let (_, is) = status(f);
    let mut items = Vec::new();
    if let (Some(r), true) = (&f.reasoning, summary) {
        items.push(
            json!({"id": ids.reasoning_id, "type": "reasoning", "status": is,
            "summary": [{"type": "summary_text", "text": r}]}),
        );
    }
    if !f.content.is_empty() {
        items.push(
            json!({"id": ids.message_id, "type": "message", "status": is, "role": "assistant",
            "content": [{"type": "output_text", "text": f.content, "annotations": []}]}),
        );
    }
    for (c, id) in f.calls.iter().zip(&ids.call_ids) {
        items.push(call_item(id, is, c, &c.arguments));
    }
    items
}

/// Non-streaming body (no trailing newline, as ds4).
pub fn body(m: &Meta, f: &Final, summary: bool) -> String {
    let ids = Items {
        reasoning_id: item_id("rs_"),
        message_id: item_id("msg_"),
        call_ids: f.calls.iter().map(|_| item_id("fc_")).collect(),
    };
    let items = output_items(f, summary, &ids);
    response_object(m, &m.id, f, &items).to_string()
}

pub struct ResponsesStream {
    meta: Meta,
    summary: bool,
    seq: u64,
    reasoning_open: bool,
    reasoning_text: String,
    message_open: bool,
    message_text: String,
    next_index: usize,
    reasoning_index: usize,
    message_index: usize,
    ids: Items,
}

impl ResponsesStream {
    pub fn new(meta: Meta, summary: bool) -> ResponsesStream {
        ResponsesStream {
            meta,
            summary,
            seq: 0,
            reasoning_open: false,
            reasoning_text: String::new(),
            message_open: false,
            message_text: String::new(),
            next_index: 0,
            reasoning_index: 0,
            message_index: 0,
            ids: Items {
                reasoning_id: item_id("rs_"),
                message_id: item_id("msg_"),
                call_ids: Vec::new(),
            },
        }
    }

    /// `sequence_number` is always the second key.
    fn ev(&mut self, ty: &str, rest: Value) -> String {
        let mut v = json!({"type": ty, "sequence_number": self.seq});
        self.seq += 1;
        if let (Value::Object(o), Value::Object(r)) = (&mut v, rest) {
            o.extend(r);
        }
        format!("data: {v}\n\n")
    }

    fn open_message(&mut self, out: &mut Vec<String>) {
        if self.message_open {
            return;
        }
        self.message_open = true;
        self.message_index = self.next_index;
        self.next_index += 1;
        let (id, i) = (self.ids.message_id.clone(), self.message_index);
        out.push(self.ev("response.output_item.added", json!({"output_index": i,
            "item": {"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}})));
        out.push(self.ev(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ));
    }
}

impl StreamFormat for ResponsesStream {
    fn start(&mut self, _prompt: usize, _cached: usize) -> Vec<String> {
        let v = json!({"response": {"id": self.meta.id, "object": "response",
            "created_at": self.meta.created, "status": "in_progress", "model": self.meta.model,
            "output": []}});
        vec![self.ev("response.created", v)]
    }
    fn reasoning(&mut self, r: &str) -> Vec<String> {
        if !self.summary {
            return Vec::new();
        }
        let mut out = Vec::new();
        let id = self.ids.reasoning_id.clone();
        if !self.reasoning_open {
            self.reasoning_open = true;
            self.reasoning_index = self.next_index;
            self.next_index += 1;
            let i = self.reasoning_index;
            out.push(self.ev(
                "response.output_item.added",
                json!({"output_index": i,
                "item": {"id": id, "type": "reasoning", "status": "in_progress", "summary": []}}),
            ));
            out.push(self.ev("response.reasoning_summary_part.added", json!({"item_id": id,
                "output_index": i, "summary_index": 0, "part": {"type": "summary_text", "text": ""}})));
        }
        self.reasoning_text.push_str(r);
        let i = self.reasoning_index;
        out.push(self.ev(
            "response.reasoning_summary_text.delta",
            json!({"item_id": id,
            "output_index": i, "summary_index": 0, "delta": r}),
        ));
        out
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.open_message(&mut out);
        self.message_text.push_str(t);
        let (id, i) = (self.ids.message_id.clone(), self.message_index);
        out.push(self.ev(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": i,
            "content_index": 0, "delta": t}),
        ));
        out
    }
    fn done(&mut self, f: &Final) -> Vec<String> {
        let mut out = Vec::new();
        let (_, is) = status(f);
        let mut items = Vec::new();
        if self.reasoning_open {
            let (id, i, text) = (
                self.ids.reasoning_id.clone(),
                self.reasoning_index,
                self.reasoning_text.clone(),
            );
            let rs = if f.saw_think_close {
                "completed"
            } else {
                "incomplete"
            };
            out.push(self.ev(
                "response.reasoning_summary_text.done",
                json!({"item_id": id,
                "output_index": i, "summary_index": 0, "text": text}),
            ));
            out.push(self.ev("response.reasoning_summary_part.done", json!({"item_id": id,
                "output_index": i, "summary_index": 0, "part": {"type": "summary_text", "text": text}})));
            let item = json!({"id": id, "type": "reasoning", "status": rs,
                "summary": [{"type": "summary_text", "text": text}]});
            out.push(self.ev(
                "response.output_item.done",
                json!({"output_index": i, "item": item.clone()}),
            ));
            items.push(item);
        }
        // A failed DSML parse returns the raw text: send what was not streamed.
        if f.content.len() > self.message_text.len() && f.content.starts_with(&self.message_text) {
            let tail = f.content[self.message_text.len()..].to_string();
            out.extend(self.text(&tail));
        }
        if self.message_open {
            let (id, i, text) = (
                self.ids.message_id.clone(),
                self.message_index,
                self.message_text.clone(),
            );
            out.push(self.ev(
                "response.output_text.done",
                json!({"item_id": id, "output_index": i,
                "content_index": 0, "text": text}),
            ));
            out.push(self.ev("response.content_part.done", json!({"item_id": id, "output_index": i,
                "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}})));
            let item = json!({"id": id, "type": "message", "status": is, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]});
            out.push(self.ev(
                "response.output_item.done",
                json!({"output_index": i, "item": item.clone()}),
            ));
            items.push(item);
        }
        for c in &f.calls {
            let id = item_id("fc_");
            let i = self.next_index;
            self.next_index += 1;
            out.push(self.ev(
                "response.output_item.added",
                json!({"output_index": i,
                "item": call_item(&id, "in_progress", c, "")}),
            ));
            out.push(self.ev(
                "response.function_call_arguments.delta",
                json!({"item_id": id,
                "output_index": i, "delta": c.arguments}),
            ));
            out.push(self.ev(
                "response.function_call_arguments.done",
                json!({"item_id": id,
                "output_index": i, "name": c.name, "arguments": c.arguments}),
            ));
            let item = call_item(&id, is, c, &c.arguments);
            out.push(self.ev(
                "response.output_item.done",
                json!({"output_index": i, "item": item.clone()}),
            ));
            items.push(item);
        }
        let terminal = match f.finish {
            FinishReason::Length => "response.incomplete",
            FinishReason::Error => "response.failed",
            _ => "response.completed",
        };
        let resp = response_object(&self.meta, &self.meta.id, f, &items);
        out.push(self.ev(terminal, json!({"response": resp})));
        out
    }
    fn error(&mut self, msg: &str) -> Vec<String> {
        vec![super::openai::openai_error_event(msg)]
    }
}
