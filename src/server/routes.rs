//! The HTTP layer: one warp filter that checks the request's `Host`,
//! `Origin` and API key from its headers, then reads the body (capped, with
//! an idle deadline), routes, and turns a job's events into a JSON body or an
//! SSE stream. Nothing here touches the engine; `listen` serves the filter.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use warp::http::header::HeaderValue;
use warp::http::{HeaderMap, Method, Response, StatusCode};
use warp::hyper::Body;
use warp::Filter;

use super::error::ApiError;
use super::guard::{self, CorsOrigins};
use super::job::{Event, Final, Job};
use super::metrics::Metrics;
use super::openai::Meta;
use super::request::{self, Api, GenRequest, ParseContext};
use super::tokenize::{self, SharedTokenizer};
use super::worker::Queue;
use super::{anthropic, openai, page, render, responses, StreamFormat};
use crate::chat::Dialect;

/// The model id ds4 serves and lists.
pub const MODEL_ID: &str = "deepseek-v4-flash";

/// SSE comment sent while nothing else was sent for this long (prefill).
const KEEPALIVE: Duration = Duration::from_secs(5);

/// What the filter enforces (flags of `ds4-server`; docs/SECURITY.md).
#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub ctx: usize,
    pub default_tokens: usize,
    /// Browser origins allowed to call (`--cors`).
    pub cors: CorsOrigins,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Longest wait for the next piece of a request body (`--body-timeout`).
    pub body_idle: Duration,
    /// Rendered prompts longer than this cannot fit `ctx` and are refused
    /// before they queue (`ctx` × the longest token's bytes; see
    /// [`prompt_byte_bound`]).
    pub max_prompt_bytes: usize,
    pub allow_script: bool,
    /// For `/tokenize`, `/detokenize` and `/tokenizer_info` (absent: 404).
    pub tokenizer: Option<SharedTokenizer>,
    /// The loaded model's chat template (V4.1: with the server's default
    /// thinking level); every request is rendered in it.
    pub dialect: Dialect,
}

impl Default for HttpOptions {
    fn default() -> HttpOptions {
        HttpOptions {
            ctx: 32768,
            default_tokens: 393216,
            cors: CorsOrigins::default(),
            api_key: None,
            max_body_bytes: 64 << 20,
            body_idle: Duration::from_secs(10),
            max_prompt_bytes: usize::MAX,
            allow_script: false,
            tokenizer: None,
            dialect: Dialect::V4,
        }
    }
}

/// The byte length over which a rendered prompt has at least `ctx` tokens
/// whatever its text: no token covers more bytes than the vocabulary's
/// longest one. (The worker refuses prompts of `ctx` tokens or more.)
pub fn prompt_byte_bound(ctx: usize, longest_token_bytes: usize) -> usize {
    ctx.saturating_mul(longest_token_bytes.max(1))
}

pub struct State {
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub opts: HttpOptions,
    pub counter: AtomicU64,
}

/// The whole server as one filter (used by `listen` and by `warp::test`).
pub fn routes(
    state: Arc<State>,
) -> impl Filter<Extract = (Response<Body>,), Error = warp::Rejection> + Clone {
    warp::method()
        .and(warp::path::full())
        .and(warp::header::headers_cloned())
        .and(warp::body::stream())
        .and(warp::any().map(move || state.clone()))
        .then(
            |method: Method,
             path: warp::path::FullPath,
             headers: HeaderMap,
             body,
             state: Arc<State>| async move {
                let opts = &state.opts;
                let origin = guard::admit(&headers, opts.api_key.is_some(), &opts.cors);
                let mut resp = match &origin {
                    // Refused on its headers: the body is never read, so the
                    // connection cannot be reused.
                    Err(e) => closing(error_response(e.clone())),
                    Ok(_) => handle(method.clone(), path.as_str(), &headers, body, state).await,
                };
                if let Ok(Some(allow)) = origin {
                    guard::add_cors(resp.headers_mut(), allow, &method, &headers);
                }
                resp
            },
        )
}

/// Why a request body was not read whole.
#[derive(Debug, PartialEq, Eq)]
enum BodyError {
    /// Over `--max-body-bytes`.
    TooLarge,
    /// No bytes for `--body-timeout`.
    Stalled,
    /// The client closed early or sent a broken chunked body.
    Broken,
}

async fn read_body<S, B>(body: S, limit: usize, idle: Duration) -> Result<Vec<u8>, BodyError>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let mut body = Box::pin(body);
    let mut out = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(idle, body.next()).await {
            Err(_) => return Err(BodyError::Stalled),
            Ok(None) => return Ok(out),
            Ok(Some(c)) => c,
        };
        let mut chunk = chunk.map_err(|_| BodyError::Broken)?;
        if out.len() + chunk.remaining() > limit {
            return Err(BodyError::TooLarge);
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
}

/// Asks hyper to close the connection after this response (the request
/// body was not read whole, so the next request's start is unknown).
fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut()
        .insert("connection", HeaderValue::from_static("close"));
    r
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        413,
        &format!("request body larger than {limit} bytes (--max-body-bytes)"),
    )
}

/// The request field that holds the prompt, for the context errors.
pub fn param_of(api: Api) -> &'static str {
    match api {
        Api::Chat | Api::Messages => "messages",
        Api::Completions => "prompt",
        Api::Responses => "input",
    }
}

fn json_response(status: u16, body: String) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn error_response(e: ApiError) -> Response<Body> {
    let mut r = json_response(e.status, e.body);
    if let Some(s) = e.retry_after {
        if let Ok(v) = s.to_string().parse() {
            r.headers_mut().insert("retry-after", v);
        }
    }
    r
}

/// Constant-time comparison (the key must not leak through timing).
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for (i, &x) in a.iter().enumerate() {
        diff |= x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0);
    }
    diff == 0 && a.len() == b.len()
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    [bearer, x]
        .into_iter()
        .flatten()
        .any(|k| same_key(k.trim().as_bytes(), key.as_bytes()))
}

/// The other name the official API answers with V4.1 Flash (research
/// note: both V4 names were moved to V4.1 in September).
pub const V41_ALIAS: &str = "deepseek-v4-pro";

/// The model ids `/v1/models` lists: `deepseek-v4-flash`, and for a V4.1
/// model also its alias.
pub fn model_ids(opts: &HttpOptions) -> &'static [&'static str] {
    match opts.dialect {
        Dialect::V4 => &[MODEL_ID],
        Dialect::V41 { .. } => &[MODEL_ID, V41_ALIAS],
    }
}

pub fn model_object(opts: &HttpOptions) -> serde_json::Value {
    model_object_named(opts, MODEL_ID)
}

fn model_object_named(opts: &HttpOptions, id: &str) -> serde_json::Value {
    let name = match opts.dialect {
        Dialect::V4 => "DeepSeek V4 Flash",
        Dialect::V41 { .. } => "DeepSeek V4.1 Flash",
    };
    json!({"id": id, "object": "model", "created": 1767225600u64, "owned_by": "ds4.c",
        "name": name, "context_length": opts.ctx,
        "top_provider": {"context_length": opts.ctx,
            "max_completion_tokens": opts.default_tokens.min(opts.ctx), "is_moderated": false},
        "supported_parameters": ["tools", "tool_choice", "max_tokens", "temperature", "top_p",
            "top_k", "min_p", "stop", "seed", "stream", "reasoning_effort"]})
}

/// One request: the routes that need no key (`OPTIONS`, `/health`, the
/// page), the API key, then the route by method and path.
async fn handle<S, B>(
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: S,
    state: Arc<State>,
) -> Response<Body>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    if let Some(r) = open_route(&method, path, &state) {
        return r;
    }
    // From the headers alone, before any body byte is read: an
    // unauthenticated client cannot make the server take in a large body.
    if let Some(key) = &state.opts.api_key {
        if !authorized(headers, key) {
            return closing(error_response(ApiError::new(
                401,
                "invalid or missing API key",
            )));
        }
    }
    let api = match (method.clone(), path) {
        (Method::POST, "/v1/chat/completions") => Api::Chat,
        (Method::POST, "/v1/completions") => Api::Completions,
        (Method::POST, "/v1/responses") => Api::Responses,
        (Method::POST, "/v1/messages") => Api::Messages,
        (Method::POST, "/tokenize" | "/detokenize") if state.opts.tokenizer.is_some() => {
            return tokenizer_post(path, headers, body, &state).await;
        }
        (Method::GET, _) => return get_route(path, &state),
        _ => return not_found(),
    };
    generate(api, headers, body, &state).await
}

/// What is answered before the API key is checked: `OPTIONS` (CORS
/// preflight), `/health` and the chat page.
fn open_route(method: &Method, path: &str, state: &State) -> Option<Response<Body>> {
    if method == Method::OPTIONS {
        return Some(
            Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .unwrap_or_else(|_| Response::new(Body::empty())),
        );
    }
    if method == Method::GET && path == "/health" {
        // 503 once the worker thread is gone, so a supervisor restarts us.
        let (status, body) = state.queue.health().report();
        return Some(json_response(status, format!("{body}\n")));
    }
    // The chat page holds no secret: it asks for the key when it calls.
    if method == Method::GET && path == "/" {
        return Some(page::response());
    }
    None
}

/// `GET`: the model list, one model, `/tokenizer_info`, `/metrics`; any
/// other path is a 404.
fn get_route(path: &str, state: &State) -> Response<Body> {
    match path {
        "/v1/models" => {
            let data: Vec<serde_json::Value> = model_ids(&state.opts)
                .iter()
                .map(|id| model_object_named(&state.opts, id))
                .collect();
            let v = json!({"object": "list", "data": data});
            json_response(200, format!("{v}\n"))
        }
        p if p
            .strip_prefix("/v1/models/")
            .is_some_and(|id| model_ids(&state.opts).contains(&id)) =>
        {
            let id = p.trim_start_matches("/v1/models/");
            json_response(200, format!("{}\n", model_object_named(&state.opts, id)))
        }
        "/tokenizer_info" if state.opts.tokenizer.is_some() => {
            let tok = state.opts.tokenizer.as_ref().map(|t| t.0.clone());
            match tok {
                Some(t) => json_response(200, tokenize::info(&t, state.opts.ctx)),
                None => not_found(),
            }
        }
        "/metrics" => Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Body::from(state.metrics.render()))
            .unwrap_or_else(|_| Response::new(Body::empty())),
        _ => not_found(),
    }
}

fn not_found() -> Response<Body> {
    closing(error_response(ApiError::new(404, "unknown endpoint")))
}

/// A generation request of `api`: the body read and parsed, the job queued,
/// then its answer as one JSON body or an SSE stream.
async fn generate<S, B>(api: Api, headers: &HeaderMap, body: S, state: &State) -> Response<Body>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let body = match json_body(headers, body, state).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let req = match parse(api, body, state) {
        Ok(r) => r,
        Err(e) => return error_response(e),
    };
    let meta = meta(api, &req, state);
    let stream = req.stream;
    let include_usage = req.include_usage;
    let summary = req.reasoning_summary;
    let (tx, mut rx) = unbounded_channel();
    if let Err(e) = state.queue.submit(Job { req, events: tx }) {
        state.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        return error_response(e);
    }
    // The prompt is checked (context, tool ids) before anything is sent.
    let (prompt, cached) = match rx.recv().await {
        Some(Event::Accepted {
            prompt_tokens,
            cached,
        }) => (prompt_tokens, cached),
        Some(Event::Rejected(e)) => return error_response(e),
        Some(Event::Failed(msg)) => return error_response(ApiError::new(500, &msg)),
        _ => return error_response(ApiError::new(500, "the worker stopped")),
    };
    if !stream {
        return json_answer(api, &meta, rx, summary).await;
    }
    let fmt: Box<dyn StreamFormat> = match api {
        Api::Chat => Box::new(openai::ChatStream::new(meta, include_usage)),
        Api::Completions => Box::new(openai::CompletionStream::new(meta, include_usage)),
        Api::Messages => Box::new(anthropic::MessagesStream::new(meta)),
        Api::Responses => Box::new(responses::ResponsesStream::new(meta, summary)),
    };
    sse_response(rx, fmt, prompt, cached)
}

/// The body parsed by `api`'s parser, in the loaded model's template; a
/// prompt that cannot fit is refused here, before it queues and before the
/// worker tokenizes it (tokenizing megabytes would hold the engine).
fn parse(api: Api, body: Vec<u8>, state: &State) -> Result<GenRequest, ApiError> {
    let pc = ParseContext {
        ctx: state.opts.ctx,
        allow_script: state.opts.allow_script,
    };
    let mut req = match api {
        Api::Chat => request::parse_chat(&body, pc),
        Api::Completions => request::parse_completions(&body, pc),
        Api::Responses => request::parse_responses(&body, pc),
        Api::Messages => request::parse_messages(&body, pc),
    }?;
    req.set_dialect(state.opts.dialect);
    say_replaced_sampling(api, &req);
    let max = state.opts.max_prompt_bytes;
    let bytes = if max == usize::MAX {
        0
    } else {
        render::render(&req, &mut render::NoReplay).len()
    };
    if bytes > max {
        return Err(ApiError::prompt_bytes(
            bytes,
            state.opts.max_prompt_bytes,
            state.opts.ctx,
            param_of(api),
            api == Api::Messages,
        ));
    }
    req.raw = body;
    Ok(req)
}

/// Logs, the first time a request's sampling fields are replaced because
/// its turn thinks ([`GenRequest::replaced_sampling`]), what was replaced
/// and how to get plain sampling: an evaluation that sends `temperature: 0`
/// would otherwise sample at temperature 1 without a word (issue 39). Once
/// per server: a harness sends thousands of such requests.
fn say_replaced_sampling(api: Api, req: &GenRequest) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if SAID.is_completed() {
        return;
    }
    let replaced = req.replaced_sampling();
    if replaced.is_empty() {
        return;
    }
    // Each API's own way to turn thinking off (SERVER.md §4.2).
    let (path, off) = match api {
        Api::Chat => ("/v1/chat/completions", r#""thinking": false"#),
        Api::Completions => ("/v1/completions", r#""thinking": false"#),
        Api::Responses => ("/v1/responses", r#""reasoning": {"effort": "none"}"#),
        Api::Messages => ("/v1/messages", r#""thinking": {"type": "disabled"}"#),
    };
    SAID.call_once(|| {
        crate::log_line!(
            "ds4-server: a {path} request that thinks asked for {}: a thinking turn samples \
             at temperature 1, top_p 1, so those fields were replaced; send \
             \"model\": \"deepseek-chat\" or {off} for the request's own sampling \
             (said once)",
            replaced.join(", ")
        )
    });
}

/// The response's id (numbered per server, or a random Responses id), its
/// creation time and the model the request named.
fn meta(api: Api, req: &GenRequest, state: &State) -> Meta {
    let n = state.counter.fetch_add(1, Ordering::Relaxed) + 1;
    Meta {
        id: match api {
            Api::Completions => format!("cmpl-{n}"),
            Api::Responses => responses::item_id("resp_"),
            _ => format!("chatcmpl-{n}"),
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: req.model.clone(),
    }
}

/// A job's answer as one JSON body, once it is done.
async fn json_answer(
    api: Api,
    meta: &Meta,
    mut rx: UnboundedReceiver<Event>,
    summary: bool,
) -> Response<Body> {
    loop {
        match rx.recv().await {
            Some(Event::Done(f)) => {
                let body = match api {
                    Api::Chat => openai::chat_body(meta, &f),
                    Api::Completions => openai::completion_body(meta, &f),
                    Api::Messages => anthropic::body(meta, &f),
                    Api::Responses => responses::body(meta, &f, summary),
                };
                return json_response(200, body);
            }
            Some(Event::Failed(msg)) => return error_response(ApiError::new(500, &msg)),
            Some(_) => {}
            None => return error_response(ApiError::new(500, "the worker stopped")),
        }
    }
}

/// A POST body, after the JSON content-type rule (without a key) and the
/// size and idle limits; a refusal is the response to send.
async fn json_body<S, B>(
    headers: &HeaderMap,
    body: S,
    state: &State,
) -> Result<Vec<u8>, Response<Body>>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    if state.opts.api_key.is_none() && !guard::json_content_type(headers) {
        return Err(closing(error_response(ApiError::new(
            415,
            "Content-Type must be application/json (without an API key other types are refused, so that web pages cannot post here)",
        ))));
    }
    let limit = state.opts.max_body_bytes;
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(closing(error_response(too_large(limit))));
    }
    let body = match read_body(body, limit, state.opts.body_idle).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return Err(closing(error_response(too_large(limit)))),
        Err(BodyError::Stalled) => {
            let secs = state.opts.body_idle.as_secs_f64();
            let msg = format!("request body stalled: no bytes for {secs} s (--body-timeout)");
            return Err(closing(error_response(ApiError::new(408, &msg))));
        }
        Err(BodyError::Broken) => {
            return Err(closing(error_response(ApiError::invalid(
                "bad HTTP request",
            ))))
        }
    };
    Ok(body)
}

/// `POST /tokenize` and `POST /detokenize` (`tokenize.rs`).
async fn tokenizer_post<S, B>(
    path: &str,
    headers: &HeaderMap,
    body: S,
    state: &State,
) -> Response<Body>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let Some(tok) = state.opts.tokenizer.as_ref().map(|t| t.0.clone()) else {
        return closing(error_response(ApiError::new(404, "unknown endpoint")));
    };
    let body = match json_body(headers, body, state).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let out = if path == "/tokenize" {
        tokenize::tokenize(&tok, state.opts.ctx, &body)
    } else {
        tokenize::detokenize(&tok, &body)
    };
    match out {
        Ok(b) => json_response(200, b),
        Err(e) => error_response(e),
    }
}

struct SseState {
    rx: UnboundedReceiver<Event>,
    fmt: Box<dyn StreamFormat>,
    queue: VecDeque<String>,
    done: bool,
}

fn sse_response(
    rx: UnboundedReceiver<Event>,
    mut fmt: Box<dyn StreamFormat>,
    prompt: usize,
    cached: usize,
) -> Response<Body> {
    let queue: VecDeque<String> = fmt.start(prompt, cached).into();
    let st = SseState {
        rx,
        fmt,
        queue,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(s) = st.queue.pop_front() {
                return Some((Ok::<Bytes, Infallible>(Bytes::from(s)), st));
            }
            if st.done {
                return None;
            }
            let ev = match tokio::time::timeout(KEEPALIVE, st.rx.recv()).await {
                Err(_) => return Some((Ok(Bytes::from_static(b": prefill\n\n")), st)),
                Ok(ev) => ev,
            };
            let frames = match ev {
                Some(Event::Reasoning(r)) => st.fmt.reasoning(&r),
                Some(Event::Text(t)) => st.fmt.text(&t),
                Some(Event::ToolStart { index, id, name }) => st.fmt.tool_start(index, &id, &name),
                Some(Event::ToolArgs { index, args }) => st.fmt.tool_args(index, &args),
                Some(Event::ToolEnd { index }) => st.fmt.tool_end(index),
                Some(Event::Logprobs(e)) => st.fmt.logprobs(e),
                Some(Event::Done(f)) => {
                    st.done = true;
                    let f: Final = *f;
                    st.fmt.done(&f)
                }
                Some(Event::Failed(msg)) => {
                    st.done = true;
                    st.fmt.error(&msg)
                }
                Some(Event::Rejected(e)) => {
                    st.done = true;
                    st.fmt.error(&e.body)
                }
                Some(Event::Accepted { .. }) => Vec::new(),
                None => {
                    st.done = true;
                    st.fmt.error("the worker stopped")
                }
            };
            st.queue.extend(frames);
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::wrap_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secret", b"secreT"));
        assert!(!same_key(b"secre", b"secret"));
        assert!(!same_key(b"", b"x"));
    }
}
