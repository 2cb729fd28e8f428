//! The HTTP layer: one warp filter that reads the request (body capped),
//! checks the API key, routes, and turns a job's events into a JSON body or
//! an SSE stream. Nothing here touches the engine.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use warp::http::{HeaderMap, Method, Response, StatusCode};
use warp::hyper::Body;
use warp::Filter;

use super::error::ApiError;
use super::metrics::Metrics;
use super::openai::Meta;
use super::request::{self, Api, ParseContext};
use super::worker::{Event, Final, Job, Queue};
use super::{anthropic, openai, responses, StreamFormat};

/// The model id ds4 serves and lists.
pub const MODEL_ID: &str = "deepseek-v4-flash";

/// SSE comment sent while nothing else was sent for this long (prefill).
const KEEPALIVE: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub ctx: usize,
    pub default_tokens: usize,
    pub cors: bool,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub allow_script: bool,
}

pub struct State {
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub opts: HttpOptions,
    pub counter: AtomicU64,
}

/// The whole server as one filter (used by the binary and by `warp::test`).
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
                let limit = state.opts.max_body_bytes;
                let body = read_body(body, limit).await;
                let cors = state.opts.cors;
                let mut resp = handle(method, path.as_str(), &headers, body, state).await;
                if cors {
                    let h = resp.headers_mut();
                    h.insert(
                        "access-control-allow-origin",
                        "*".parse().unwrap_or_else(|_| unreachable!()),
                    );
                    h.insert(
                        "access-control-allow-methods",
                        "GET, POST, OPTIONS"
                            .parse()
                            .unwrap_or_else(|_| unreachable!()),
                    );
                    h.insert(
                        "access-control-allow-headers",
                        "*".parse().unwrap_or_else(|_| unreachable!()),
                    );
                }
                resp
            },
        )
}

async fn read_body<S, B>(body: S, limit: usize) -> Result<Vec<u8>, ()>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let mut body = Box::pin(body);
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|_| ())?;
        if out.len() + chunk.remaining() > limit {
            return Err(());
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(out)
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

pub fn model_object(opts: &HttpOptions) -> serde_json::Value {
    json!({"id": MODEL_ID, "object": "model", "created": 1767225600u64, "owned_by": "ds4.c",
        "name": "DeepSeek V4 Flash", "context_length": opts.ctx,
        "top_provider": {"context_length": opts.ctx,
            "max_completion_tokens": opts.default_tokens.min(opts.ctx), "is_moderated": false},
        "supported_parameters": ["tools", "tool_choice", "max_tokens", "temperature", "top_p",
            "top_k", "min_p", "stop", "seed", "stream", "reasoning_effort"]})
}

async fn handle(
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Result<Vec<u8>, ()>,
    state: Arc<State>,
) -> Response<Body> {
    if method == Method::OPTIONS {
        return Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Body::empty())
            .unwrap_or_else(|_| Response::new(Body::empty()));
    }
    let Ok(body) = body else {
        return error_response(ApiError::invalid("bad HTTP request"));
    };
    if method == Method::GET && path == "/health" {
        // 503 once the worker thread is gone, so a supervisor restarts us.
        let (status, body) = state.queue.health().report();
        return json_response(status, format!("{body}\n"));
    }
    if let Some(key) = &state.opts.api_key {
        if !authorized(headers, key) {
            return error_response(ApiError::new(401, "invalid or missing API key"));
        }
    }
    let api = match (method.clone(), path) {
        (Method::GET, "/v1/models") => {
            let v = json!({"object": "list", "data": [model_object(&state.opts)]});
            return json_response(200, format!("{v}\n"));
        }
        (Method::GET, p) if p == format!("/v1/models/{MODEL_ID}") => {
            return json_response(200, format!("{}\n", model_object(&state.opts)));
        }
        (Method::GET, "/metrics") => {
            return Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Body::from(state.metrics.render()))
                .unwrap_or_else(|_| Response::new(Body::empty()));
        }
        (Method::POST, "/v1/chat/completions") => Api::Chat,
        (Method::POST, "/v1/completions") => Api::Completions,
        (Method::POST, "/v1/responses") => Api::Responses,
        (Method::POST, "/v1/messages") => Api::Messages,
        _ => return error_response(ApiError::new(404, "unknown endpoint")),
    };
    let pc = ParseContext {
        ctx: state.opts.ctx,
        allow_script: state.opts.allow_script,
    };
    let parsed = match api {
        Api::Chat => request::parse_chat(&body, pc),
        Api::Completions => request::parse_completions(&body, pc),
        Api::Responses => request::parse_responses(&body, pc),
        Api::Messages => request::parse_messages(&body, pc),
    };
    let mut req = match parsed {
        Ok(r) => r,
        Err(e) => return error_response(e),
    };
    req.raw = body;
    let n = state.counter.fetch_add(1, Ordering::Relaxed) + 1;
    let meta = Meta {
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
    };
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
        loop {
            match rx.recv().await {
                Some(Event::Done(f)) => {
                    let body = match api {
                        Api::Chat => openai::chat_body(&meta, &f),
                        Api::Completions => openai::completion_body(&meta, &f),
                        Api::Messages => anthropic::body(&meta, &f),
                        Api::Responses => responses::body(&meta, &f, summary),
                    };
                    return json_response(200, body);
                }
                Some(Event::Failed(msg)) => return error_response(ApiError::new(500, &msg)),
                Some(_) => {}
                None => return error_response(ApiError::new(500, "the worker stopped")),
            }
        }
    }
    let fmt: Box<dyn StreamFormat> = match api {
        Api::Chat => Box::new(openai::ChatStream {
            meta,
            include_usage,
        }),
        Api::Completions => Box::new(openai::CompletionStream {
            meta,
            include_usage,
        }),
        Api::Messages => Box::new(anthropic::MessagesStream::new(meta)),
        Api::Responses => Box::new(responses::ResponsesStream::new(meta, summary)),
    };
    sse_response(rx, fmt, prompt, cached)
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
