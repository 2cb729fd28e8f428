//! ds4-server in process (`warp::test`) on a generated tiny model: every
//! endpoint, the JSON and SSE shapes, tool calls through the scripted test
//! mode, exact DSML replay and live prefix reuse (counted in tokens), stop
//! sequences, bad input, and valid UTF-8 in everything sent.

mod common;

use common::in_process::tiny_worker;

use std::sync::Arc;

use ds4::server::job;
use ds4::server::render;
use ds4::server::request::{self, ParseContext};
use ds4::server::routes::{self, HttpOptions, State};
use ds4::session::Session;
use ds4::Tokenizer;
use serde_json::{json, Value};

const CTX: usize = 768;

struct Server {
    state: Arc<State>,
    tok: Arc<Tokenizer>,
}

fn server_with(max_body: usize, api_key: Option<&str>) -> Server {
    server_hooked(max_body, api_key, Box::new(job::NoCache))
}

fn server_hooked(
    max_body: usize,
    api_key: Option<&str>,
    cache: Box<dyn job::KvCacheHook>,
) -> Server {
    let (queue, metrics, tok) = tiny_worker(CTX, cache);
    let opts = HttpOptions {
        api_key: api_key.map(String::from),
        max_body_bytes: max_body,
        allow_script: true,
        ..HttpOptions::default()
    };
    let state = common::in_process::routes_state(queue, metrics, CTX, opts);
    Server { state, tok }
}

/// The first item of a Responses reply's output of type `ty`.
fn output_item(v: &Value, ty: &str) -> Value {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == ty)
        .unwrap()
        .clone()
}

fn server() -> Server {
    server_with(1 << 20, None)
}

struct Reply {
    status: u16,
    body: String,
    headers: warp::http::HeaderMap,
}

impl Server {
    async fn send(&self, method: &str, path: &str, body: &[u8]) -> Reply {
        let r = warp::test::request()
            .method(method)
            .path(path)
            .header("content-type", "application/json")
            .body(body)
            .reply(&routes::routes(self.state.clone()))
            .await;
        let body = String::from_utf8(r.body().to_vec()).expect("every byte sent is valid UTF-8");
        Reply {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body,
        }
    }

    async fn post(&self, path: &str, v: &Value) -> Reply {
        self.send("POST", path, v.to_string().as_bytes()).await
    }

    /// The JSON body of a POST, whatever its status.
    async fn post_body(&self, path: &str, v: &Value) -> Value {
        serde_json::from_str(&self.post(path, v).await.body).unwrap()
    }

    async fn post_json(&self, path: &str, v: &Value) -> Value {
        let r = self.post(path, v).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.ends_with('\n') || path == "/v1/responses",
            "{}",
            r.body
        );
        serde_json::from_str(&r.body).unwrap()
    }

    /// Tokens of the prompt the server renders for `body` on `path`.
    fn prompt_tokens(&self, path: &str, body: &Value) -> usize {
        let pc = ParseContext {
            ctx: CTX,
            allow_script: true,
        };
        let b = body.to_string();
        let req = match path {
            "/v1/chat/completions" => request::parse_chat(b.as_bytes(), pc),
            "/v1/messages" => request::parse_messages(b.as_bytes(), pc),
            "/v1/responses" => request::parse_responses(b.as_bytes(), pc),
            _ => request::parse_completions(b.as_bytes(), pc),
        }
        .unwrap();
        self.tok
            .encode_chat(&render::render(&req, &mut render::NoReplay))
            .len()
    }

    fn script_tokens(&self, s: &str) -> usize {
        self.tok.encode_chat(s).len()
    }
}

/// `data:` payloads of an SSE body (OpenAI style), `[DONE]` excluded.
fn sse_data(body: &str) -> Vec<Value> {
    assert!(body.ends_with("\n\n"), "{body}");
    body.split("\n\n")
        .filter(|e| !e.is_empty() && !e.starts_with(':'))
        .filter_map(|e| {
            let d = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            if d == "[DONE]" {
                None
            } else {
                Some(serde_json::from_str(d).unwrap_or_else(|_| panic!("bad JSON: {d}")))
            }
        })
        .collect()
}

/// (event name, data) pairs of an Anthropic SSE body.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap();
            let d = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name.to_string(), serde_json::from_str(d).unwrap())
        })
        .collect()
}

const TOOL_SCRIPT: &str = "Need to list.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn bash_tool() -> Value {
    json!([{"type":"function","function":{"name":"bash","description":"Run a shell command.",
        "parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}}}}}])
}

#[tokio::test]
async fn models_health_metrics_and_unknown_routes() {
    let s = server();
    let r = s.send("GET", "/v1/models", b"").await;
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "deepseek-v4-flash");
    assert_eq!(v["data"][0]["context_length"], CTX);
    let r = s.send("GET", "/v1/models/deepseek-v4-flash", b"").await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["top_provider"]["max_completion_tokens"], 24);
    for (m, p) in [
        ("GET", "/v1/models/gpt-4"),
        ("GET", "/nope"),
        ("GET", "/v1/chat/completions"),
    ] {
        let r = s.send(m, p, b"").await;
        assert_eq!(r.status, 404, "{p}");
        assert!(r.body.contains("unknown endpoint"));
    }
    assert_eq!(s.send("OPTIONS", "/v1/messages", b"").await.status, 204);
    let r = s.send("GET", "/health", b"").await;
    assert_eq!(r.status, 200);
    let r = s.send("GET", "/metrics", b"").await;
    assert!(
        r.body
            .contains("# TYPE ds4_queue_depth gauge\nds4_queue_depth 0\n"),
        "{}",
        r.body
    );
    assert!(r.body.contains("ds4_prefix_reused_tokens_total 0"));
}

#[tokio::test]
async fn chat_thinking_split_usage_and_stream_shape() {
    let s = server();
    let script = "Think é😀 hard.</think>The answer.";
    let body = json!({"messages":[{"role":"user","content":"hi"}],"ds4_test_script":script});
    let v = s.post_json("/v1/chat/completions", &body).await;
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "Think é😀 hard.");
    assert_eq!(msg["content"], "The answer.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let u = &v["usage"];
    assert_eq!(
        u["prompt_tokens"],
        s.prompt_tokens("/v1/chat/completions", &body)
    );
    assert_eq!(u["completion_tokens"], s.script_tokens(script));
    assert_eq!(
        u["total_tokens"],
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", &sb).await;
    assert_eq!(r.headers["content-type"], "text/event-stream");
    assert!(r.body.ends_with("data: [DONE]\n\n"));
    let chunks = sse_data(&r.body);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role":"assistant"})
    );
    let cat = |k: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][k].as_str())
            .collect()
    };
    assert_eq!(cat("reasoning_content"), "Think é😀 hard.");
    assert_eq!(cat("content"), "The answer.");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    // The same prompt again: the live session is not a prefix of it (it
    // holds the answer too), so nothing is cached and the count is exact.
    assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], u["prompt_tokens"]);
}

#[tokio::test]
async fn chat_tool_calls_then_exact_replay_reuses_the_live_session() {
    let s = server();
    let user = json!({"role":"user","content":"List files."});
    let body = json!({"messages":[user],"tools":bash_tool(),"ds4_test_script":TOOL_SCRIPT,"max_tokens":200});
    let v = s.post_json("/v1/chat/completions", &body).await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["content"], "Sure.");
    assert_eq!(c["message"]["reasoning_content"], "Need to list.");
    let call = &c["message"]["tool_calls"][0];
    let id = call["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("call_") && id.len() == 5 + 32, "{id}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "bash");
    assert_eq!(
        call["function"]["arguments"],
        r#"{"command":"ls && pwd","timeout":10}"#
    );
    let live = v["usage"]["total_tokens"].as_u64().unwrap();

    // The client sends the call back as JSON with the tool result: the
    // exact sampled DSML is rendered, so only the new suffix is evaluated.
    let assistant = json!({"role":"assistant","content":"Sure.","reasoning_content":"Need to list.",
        "tool_calls":[{"id":id,"type":"function","function":{"name":"bash","arguments":"{\"timeout\": 10, \"command\": \"ls && pwd\"}"}}]});
    let tool = json!({"role":"tool","tool_call_id":id,"content":"a.c\n/srv"});
    let body2 = json!({"messages":[user, assistant, tool],"tools":bash_tool(),"ds4_test_script":"Done.","max_tokens":50});
    let v2 = s.post_json("/v1/chat/completions", &body2).await;
    let u = &v2["usage"];
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], live, "{v2}");
    let suffix =
        "<｜end▁of▁sentence｜><｜User｜><tool_result>a.c\n/srv</tool_result><｜Assistant｜><think>";
    assert_eq!(
        u["prompt_tokens_details"]["cache_write_tokens"],
        s.tok.encode_chat(suffix).len(),
        "{v2}"
    );
    // Replay rendered the sampled bytes, not the client's key order.
    let m = s.send("GET", "/metrics", b"").await.body;
    assert!(
        m.contains(&format!("ds4_prefix_reused_tokens_total {live}")),
        "{m}"
    );

    // Streaming: the call header as soon as the invoke tag is complete,
    // then argument fragments as they are generated (PROMPT.md §8).
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = sse_data(&s.post("/v1/chat/completions", &sb).await.body);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert!(calls.len() > 3, "{calls:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        calls[0][0]["function"],
        json!({"name":"bash","arguments":""})
    );
    assert_eq!(calls[1][0]["function"]["arguments"], "{");
    let args: String = calls
        .iter()
        .map(|c| c[0]["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(args, r#"{"command":"ls && pwd","timeout":10}"#);
    assert!(calls[1..].iter().all(|c| c[0].get("id").is_none()));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Sure.");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

#[tokio::test]
async fn prefix_reuse_for_a_stateless_client() {
    let s = server();
    let q1 = json!({"role":"user","content":"What is Redis?"});
    let body = json!({"model":"deepseek-chat","messages":[q1],"ds4_test_script":"A store."});
    let v = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "A store.");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let live = v["usage"]["total_tokens"].as_u64().unwrap();
    let body2 = json!({"model":"deepseek-chat","messages":[q1,{"role":"assistant","content":"A store."},
        {"role":"user","content":"Threads?"}],"ds4_test_script":"One."});
    let v2 = s.post_json("/v1/chat/completions", &body2).await;
    assert_eq!(v2["usage"]["prompt_tokens_details"]["cached_tokens"], live);
    let full = s.prompt_tokens("/v1/chat/completions", &body2) as u64;
    assert_eq!(v2["usage"]["prompt_tokens"], full);
    assert!(
        v2["usage"]["prompt_tokens_details"]["cache_write_tokens"]
            .as_u64()
            .unwrap()
            < full - live + 2
    );

    // Thinking mode without tools: the hidden reasoning stays in the KV.
    let b3 = json!({"messages":[q1],"ds4_test_script":"Hmm.</think>A store."});
    let v3 = s.post_json("/v1/chat/completions", &b3).await;
    let live3 = v3["usage"]["total_tokens"].as_u64().unwrap();
    let b4 = json!({"messages":[q1,{"role":"assistant","content":"A store."},{"role":"user","content":"More?"}],
        "ds4_test_script":"No.</think>No."});
    let v4 = s.post_json("/v1/chat/completions", &b4).await;
    assert_eq!(
        v4["usage"]["prompt_tokens_details"]["cached_tokens"], live3,
        "{v4}"
    );
}

#[tokio::test]
async fn stop_sequences_cut_and_invalidate() {
    let s = server();
    let body = json!({"model":"deepseek-chat","messages":[{"role":"user","content":"x"}],
        "ds4_test_script":"abc STOP def","stop":["STOP", ""]});
    let v = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(v["choices"][0]["message"]["content"], "abc ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let chunks = sse_data(&s.post("/v1/chat/completions", &sb).await.body);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "abc ");
    // Completions: raw text, same cut.
    let body = json!({"prompt":"x","ds4_test_script":"1, 2, 3","stop":"3","thinking":false});
    let v = s.post_json("/v1/completions", &body).await;
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], "1, 2, ");
    assert_eq!(v["object"], "text_completion");
}

#[tokio::test]
async fn completions_stream_and_length() {
    let s = server();
    let body = json!({"prompt":"Hello","max_tokens":5,"temperature":0,"think":false,"stream":true,
        "stream_options":{"include_usage":true}});
    let r = s.post("/v1/completions", &body).await;
    let chunks = sse_data(&r.body);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 5);
    assert_eq!(
        chunks[n - 1]["usage"]["prompt_tokens"],
        s.prompt_tokens("/v1/completions", &body)
    );
}

#[tokio::test]
async fn anthropic_messages_json_and_events() {
    let s = server();
    let tools = json!([{"name":"bash","description":"Run.","input_schema":{"type":"object"}}]);
    let body = json!({"model":"claude-x","max_tokens":200,"system":[{"type":"text","text":"Be brief."}],
        "messages":[{"role":"user","content":[{"type":"text","text":"List."}]}],
        "tools":tools,"ds4_test_script":TOOL_SCRIPT});
    let v = s.post_json("/v1/messages", &body).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], "claude-x");
    assert_eq!(v["stop_reason"], "tool_use");
    let id = v["id"].as_str().unwrap();
    assert_eq!(
        v["content"][0],
        json!({"type":"thinking","thinking":"Need to list.","signature":id})
    );
    assert_eq!(v["content"][1], json!({"type":"text","text":"Sure."}));
    let tu = &v["content"][2];
    assert_eq!(tu["type"], "tool_use");
    assert!(tu["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tu["input"], json!({"command":"ls && pwd","timeout":10}));
    assert_eq!(v["usage"]["input_tokens"], 0);
    assert_eq!(
        v["usage"]["cache_creation_input_tokens"],
        s.prompt_tokens("/v1/messages", &body)
    );

    // The tool result goes back as a user message: exact replay, reuse.
    let tid = tu["id"].as_str().unwrap();
    let live = v["usage"]["cache_creation_input_tokens"].as_u64().unwrap()
        + v["usage"]["output_tokens"].as_u64().unwrap();
    let body2 = json!({"max_tokens":20,"system":"Be brief.","tools":tools,"ds4_test_script":"Ok.</think>Done.",
        "messages":[{"role":"user","content":"List."},
            {"role":"assistant","content":[{"type":"thinking","thinking":"Need to list."},{"type":"text","text":"Sure."},
                {"type":"tool_use","id":tid,"name":"bash","input":{"command":"ls && pwd","timeout":10}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":tid,"content":"a.c"}]}]});
    let v2 = s.post_json("/v1/messages", &body2).await;
    assert_eq!(v2["usage"]["cache_read_input_tokens"], live, "{v2}");
    assert_eq!(v2["content"][1]["text"], "Done.");

    // An unknown tool_use_id is refused.
    let mut bad = body2.clone();
    bad["messages"][2]["content"][0]["tool_use_id"] = json!("toolu_nope");
    bad["messages"][1]["content"][2]["id"] = json!("toolu_other");
    let r = s.post("/v1/messages", &bad).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("tool_use_id toolu_nope"));

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let evs = sse_events(&s.post("/v1/messages", &sb).await.body);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    let starts: Vec<&str> = evs
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| d["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(starts, ["thinking", "text", "tool_use"]);
    let thinking: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thinking, "Need to list.");
    let json_parts: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(json_parts, r#"{"command":"ls && pwd","timeout":10}"#);
    for (i, (_, d)) in evs
        .iter()
        .filter(|(n, _)| n.starts_with("content_block"))
        .enumerate()
    {
        assert!(d["index"].as_u64().unwrap() <= 2, "{i}");
    }
    assert_eq!(evs[names.len() - 2].1["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn responses_json_and_lifecycle() {
    let s = server();
    let tools = json!([{"type":"function","name":"bash","parameters":{"type":"object"}}]);
    let body = json!({"model":"gpt-5","input":"List.","instructions":"Be brief.","tools":tools,
        "reasoning":{"effort":"high","summary":"auto"},"max_output_tokens":200,"ds4_test_script":TOOL_SCRIPT});
    let r = s.post("/v1/responses", &body).await;
    assert!(!r.body.ends_with('\n'));
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    let types: Vec<&str> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["reasoning", "message", "function_call"]);
    let fc = &v["output"][2];
    assert_eq!(fc["arguments"], r#"{"command":"ls && pwd","timeout":10}"#);
    assert!(fc["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(fc["id"].as_str().unwrap().starts_with("fc_"));
    assert_eq!(
        v["usage"]["input_tokens"],
        s.prompt_tokens("/v1/responses", &body)
    );

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let evs = sse_data(&s.post("/v1/responses", &sb).await.body);
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
        let keys: Vec<&String> = e.as_object().unwrap().keys().collect();
        assert_eq!(keys[..2], ["type", "sequence_number"]);
    }
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types[0], "response.created");
    assert_eq!(*types.last().unwrap(), "response.completed");
    assert!(types.contains(&"response.reasoning_summary_text.delta"));
    assert!(types.contains(&"response.function_call_arguments.done"));
    let text: String = evs
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Sure.");

    // Length limit: incomplete.
    let body = json!({"input":"x","max_output_tokens":3,"reasoning":{"effort":"none"}});
    let v = s.post_body("/v1/responses", &body).await;
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_tokens");
    // Unsupported state and tool choice.
    for (b, msg) in [
        (
            json!({"input":"x","previous_response_id":"resp_1"}),
            "previous_response_id is not supported",
        ),
        (
            json!({"input":"x","tool_choice":"required"}),
            "tool_choice=required not supported",
        ),
        (
            json!({"input":"x","tool_choice":{"type":"function"}}),
            "forced tool_choice not supported",
        ),
        (
            json!({"input":[{"type":"function_call_output","call_id":"call_x","output":"1"}]}),
            "call_id call_x",
        ),
    ] {
        let r = s.post("/v1/responses", &b).await;
        assert_eq!(r.status, 400, "{b}");
        assert!(r.body.contains(msg), "{}", r.body);
    }
}

#[tokio::test]
async fn bad_input_gets_the_error_body_and_the_next_request_is_served() {
    let s = server_with(4096, None);
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/chat/completions",
            b"{not json".to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            b"[1,2]".to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            br#"{"messages":"hi"}"#.to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            br#"{"messages":[],"stream":null}"#.to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            b"{\"messages\":[{\"content\":\"\xc3\x28\"}]}".to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            br#"{"model":"x"}"#.to_vec(),
            400,
            "missing messages",
        ),
        (
            "/v1/messages",
            br#"{"max_tokens":1}"#.to_vec(),
            400,
            "missing messages",
        ),
        (
            "/v1/completions",
            br#"{"prompt":5}"#.to_vec(),
            400,
            "invalid JSON request",
        ),
        (
            "/v1/chat/completions",
            vec![b' '; 5000],
            413,
            "request body larger than 4096 bytes (--max-body-bytes)",
        ),
    ];
    for (path, body, status, msg) in cases {
        let r = s.send("POST", path, &body).await;
        assert_eq!(
            r.status,
            status,
            "{path} {}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["message"], msg);
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // A prompt over the context: OpenAI and Anthropic shapes.
    let long = "word ".repeat(CTX);
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages":[{"role":"user","content":long}]}),
        )
        .await;
    assert_eq!(r.status, 400);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    assert_eq!(v["error"]["n_ctx"], CTX);
    let r = s
        .post(
            "/v1/messages",
            &json!({"max_tokens":1,"messages":[{"role":"user","content":long}]}),
        )
        .await;
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["type"], "error");
    assert!(v["error"]["n_prompt_tokens"].as_u64().unwrap() >= CTX as u64);
    // Unknown fields and any model name are ignored; the worker is healthy.
    let v = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model":"whatever","foo":{"bar":[1]},
            "messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ok","think":false}),
        )
        .await;
    assert_eq!(v["model"], "whatever");
    assert_eq!(v["choices"][0]["message"]["content"], "ok");
}

#[tokio::test]
async fn api_key_is_required_when_set() {
    let s = server_with(1 << 20, Some("sekrit"));
    assert_eq!(s.send("GET", "/v1/models", b"").await.status, 401);
    assert_eq!(s.send("GET", "/health", b"").await.status, 200);
    for (h, v) in [("authorization", "Bearer sekrit"), ("x-api-key", "sekrit")] {
        let r = warp::test::request()
            .method("GET")
            .path("/v1/models")
            .header(h, v)
            .reply(&routes::routes(s.state.clone()))
            .await;
        assert_eq!(r.status(), 200, "{h}");
    }
    let r = warp::test::request()
        .path("/v1/models")
        .header("authorization", "Bearer wrong")
        .reply(&routes::routes(s.state.clone()))
        .await;
    assert_eq!(r.status(), 401);
}

/// Random tiny-model output often ends tokens inside a UTF-8 character;
/// every endpoint must still send valid UTF-8 (checked by `send`) and JSON.
#[tokio::test]
async fn sampled_output_is_always_valid_utf8_json() {
    let s = server();
    for seed in 1..=4 {
        for (path, body) in [
            (
                "/v1/chat/completions",
                json!({"messages":[{"role":"user","content":"hi"}],"seed":seed,"max_tokens":40,"stream":true}),
            ),
            (
                "/v1/completions",
                json!({"prompt":"hi","seed":seed,"max_tokens":40,"think":false}),
            ),
            (
                "/v1/messages",
                json!({"max_tokens":40,"messages":[{"role":"user","content":"hi"}],"stream":true}),
            ),
            (
                "/v1/responses",
                json!({"input":"hi","max_output_tokens":40,"stream":true,"reasoning":{"summary":"auto"}}),
            ),
        ] {
            let r = s.post(path, &body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            if body["stream"] == json!(true) {
                for e in r.body.split("\n\n").filter(|e| !e.is_empty()) {
                    let d = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                    if d != "[DONE]" {
                        serde_json::from_str::<Value>(d).unwrap();
                    }
                }
            } else {
                serde_json::from_str::<Value>(&r.body).unwrap();
            }
        }
    }
}

#[tokio::test]
async fn eight_concurrent_clients_are_all_served() {
    let s = Arc::new(server());
    let mut handles = Vec::new();
    for i in 0..8 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let body = json!({"messages":[{"role":"user","content":format!("client {i}")}],
                "ds4_test_script":format!("answer {i}"),"think":false,"stream": i % 2 == 0});
            let r = s.post("/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200);
            if i % 2 == 0 {
                sse_data(&r.body)
                    .iter()
                    .filter_map(|c| {
                        c["choices"][0]["delta"]["content"]
                            .as_str()
                            .map(String::from)
                    })
                    .collect::<String>()
            } else {
                let v: Value = serde_json::from_str(&r.body).unwrap();
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string()
            }
        }));
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), format!("answer {i}"));
    }
    let m = s.send("GET", "/metrics", b"").await.body;
    assert!(m.contains("ds4_requests_total 8"), "{m}");
    assert!(m.contains("ds4_queue_depth 0"), "{m}");
}

/// SERVER.md §9.1: a Responses client that never sees the hidden reasoning
/// still continues from the live KV (visible transcript, or the tool-output
/// tail), and live-only state that vanished is a 409.
#[tokio::test]
async fn responses_tool_output_continues_the_live_session() {
    let s = server();
    let tools = json!([{"type":"function","name":"bash","parameters":{"type":"object"}}]);
    let first = json!({"input":"List.","tools":tools,"max_output_tokens":200,"ds4_test_script":TOOL_SCRIPT});
    let v = s.post_body("/v1/responses", &first).await;
    let live = v["usage"]["total_tokens"].as_u64().unwrap();
    let call = output_item(&v, "function_call");
    let msg = output_item(&v, "message");
    let cid = call["call_id"].as_str().unwrap();
    let out = json!({"type":"function_call_output","call_id":cid,"output":"a.c"});
    let user = json!({"role":"user","content":"List."});
    // (a) Full replay (message + call): the visible transcript matches.
    let b = json!({"input":[user, msg, call, out],"tools":tools,"max_output_tokens":5,"ds4_test_script":"k.</think>ok"});
    let v = s.post_body("/v1/responses", &b).await;
    assert_eq!(
        v["usage"]["input_tokens_details"]["cached_tokens"], live,
        "{v}"
    );
    // (b) The message item dropped: the tool-output tail is appended.
    let v = s.post_body("/v1/responses", &first).await;
    let live = v["usage"]["total_tokens"].as_u64().unwrap();
    let call = output_item(&v, "function_call");
    let cid = call["call_id"].as_str().unwrap().to_string();
    let out = json!({"type":"function_call_output","call_id":cid,"output":"a.c"});
    let b = json!({"input":[user, call, out],"tools":tools,"max_output_tokens":5,"ds4_test_script":"k.</think>ok"});
    let v = s.post_body("/v1/responses", &b).await;
    assert_eq!(
        v["usage"]["input_tokens_details"]["cached_tokens"], live,
        "{v}"
    );
    let tail =
        "<｜end▁of▁sentence｜><｜User｜><tool_result>a.c</tool_result><｜Assistant｜><think>";
    assert_eq!(
        v["usage"]["input_tokens_details"]["cache_write_tokens"],
        s.tok.encode_chat(tail).len()
    );
    // (c) Only the output (live-only id), then the live state is gone: 409.
    let v = s.post_body("/v1/responses", &first).await;
    let cid = output_item(&v, "function_call")["call_id"].clone();
    let only = json!({"input":[{"type":"function_call_output","call_id":cid,"output":"a.c"}],"tools":tools,
        "max_output_tokens":3,"ds4_test_script":"x"});
    assert_eq!(s.post("/v1/responses", &only).await.status, 200);
    let r = s.post("/v1/responses", &only).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r
        .body
        .contains("Responses continuation state is not available"));
}

/// SERVER.md §9.2: Anthropic tool results continue live even when the
/// client drops the thinking block.
#[tokio::test]
async fn anthropic_tool_results_continue_without_thinking_replay() {
    let s = server();
    let tools = json!([{"name":"bash","input_schema":{"type":"object"}}]);
    let body = json!({"max_tokens":200,"tools":tools,"messages":[{"role":"user","content":"List."}],"ds4_test_script":TOOL_SCRIPT});
    let v = s.post_json("/v1/messages", &body).await;
    let live = v["usage"]["cache_creation_input_tokens"].as_u64().unwrap()
        + v["usage"]["output_tokens"].as_u64().unwrap();
    let tu = v["content"][2].clone();
    let b2 = json!({"max_tokens":5,"tools":tools,"ds4_test_script":"k.</think>ok","messages":[
        {"role":"user","content":"List."},
        {"role":"assistant","content":[{"type":"text","text":"Sure."},tu]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":tu["id"],"content":"a.c"}]}]});
    let v2 = s.post_json("/v1/messages", &b2).await;
    assert_eq!(v2["usage"]["cache_read_input_tokens"], live, "{v2}");
    assert_eq!(
        v2["usage"]["cache_creation_input_tokens"],
        s.tok.encode_chat("<｜end▁of▁sentence｜><｜User｜><tool_result>a.c</tool_result><｜Assistant｜><think>").len()
    );
}

use ds4::kvcache::ToolIds;

/// A stand-in disk cache: counts the worker's calls and, on `resume`,
/// "loads" the first 4 tokens of the prompt (by evaluating them).
struct FakeCache(Arc<std::sync::Mutex<Vec<&'static str>>>);

impl job::KvCacheHook for FakeCache {
    fn resume(
        &mut self,
        sess: &mut Session,
        tok: &Tokenizer,
        rendered: &str,
        _visible: Option<(&[u8], job::VisibleKind)>,
        _tools: &dyn ToolIds,
    ) -> Option<job::DiskResumed> {
        self.0.lock().unwrap().push("resume");
        let full = tok.encode_chat(rendered);
        sess.sync(&full[..4], &mut |_, _| {}).ok()?;
        Some(job::DiskResumed {
            effective: full,
            cached: 4,
            tool_map: Vec::new(),
        })
    }
    fn prefill(
        &mut self,
        sess: &mut Session,
        _tok: &Tokenizer,
        prompt: &[u32],
        _cached: usize,
        progress: &mut dyn FnMut(usize, usize),
        _tools: &dyn ToolIds,
    ) -> Result<ds4::session::SyncStats, ds4::SessionError> {
        self.0.lock().unwrap().push("prefill");
        sess.sync(prompt, progress)
    }
    fn before_decode(&mut self, _sess: &Session, _tok: &Tokenizer, _tools: &dyn ToolIds) {
        self.0.lock().unwrap().push("decode");
    }
    fn shutdown(
        &mut self,
        _sess: &Session,
        _tok: &Tokenizer,
        _visible: Option<(&[u8], job::VisibleKind)>,
        _tools: &dyn ToolIds,
    ) {
        self.0.lock().unwrap().push("shutdown");
    }
}

#[tokio::test]
async fn the_disk_cache_hook_is_called_at_its_moments() {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = server_hooked(1 << 20, None, Box::new(FakeCache(calls.clone())));
    let body = json!({"model":"deepseek-chat","messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ab"});
    let v = s.post_json("/v1/chat/completions", &body).await;
    // Rule 7 on an empty session: the hook's hit is reported as cached.
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    let n_gen = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let state = s.state.clone();
    tokio::task::spawn_blocking(move || state.queue.shutdown())
        .await
        .unwrap();
    let c = calls.lock().unwrap().clone();
    let mut expect = vec!["resume", "prefill"];
    // One before-step call per pick: the generated tokens and the EOS.
    expect.extend(std::iter::repeat_n("decode", n_gen + 1));
    expect.push("shutdown");
    assert_eq!(c, expect);
}
