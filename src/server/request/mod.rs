//! The four wire formats (OpenAI chat, completions, Responses, Anthropic
//! messages) translated into one internal request (SERVER.md §4, §5;
//! PROMPT.md §3.6). Every field a client controls is type-checked here; a
//! wrong type is `400 invalid JSON request`, unknown fields are ignored.
//!
//! Here: the internal request ([`GenRequest`]) and the field parsers the
//! APIs share (sampling, `max_tokens`, `stop`, …). One file per API:
//! `openai` (chat completions and completions), `anthropic` (messages),
//! `responses`; beside them `thinking` (the thinking mode and level),
//! `tools` (the tool schema lines), `format` (structured output) and
//! `scoring` (log-probabilities and echo).

use serde_json::{Map, Value};

use super::error::ApiError;
use super::strict::ToolGrammar;
use crate::chat::{Dialect, ThinkMode};
use crate::constrain::OutputGrammar;
use crate::sampler::SamplerConfig;

mod anthropic;
mod format;
mod openai;
mod responses;
mod scoring;
mod thinking;
mod tools;

pub use anthropic::parse_messages;
pub use openai::{parse_chat, parse_completions};
pub use responses::parse_responses;
pub use scoring::{Scoring, MAX_TOP_LOGPROBS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    Responses,
    Messages,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Tool,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (a decoded string or raw JSON).
    pub arguments: String,
}

/// An Anthropic `tool_result` block inside a user message, kept raw: the
/// renderer wraps and escapes it (`chat::template::tool_result`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolResultBlock {
    /// Byte offset in the message's `content` where the block stands (the
    /// text blocks before it end there), so block order is kept.
    pub at: usize,
    pub text: String,
}

#[derive(Clone, Debug)]
pub struct Message {
    pub role: Role,
    /// The message's text (Anthropic: its text blocks, concatenated).
    pub content: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// Ids of the tool results this message carries.
    pub tool_result_ids: Vec<String>,
    /// Anthropic `tool_result` blocks, in order (empty for other APIs).
    pub tool_results: Vec<ToolResultBlock>,
}

impl Message {
    fn new(role: Role, content: String) -> Message {
        Message {
            role,
            content,
            reasoning: None,
            tool_calls: Vec::new(),
            tool_result_ids: Vec::new(),
            tool_results: Vec::new(),
        }
    }
}

/// One generation request, whatever API it came through.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub api: Api,
    pub model: String,
    pub messages: Vec<Message>,
    /// `/v1/completions` prompt text.
    pub prompt: Option<String>,
    /// Tool schema lines for the prompt (PROMPT.md §4.1).
    pub tool_lines: Vec<String>,
    pub tools_disabled: bool,
    /// Thinking mode after the Think Max context rule.
    pub mode: ThinkMode,
    /// The sampler the turn runs with: `sampler_asked`, or the thinking
    /// defaults in its place when the turn thinks.
    pub sampler: SamplerConfig,
    /// The sampling fields as the request gave them (over the defaults).
    pub sampler_asked: SamplerConfig,
    pub seed: Option<u64>,
    pub max_tokens: Option<i64>,
    pub stream: bool,
    pub include_usage: bool,
    pub stop: Vec<String>,
    /// Responses `reasoning.summary` opted in.
    pub reasoning_summary: bool,
    /// Structured output: the grammar the answer must match (OpenAI
    /// `response_format`, Responses `text.format`), checked at parse time.
    pub output: Option<OutputGrammar>,
    /// Strict tool schemas or a forced call: the grammar of the DSML block.
    pub tool_grammar: Option<ToolGrammar>,
    /// Test-only scripted output (accepted only with the hidden server flag).
    pub script: Option<String>,
    /// The request body as received (for `--trace`).
    pub raw: Vec<u8>,
    /// Log-probabilities and echo (chat and completions only).
    pub scoring: Scoring,
    /// The thinking level the request named, for a V4.1 model.
    pub think_level: ThinkLevel,
    /// The chat template of the loaded model (set by the HTTP layer from
    /// the server's options; V4 until then).
    pub dialect: Dialect,
}

/// What a request said about thinking effort, as a V4.1 level: an effort
/// name (`chat::v41::level_of_name`) or a number 0–100 (0 = none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThinkLevel {
    pub effort: Option<u8>,
    /// Any thinking field was given (`thinking`, `think`, an effort).
    pub explicit: bool,
}

impl GenRequest {
    /// A request of `api` for `model`, thinking in `mode`, with every
    /// API-specific field empty for its parser to fill in. The sampler its
    /// turn runs with follows from what it `asked` and the mode
    /// ([`SamplerConfig::for_thinking`]: a thinking turn samples with the
    /// thinking defaults).
    fn new(
        api: Api,
        model: String,
        mode: ThinkMode,
        think_level: ThinkLevel,
        asked: SamplerConfig,
    ) -> GenRequest {
        GenRequest {
            api,
            model,
            messages: Vec::new(),
            prompt: None,
            tool_lines: Vec::new(),
            tools_disabled: false,
            mode,
            sampler: asked.for_thinking(mode.thinks()),
            sampler_asked: asked,
            seed: None,
            max_tokens: None,
            stream: false,
            include_usage: false,
            stop: Vec::new(),
            reasoning_summary: false,
            output: None,
            tool_grammar: None,
            script: None,
            raw: Vec::new(),
            scoring: Scoring::default(),
            think_level,
            dialect: Dialect::V4,
        }
    }

    pub fn tools_active(&self) -> bool {
        !self.tool_lines.is_empty() && !self.tools_disabled
    }

    /// Renders this request in the loaded model's template. On V4.1 a
    /// request that ends up at level 0 (the server's `--think-level 0` and
    /// no thinking field) does not think, so its output is not parsed as
    /// reasoning either.
    pub fn set_dialect(&mut self, d: Dialect) {
        self.dialect = d;
        if d != Dialect::V4
            && d.level(
                self.mode,
                self.think_level.effort,
                self.think_level.explicit,
            ) == 0
        {
            self.mode = ThinkMode::None;
        }
    }

    /// The sampling fields the request set that its thinking turn replaced
    /// by the defaults ([`SamplerConfig::for_thinking`]): empty unless it
    /// thinks and asked for other values. The server logs it once.
    pub fn replaced_sampling(&self) -> Vec<String> {
        let (asked, used) = (&self.sampler_asked, &self.sampler);
        if !self.mode.thinks() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if asked.temperature != used.temperature {
            out.push(format!("temperature {}", asked.temperature));
        }
        if asked.top_p != used.top_p {
            out.push(format!("top_p {}", asked.top_p));
        }
        if asked.top_k != used.top_k {
            out.push(format!("top_k {}", asked.top_k));
        }
        if asked.min_p != used.min_p {
            out.push(format!("min_p {}", asked.min_p));
        }
        out
    }

    /// Chat-style: tool calls and reasoning are parsed out of the output.
    pub fn chat_style(&self) -> bool {
        self.api != Api::Completions
    }
}

/// Server-side settings the parsers need.
#[derive(Clone, Copy, Debug)]
pub struct ParseContext {
    pub ctx: usize,
    pub allow_script: bool,
}

// The field parsers the APIs share.

fn bad() -> ApiError {
    ApiError::invalid("invalid JSON request")
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| bad())?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(bad()),
    }
}

fn opt_str(m: &Map<String, Value>, k: &str) -> Result<Option<String>, ApiError> {
    match m.get(k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad()),
    }
}

fn opt_bool(m: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match m.get(k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad()),
    }
}

fn opt_num(m: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match m.get(k) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_f64().map(Some).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// Text of a content value: a string, or the concatenated strings / `text`
/// fields of an array; `null` is "".
fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// Arguments: a JSON string is its text, anything else its JSON.
fn arguments_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A bool, `null` counting as absent.
fn opt_bool_or_null(m: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match m.get(k) {
        Some(Value::Null) => Ok(None),
        _ => opt_bool(m, k),
    }
}

/// Sampling fields, type-checked, as the request asked them; a turn that
/// thinks samples with the fixed official values instead
/// ([`SamplerConfig::for_thinking`], applied by the callers).
fn sampling(
    m: &Map<String, Value>,
    with_min_p: bool,
    with_top_k: bool,
) -> Result<SamplerConfig, ApiError> {
    let mut c = SamplerConfig::default();
    if let Some(t) = opt_num(m, "temperature")? {
        c.temperature = t as f32;
    }
    if let Some(t) = opt_num(m, "top_p")? {
        c.top_p = t as f32;
    }
    if with_min_p {
        if let Some(t) = opt_num(m, "min_p")? {
            c.min_p = t as f32;
        }
    }
    if with_top_k {
        if let Some(t) = opt_num(m, "top_k")? {
            c.top_k = t.clamp(i32::MIN as f64, i32::MAX as f64) as i32;
        }
    }
    Ok(c)
}

fn seed(m: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    Ok(opt_num(m, "seed")?.filter(|s| *s >= 1.0).map(|s| s as u64))
}

fn max_tokens(m: &Map<String, Value>, keys: &[&str]) -> Result<Option<i64>, ApiError> {
    let mut out = None;
    for k in keys {
        if let Some(v) = opt_num(m, k)? {
            out = Some(if v < 0.0 { 0 } else { v as i64 });
        }
    }
    Ok(out)
}

fn stop_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}

fn include_usage(m: &Map<String, Value>) -> Result<bool, ApiError> {
    match m.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(o)) => Ok(opt_bool(o, "include_usage")?.unwrap_or(false)),
        Some(_) => Err(bad()),
    }
}

fn script(m: &Map<String, Value>, pc: ParseContext) -> Result<Option<String>, ApiError> {
    if !pc.allow_script {
        return Ok(None);
    }
    opt_str(m, "ds4_test_script")
}

/// The `messages` array of a chat or messages request.
fn message_array(m: &Map<String, Value>) -> Result<&Vec<Value>, ApiError> {
    match m.get("messages") {
        None => Err(ApiError::invalid("missing messages")),
        Some(Value::Array(msgs)) => Ok(msgs),
        Some(_) => Err(bad()),
    }
}

fn model(m: &Map<String, Value>) -> Result<String, ApiError> {
    Ok(opt_str(m, "model")?.unwrap_or_else(|| "deepseek-v4-flash".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PC: ParseContext = ParseContext {
        ctx: 4096,
        allow_script: false,
    };

    #[test]
    fn wrong_types_and_missing_fields() {
        for body in [
            &br#"[]"#[..],
            br#"{"messages":[],"stream":null}"#,
            br#"{"messages":[],"max_tokens":null}"#,
            br#"{"messages":[],"temperature":"1"}"#,
            br#"{"messages":[],"model":null}"#,
            br#"{"messages":[],"reasoning_effort":"huge"}"#,
            b"{\"messages\":[],\"model\":\"\xff\"}",
        ] {
            let e = parse_chat(body, PC).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.body.contains("invalid JSON request"), "{}", e.body);
        }
        let e = parse_chat(br#"{"model":"x"}"#, PC).unwrap_err();
        assert!(e.body.contains("missing messages"));
        let e = parse_responses(br#"{"model":"x"}"#, PC).unwrap_err();
        assert!(e.body.contains("missing input"));
        let e = parse_completions(br#"{}"#, PC).unwrap_err();
        assert!(e.body.contains("missing prompt"));
        // A batch of texts is refused, not cut to its first; one is fine.
        let e = parse_completions(br#"{"prompt":["a","b"]}"#, PC).unwrap_err();
        assert!(e.body.contains("one prompt per request"), "{}", e.body);
        let one = parse_completions(br#"{"prompt":["a"]}"#, PC).unwrap();
        assert_eq!(one.prompt.as_deref(), Some("a"));
    }

    #[test]
    fn thinking_resolution() {
        let mode = |b: &[u8]| parse_chat(b, PC).unwrap().mode;
        assert_eq!(mode(br#"{"messages":[]}"#), ThinkMode::High);
        assert_eq!(
            mode(br#"{"messages":[],"model":"deepseek-chat"}"#),
            ThinkMode::None
        );
        assert_eq!(
            mode(br#"{"messages":[],"model":"deepseek-chat","thinking":null}"#),
            ThinkMode::High
        );
        assert_eq!(mode(br#"{"messages":[],"think":false}"#), ThinkMode::None);
        assert_eq!(
            mode(br#"{"messages":[],"thinking":{"type":"disabled"}}"#),
            ThinkMode::None
        );
        // max downgrades below 384 Ki context.
        assert_eq!(
            mode(br#"{"messages":[],"reasoning_effort":"max"}"#),
            ThinkMode::High
        );
        let big = ParseContext {
            ctx: 400_000,
            allow_script: false,
        };
        let r = parse_chat(br#"{"messages":[],"reasoning_effort":"max"}"#, big).unwrap();
        assert_eq!(r.mode, ThinkMode::Max);
        let r = parse_responses(br#"{"input":"x","reasoning":{"effort":"none"}}"#, PC).unwrap();
        assert_eq!(r.mode, ThinkMode::None);
    }

    #[test]
    fn a_thinking_turn_samples_with_the_defaults() {
        let body = br#"{"messages":[],"temperature":0.2,"top_p":0.5,"min_p":0,"top_k":7}"#;
        let thinking = parse_chat(body, PC).unwrap();
        assert!(thinking.mode.thinks());
        assert_eq!(thinking.sampler, SamplerConfig::default());
        assert_eq!(
            thinking.replaced_sampling(),
            ["temperature 0.2", "top_p 0.5", "top_k 7", "min_p 0"]
        );
        // Asking for the defaults replaces nothing.
        let same = br#"{"messages":[],"temperature":1,"top_p":1}"#;
        assert!(parse_chat(same, PC).unwrap().replaced_sampling().is_empty());
        let body =
            br#"{"messages":[],"think":false,"temperature":0.2,"top_p":0.5,"min_p":0,"top_k":7}"#;
        let plain = parse_chat(body, PC).unwrap();
        let asked = SamplerConfig {
            temperature: 0.2,
            top_p: 0.5,
            min_p: 0.0,
            top_k: 7,
        };
        assert_eq!(plain.sampler, asked);
        assert!(plain.replaced_sampling().is_empty());
        // The fields are type-checked all the same.
        assert!(parse_chat(br#"{"messages":[],"temperature":"hot"}"#, PC).is_err());
    }

    #[test]
    fn tool_lines_are_the_request_bytes() {
        let body = br#"{"messages":[],"tools":[ {"type":"function","function":{"name":"bash",  "parameters":{}}}, {"name":"x","input_schema":{}}]}"#;
        let r = parse_chat(body, PC).unwrap();
        assert_eq!(
            r.tool_lines,
            vec![
                r#"{"name":"bash",  "parameters":{}}"#.to_string(),
                r#"{"name":"x","input_schema":{}}"#.to_string()
            ]
        );
    }
}
