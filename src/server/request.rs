//! The four wire formats (OpenAI chat, completions, Responses, Anthropic
//! messages) translated into one internal request (SERVER.md §4, §5;
//! PROMPT.md §3.6). Every field a client controls is type-checked here; a
//! wrong type is `400 invalid JSON request`, unknown fields are ignored.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::strict::{self, ToolGrammar};
use crate::chat::{Dialect, ThinkMode};
use crate::constrain::{self, OutputGrammar};
use crate::sampler::SamplerConfig;

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
    pub sampler: SamplerConfig,
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

struct Thinking {
    enabled: bool,
    max: bool,
    none_effort: bool,
    explicit: bool,
    /// The V4.1 level of the last effort given.
    level: Option<u8>,
}

impl Thinking {
    fn new() -> Thinking {
        Thinking {
            enabled: true,
            max: false,
            none_effort: false,
            explicit: false,
            level: None,
        }
    }

    /// `thinking`: bool, `{"type":"enabled"|"disabled"}`, or null.
    fn thinking_field(&mut self, m: &Map<String, Value>) -> Result<(), ApiError> {
        match m.get("thinking") {
            None => {}
            Some(Value::Bool(b)) => {
                self.enabled = *b;
                self.explicit = true;
            }
            Some(Value::Null) => self.explicit = true,
            Some(Value::Object(o)) => {
                match o.get("type").and_then(Value::as_str) {
                    Some("enabled") => self.enabled = true,
                    Some("disabled") => self.enabled = false,
                    _ => {}
                }
                self.explicit = true;
            }
            Some(_) => return Err(bad()),
        }
        Ok(())
    }

    /// An effort name (SERVER.md §4.2); null leaves things unchanged.
    fn effort(&mut self, v: Option<&Value>) -> Result<(), ApiError> {
        match v {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) => {
                self.level = crate::chat::v41::level_of_name(s);
                match s.as_str() {
                    "max" => {
                        self.max = true;
                        self.none_effort = false
                    }
                    "xhigh" | "high" | "medium" | "low" | "minimal" => {
                        self.max = false;
                        self.none_effort = false
                    }
                    "none" => self.none_effort = true,
                    _ => return Err(bad()),
                }
                Ok(())
            }
            // A V4.1 level, 0 (none) to 100 (max), as the official encoder
            // takes it; on V4 it picks none, high or max.
            Some(Value::Number(n)) => {
                let l = n
                    .as_u64()
                    .filter(|&l| l <= 100)
                    .ok_or_else(|| ApiError::invalid("reasoning effort must be 0..100"))?
                    as u8;
                self.level = Some(l);
                self.none_effort = l == 0;
                self.max = l >= 100;
                Ok(())
            }
            Some(_) => Err(bad()),
        }
    }

    fn think_level(&self) -> ThinkLevel {
        ThinkLevel {
            effort: self.level,
            explicit: self.explicit || self.level.is_some(),
        }
    }

    fn mode(&self, model: &str, ctx: usize) -> ThinkMode {
        let mut enabled = self.enabled;
        if !self.explicit && model == "deepseek-chat" {
            enabled = false;
        }
        if !self.explicit && model == "deepseek-reasoner" {
            enabled = true;
        }
        let mode = if !enabled || self.none_effort {
            ThinkMode::None
        } else if self.max {
            ThinkMode::Max
        } else {
            ThinkMode::High
        };
        mode.effective(ctx)
    }
}

/// The thinking mode of a request, from the fields its API reads
/// (SERVER.md §4.2), plus whether a Responses client opted into reasoning
/// summaries. Chat and completions read `thinking`, `think` and
/// `reasoning_effort`; Anthropic reads `thinking`, `output_config.effort`
/// and `reasoning_effort`; Responses reads only `reasoning.effort` and
/// `reasoning.summary`. The model-name defaults and the Think Max context
/// rule then apply alike.
fn thinking(
    m: &Map<String, Value>,
    model: &str,
    api: Api,
    ctx: usize,
) -> Result<(ThinkMode, bool, ThinkLevel), ApiError> {
    let mut th = Thinking::new();
    let mut summary = false;
    if api == Api::Responses {
        match m.get("reasoning") {
            None | Some(Value::Null) => {}
            Some(Value::Object(r)) => {
                if let Some(e) = r.get("effort").filter(|e| !e.is_null()) {
                    th.explicit = true;
                    if e.as_str() == Some("none") {
                        th.enabled = false;
                    }
                    th.effort(Some(e))?;
                }
                summary = matches!(
                    r.get("summary").and_then(Value::as_str),
                    Some("auto" | "concise" | "detailed")
                );
            }
            Some(_) => return Err(bad()),
        }
        return Ok((th.mode(model, ctx), summary, th.think_level()));
    }
    th.thinking_field(m)?;
    if api == Api::Messages {
        if let Some(Value::Object(oc)) = m.get("output_config") {
            th.effort(oc.get("effort"))?;
        }
    } else if let Some(b) = opt_bool(m, "think")? {
        th.enabled = b;
        th.explicit = true;
    }
    th.effort(m.get("reasoning_effort"))?;
    Ok((th.mode(model, ctx), summary, th.think_level()))
}

/// Sampling fields; thinking modes use the fixed official values.
fn sampling(
    m: &Map<String, Value>,
    with_min_p: bool,
    with_top_k: bool,
    mode: ThinkMode,
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
    if mode.thinks() {
        c = SamplerConfig::default();
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

#[derive(Deserialize)]
struct RawTools<'a> {
    #[serde(borrow, default)]
    tools: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(borrow)]
    function: &'a RawValue,
}

/// Schema lines of PROMPT.md §4.1, copied from the request bytes.
fn tool_lines(body: &[u8]) -> Result<Vec<String>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| bad())?;
    let raw: RawTools = serde_json::from_str(text).map_err(|_| bad())?;
    let mut out = Vec::new();
    for t in raw.tools.unwrap_or_default() {
        let v: Value = serde_json::from_str(t.get()).map_err(|_| bad())?;
        let Value::Object(o) = &v else {
            return Err(bad());
        };
        if o.contains_key("function") {
            let f: RawFunction = serde_json::from_str(t.get()).map_err(|_| bad())?;
            out.push(f.function.get().to_string());
        } else if o.get("type").and_then(Value::as_str) == Some("namespace") {
            let ns = o.get("name").and_then(Value::as_str).unwrap_or("");
            for inner in o
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = inner.get("name").and_then(Value::as_str).unwrap_or("");
                let desc = inner
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let params = inner
                    .get("parameters")
                    .or_else(|| inner.get("input_schema"))
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| r#"{"type":"object","properties":{}}"#.into());
                out.push(format!(
                    "{{\"name\":{},\"description\":{},\"parameters\":{}}}",
                    Value::String(format!("{ns}{name}")),
                    Value::String(desc.into()),
                    params
                ));
            }
        } else if o.get("type").and_then(Value::as_str) == Some("tool_search") {
            let desc = o
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("Search available tools.");
            let params = o
                .get("parameters")
                .map(|p| p.to_string())
                .unwrap_or_else(|| r#"{"type":"object","properties":{}}"#.into());
            out.push(format!(
                "{{\"name\":\"tool_search\",\"description\":{},\"parameters\":{}}}",
                Value::String(desc.into()),
                params
            ));
        } else {
            out.push(t.get().to_string());
        }
    }
    Ok(out)
}

/// A structured-output grammar, compiled once here so an unsupported or
/// malformed schema is a 400 naming the part (`at` is where it sat in the
/// request).
fn checked(g: OutputGrammar, at: &str) -> Result<Option<OutputGrammar>, ApiError> {
    match constrain::check(&g) {
        Ok(()) => Ok(Some(g)),
        Err(e) => Err(ApiError::invalid(&format!("{at}: unsupported schema: {e}"))),
    }
}

/// OpenAI `response_format` (chat and completions): `text` (no grammar),
/// `json_object`, or `json_schema` with `{name, schema, strict}`. A
/// `json_schema` without a schema asks for any JSON object. `strict: false`
/// is constrained all the same: the server has no looser mode to offer.
fn response_format(m: &Map<String, Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let rf = match m.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(ApiError::invalid("response_format must be an object")),
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => checked(OutputGrammar::JsonObject, "response_format"),
        Some("json_schema") => {
            let js = match rf.get("json_schema") {
                Some(Value::Object(o)) => o,
                _ => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema must be an object",
                    ))
                }
            };
            schema_grammar(js.get("schema"), "response_format.json_schema.schema")
        }
        Some(t) => Err(ApiError::invalid(&format!(
            "response_format.type {t:?} is not supported (text, json_object, json_schema)"
        ))),
        None => Err(ApiError::invalid("response_format.type is missing")),
    }
}

/// The `schema` member of a `json_schema` format.
fn schema_grammar(schema: Option<&Value>, at: &str) -> Result<Option<OutputGrammar>, ApiError> {
    match schema {
        None | Some(Value::Null) => checked(OutputGrammar::JsonObject, at),
        Some(v @ (Value::Object(_) | Value::Bool(_))) => {
            checked(OutputGrammar::JsonSchema(v.clone()), at)
        }
        Some(_) => Err(ApiError::invalid(&format!(
            "{at} must be a JSON schema object"
        ))),
    }
}

/// Responses `text.format`: `{"type":"text"}`, `{"type":"json_object"}` or
/// the flat `{"type":"json_schema","name":…,"schema":{…},"strict":…}`.
fn text_format(m: &Map<String, Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let f = match m.get("text") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(t)) => match t.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(f)) => f,
            Some(_) => return Err(ApiError::invalid("text.format must be an object")),
        },
        Some(_) => return Err(bad()),
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => checked(OutputGrammar::JsonObject, "text.format"),
        Some("json_schema") => schema_grammar(f.get("schema"), "text.format.schema"),
        Some(t) => Err(ApiError::invalid(&format!(
            "text.format.type {t:?} is not supported (text, json_object, json_schema)"
        ))),
        None => Err(ApiError::invalid("text.format.type is missing")),
    }
}

fn model(m: &Map<String, Value>) -> Result<String, ApiError> {
    Ok(opt_str(m, "model")?.unwrap_or_else(|| "deepseek-v4-flash".into()))
}

/// `POST /v1/chat/completions`.
pub fn parse_chat(body: &[u8], pc: ParseContext) -> Result<GenRequest, ApiError> {
    let m = object(body)?;
    let model = model(&m)?;
    let (mode, _, think_level) = thinking(&m, &model, Api::Chat, pc.ctx)?;
    let Some(msgs) = m.get("messages") else {
        return Err(ApiError::invalid("missing messages"));
    };
    let Value::Array(msgs) = msgs else {
        return Err(bad());
    };
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
    Ok(GenRequest {
        think_level,
        dialect: Dialect::V4,
        api: Api::Chat,
        sampler: sampling(&m, true, true, mode)?,
        seed: seed(&m)?,
        max_tokens: max_tokens(&m, &["max_tokens", "max_completion_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: include_usage(&m)?,
        stop: stop_list(m.get("stop")),
        tool_lines: tool_lines(body)?,
        tools_disabled,
        script: script(&m, pc)?,
        model,
        messages,
        prompt: None,
        mode,
        reasoning_summary: false,
        output,
        tool_grammar: strict::parse(&m)?,
        raw: Vec::new(),
        scoring: chat_scoring(&m)?,
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
        Some(Value::Array(a)) => a.first().and_then(Value::as_str).unwrap_or("").into(),
        Some(_) => return Err(bad()),
    };
    Ok(GenRequest {
        think_level,
        dialect: Dialect::V4,
        api: Api::Completions,
        sampler: sampling(&m, true, true, mode)?,
        seed: seed(&m)?,
        max_tokens: max_tokens(&m, &["max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: include_usage(&m)?,
        stop: stop_list(m.get("stop")),
        tool_lines: Vec::new(),
        tools_disabled: true,
        script: script(&m, pc)?,
        model,
        messages: Vec::new(),
        prompt: Some(prompt),
        mode,
        reasoning_summary: false,
        output: response_format(&m)?,
        tool_grammar: None,
        raw: Vec::new(),
        scoring,
    })
}

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
    let Some(msgs) = m.get("messages") else {
        return Err(ApiError::invalid("missing messages"));
    };
    let Value::Array(msgs) = msgs else {
        return Err(bad());
    };
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
    Ok(GenRequest {
        think_level,
        dialect: Dialect::V4,
        api: Api::Messages,
        sampler: sampling(&m, false, true, mode)?,
        seed: None,
        max_tokens: max_tokens(&m, &["max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: false,
        stop: stop_list(m.get("stop_sequences")),
        tool_lines: tool_lines(body)?,
        tools_disabled,
        script: script(&m, pc)?,
        model,
        messages,
        prompt: None,
        mode,
        reasoning_summary: false,
        output: None,
        tool_grammar: strict::parse(&m)?,
        raw: Vec::new(),
        scoring: Scoring::default(),
    })
}

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
    let tools_disabled = match m.get("tool_choice") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "none" => true,
        Some(Value::String(s)) if s == "auto" => false,
        Some(Value::String(s)) => {
            return Err(ApiError::invalid(&format!("tool_choice={s} not supported")))
        }
        Some(_) => return Err(ApiError::invalid("forced tool_choice not supported")),
    };
    let output = text_format(&m)?;
    let mut messages = Vec::new();
    if let Some(i) = opt_str(&m, "instructions")?.filter(|s| !s.is_empty()) {
        messages.push(Message::new(Role::System, i));
    }
    let mut pending: Option<String> = None;
    match m.get("input") {
        None => return Err(ApiError::invalid("missing input")),
        Some(Value::String(s)) => messages.push(Message::new(Role::User, s.clone())),
        Some(Value::Array(items)) => {
            for it in items {
                let Value::Object(o) = it else {
                    return Err(bad());
                };
                if o.get("status")
                    .is_some_and(|s| !s.is_null() && s.as_str() != Some("completed"))
                {
                    return Err(bad());
                }
                let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
                let call_id = || {
                    o.get("call_id")
                        .or_else(|| o.get("id"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                match ty {
                    "message" => {
                        let role = match o.get("role").and_then(Value::as_str).unwrap_or("user") {
                            "system" | "developer" => Role::System,
                            "assistant" => Role::Assistant,
                            "user" => Role::User,
                            _ => continue,
                        };
                        let content = responses_content(o.get("content"))?;
                        if role != Role::Assistant {
                            if let Some(r) = pending.take() {
                                let mut a = Message::new(Role::Assistant, String::new());
                                a.reasoning = Some(r);
                                messages.push(a);
                            }
                        }
                        let mut msg = Message::new(role, content);
                        if role == Role::Assistant {
                            msg.reasoning = pending.take();
                        }
                        messages.push(msg);
                    }
                    "reasoning" => {
                        let mut parts = Vec::new();
                        for k in ["summary", "content"] {
                            let t = responses_content(o.get(k)).unwrap_or_default();
                            if !t.is_empty() {
                                parts.push(t);
                            }
                        }
                        let t = parts.join("\n");
                        match &mut pending {
                            Some(p) => p.push_str(&t),
                            None => pending = Some(t),
                        }
                    }
                    "function_call"
                    | "custom_tool_call"
                    | "local_shell_call"
                    | "web_search_call"
                    | "tool_search_call"
                    | "image_generation_call" => {
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
                            id: call_id(),
                            name,
                            arguments: args,
                        };
                        match messages.last_mut() {
                            Some(last) if last.role == Role::Assistant && pending.is_none() => {
                                last.tool_calls.push(call)
                            }
                            _ => {
                                let mut a = Message::new(Role::Assistant, String::new());
                                a.reasoning = pending.take();
                                a.tool_calls.push(call);
                                messages.push(a);
                            }
                        }
                    }
                    t if t.ends_with("_output") => {
                        if let Some(r) = pending.take() {
                            let mut a = Message::new(Role::Assistant, String::new());
                            a.reasoning = Some(r);
                            messages.push(a);
                        }
                        let content = match o.get("output").or_else(|| o.get("result")) {
                            Some(Value::String(s)) => s.clone(),
                            Some(Value::Array(a)) if a.iter().all(|b| b.get("text").is_some()) => {
                                content_text(Some(&Value::Array(a.clone())))
                            }
                            Some(v) => v.to_string(),
                            None => o.get("tools").map(|v| v.to_string()).unwrap_or_default(),
                        };
                        let mut msg = Message::new(Role::Tool, content);
                        msg.tool_result_ids.push(call_id());
                        messages.push(msg);
                    }
                    "compaction" | "context_compaction" => {}
                    _ => return Err(bad()),
                }
            }
            if let Some(r) = pending.take() {
                let mut a = Message::new(Role::Assistant, String::new());
                a.reasoning = Some(r);
                messages.push(a);
            }
        }
        Some(_) => return Err(bad()),
    }
    Ok(GenRequest {
        think_level,
        dialect: Dialect::V4,
        api: Api::Responses,
        sampler: sampling(&m, false, false, mode)?,
        seed: None,
        max_tokens: max_tokens(&m, &["max_output_tokens", "max_tokens"])?,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: false,
        stop: Vec::new(),
        tool_lines: tool_lines(body)?,
        tools_disabled: tools_disabled || output.is_some(),
        script: script(&m, pc)?,
        model,
        messages,
        prompt: None,
        mode,
        reasoning_summary: summary,
        output,
        tool_grammar: strict::parse(&m)?,
        raw: Vec::new(),
        scoring: Scoring::default(),
    })
}

/// What a chat or completions request asks to be scored (docs/CLIENTS.md
/// § Log-probabilities).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scoring {
    /// Log-probabilities wanted, with this many alternatives per token.
    pub top: Option<usize>,
    /// Completions `echo`: the prompt comes back before the completion,
    /// scored when `top` is set. Its text is then used raw, without the
    /// chat template.
    pub echo: bool,
    /// A completions prompt given as token ids, used as is (no template).
    pub prompt_ids: Option<Vec<u32>>,
}

impl Scoring {
    /// The prompt is the client's own tokens, not the single-turn chat.
    pub fn raw_prompt(&self) -> bool {
        self.echo || self.prompt_ids.is_some()
    }
}

/// Most alternatives per token a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A count of alternatives: an integer in `0..=20`, else a 400 naming `key`.
fn top_count(v: &Value, key: &str) -> Result<usize, ApiError> {
    let n = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    match n {
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(&format!(
            "{key} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"
        ))),
        None => Err(ApiError::invalid(&format!(
            "{key} must be an integer between 0 and {MAX_TOP_LOGPROBS}"
        ))),
    }
}

/// Chat: `logprobs` (bool) and `top_logprobs` (0..=20, only with
/// `logprobs: true`, as OpenAI requires).
fn chat_scoring(m: &Map<String, Value>) -> Result<Scoring, ApiError> {
    let on = opt_bool_or_null(m, "logprobs")?.unwrap_or(false);
    let top = match m.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(top_count(v, "top_logprobs")?),
    };
    if top.is_some() && !on {
        return Err(ApiError::invalid("top_logprobs needs logprobs: true"));
    }
    Ok(Scoring {
        top: on.then(|| top.unwrap_or(0)),
        ..Scoring::default()
    })
}

/// Completions: `logprobs` (0..=20 alternatives), `echo` and a prompt of
/// token ids.
fn completion_scoring(m: &Map<String, Value>) -> Result<Scoring, ApiError> {
    let top = match m.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(top_count(v, "logprobs")?),
    };
    Ok(Scoring {
        top,
        echo: opt_bool_or_null(m, "echo")?.unwrap_or(false),
        prompt_ids: prompt_ids(m.get("prompt"))?,
    })
}

fn opt_bool_or_null(m: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match m.get(k) {
        Some(Value::Null) => Ok(None),
        _ => opt_bool(m, k),
    }
}

/// A prompt of token ids: `[1, 2, 3]`, or `[[1, 2, 3]]` (one prompt per
/// request: a batch of several is refused rather than cut to its first).
fn prompt_ids(v: Option<&Value>) -> Result<Option<Vec<u32>>, ApiError> {
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        ApiError::invalid("prompt token ids must be non-negative integers")
                    })
            })
            .collect()
    };
    let Some(Value::Array(a)) = v else {
        return Ok(None);
    };
    match a.first() {
        Some(Value::Number(_)) => Ok(Some(ids(a)?)),
        Some(Value::Array(first)) if first.iter().all(Value::is_number) => {
            if a.len() > 1 {
                return Err(ApiError::invalid(
                    "one prompt per request: send each prompt of a batch in its own request",
                ));
            }
            Ok(Some(ids(first)?))
        }
        _ => Ok(None),
    }
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
