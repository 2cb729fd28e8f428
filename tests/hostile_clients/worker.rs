//! The worker thread under unlucky clients (issue 25 items 1-3): a history
//! resent with a character that the last reply had cut in half, a job that
//! panics, and a server whose stderr and stdout readers went away. In every
//! case the next request must be served.

use ds4::server::plan::{plan_live, Live, LivePlan};
use ds4::server::render;
use ds4::server::request::{self, ParseContext};
use ds4::testmodel::Variant;
use ds4::Tokenizer;
use serde_json::{json, Value};

use super::common::{self, server};

const APIS: [&str; 4] = ["chat", "completions", "responses", "messages"];

/// The endpoints that resend a history. Completions wraps its prompt in the
/// chat template, so a resent prompt never extends the live text there; it
/// is still sent the same two requests.
const HISTORY_APIS: [&str; 3] = ["chat", "responses", "messages"];

/// Candidate replies with multi-byte characters; some of their tokens end
/// inside a character.
const SCRIPTS: [&str; 8] = [
    "Voilà 😀🎉 fini",
    "ok 🎉🎉 done",
    "שלום כיתה אלף",
    "你好，世界。今天天气很好",
    "Привет 😀, мир",
    "a😀b🎉c",
    "🙂🙃😉",
    "é😀 è🎉",
];

/// Ways a client may resend a reply that `k` tokens cut inside a
/// character: that character completed as the script has it, or completed
/// into another character with the same leading bytes (a client repairing
/// the text its own way).
fn completions(tok: &Tokenizer, script: &str, k: usize) -> Vec<String> {
    let cut = tok.decode(&tok.encode_chat(script)[..k]).len();
    let start = (0..=cut)
        .rev()
        .find(|&i| script.is_char_boundary(i))
        .unwrap();
    let end = (cut..=script.len())
        .find(|&i| script.is_char_boundary(i))
        .unwrap();
    let lead = &script.as_bytes()[start..cut];
    let mut out = vec![script[..end].to_string()];
    for c in [
        '😀', '🎉', '🙂', '🙃', '😉', '🚀', '中', '文', '界', 'é', 'è', 'כ', 'י', 'ש', 'П', 'р',
    ] {
        let mut b = [0u8; 4];
        if c.encode_utf8(&mut b).as_bytes().starts_with(lead) {
            out.push(format!("{}{c}", &script[..start]));
        }
    }
    out
}

/// (prompt tokens, cached tokens, completion tokens, visible text) of a
/// JSON reply.
fn usage_and_text(api: &str, v: &Value) -> (u64, u64, u64, String) {
    let n = |x: &Value| x.as_u64().unwrap_or_else(|| panic!("no count in {v}"));
    let u = &v["usage"];
    match api {
        "chat" | "completions" => (
            n(&u["prompt_tokens"]),
            n(&u["prompt_tokens_details"]["cached_tokens"]),
            n(&u["completion_tokens"]),
            if api == "chat" {
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .into()
            } else {
                v["choices"][0]["text"].as_str().unwrap().into()
            },
        ),
        "responses" => (
            n(&u["input_tokens"]),
            n(&u["input_tokens_details"]["cached_tokens"]),
            n(&u["output_tokens"]),
            v["output"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|o| o["type"] == "message")
                .flat_map(|o| o["content"].as_array().unwrap().iter())
                .filter_map(|c| c["text"].as_str())
                .collect(),
        ),
        "messages" => (
            n(&u["input_tokens"])
                + n(&u["cache_read_input_tokens"])
                + n(&u["cache_creation_input_tokens"]),
            n(&u["cache_read_input_tokens"]),
            n(&u["output_tokens"]),
            v["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c["text"].as_str())
                .collect(),
        ),
        _ => unreachable!(),
    }
}

/// The first request (reply cut inside a character) and the second (the
/// history resent with that character completed and a new user turn) of
/// one endpoint, with thinking off.
fn two_requests(api: &str, script: &str, k: usize, done: &str) -> (&'static str, Value, Value) {
    let (p, q) = ("Say hello in three words.", "And now in two?");
    let turn = |m: Value| match api {
        "chat" => (
            "/v1/chat/completions",
            json!({"model":"deepseek-chat","messages":m,"max_tokens":k,"temperature":0,
                   "ds4_test_script":script}),
        ),
        "responses" => (
            "/v1/responses",
            json!({"model":"deepseek-chat","input":m,"max_output_tokens":k,"temperature":0,
                   "ds4_test_script":script}),
        ),
        "messages" => (
            "/v1/messages",
            json!({"model":"deepseek-chat","thinking":{"type":"disabled"},"messages":m,
                   "max_tokens":k,"temperature":0,"ds4_test_script":script}),
        ),
        _ => unreachable!(),
    };
    if api == "completions" {
        let req = |prompt: String| {
            json!({"model":"deepseek-chat","prompt":prompt,"max_tokens":k,"temperature":0,
                   "ds4_test_script":script})
        };
        return (
            "/v1/completions",
            req(p.to_string()),
            req(format!("{p}{done} {q}")),
        );
    }
    let first = json!([{"role":"user","content":p}]);
    let second = json!([{"role":"user","content":p},{"role":"assistant","content":done},
                        {"role":"user","content":q}]);
    let (path, a) = turn(first);
    let (_, b) = turn(second);
    (path, a, b)
}

/// The rendered prompt of a request body, as the server renders it.
fn rendered(api: &str, body: &Value) -> String {
    let pc = ParseContext {
        ctx: server::CTX,
        allow_script: true,
    };
    let b = body.to_string();
    let req = match api {
        "chat" => request::parse_chat(b.as_bytes(), pc),
        "completions" => request::parse_completions(b.as_bytes(), pc),
        "responses" => request::parse_responses(b.as_bytes(), pc),
        _ => request::parse_messages(b.as_bytes(), pc),
    }
    .unwrap();
    render::render(&req, &mut render::NoReplay)
}

/// Whether the two requests reach the crash of issue 25 on the old planner:
/// the live tokens (first prompt and the cut reply) decode to a byte prefix
/// of the second prompt that ends inside a character, and the second
/// prompt's own tokens do not start with them (so the token rule does not
/// apply first).
fn reaches_the_split(tok: &Tokenizer, api: &str, script: &str, k: usize, done: &str) -> bool {
    let (_, first, second) = two_requests(api, script, k, done);
    let mut live = tok.encode_chat(&rendered(api, &first));
    live.extend_from_slice(&tok.encode_chat(script)[..k]);
    let decoded = tok.decode(&live);
    let text = rendered(api, &second);
    text.as_bytes().starts_with(&decoded)
        && !text.is_char_boundary(decoded.len())
        && !tok.encode_chat(&text).starts_with(&live)
}

/// A (script, k, resent reply) that reaches the split on every endpoint
/// that resends a history.
fn byte_split_case(tok: &Tokenizer) -> (String, usize, String) {
    for s in SCRIPTS {
        let n = tok.encode_chat(s).len();
        for k in 1..n {
            for done in completions(tok, s, k) {
                if HISTORY_APIS
                    .iter()
                    .all(|api| reaches_the_split(tok, api, s, k, &done))
                {
                    return (s.to_string(), k, done);
                }
            }
        }
    }
    panic!("no candidate reply reaches the character split on every endpoint");
}

/// Issue 25 item 1: the live-reuse plan sliced the rendered text inside a
/// character and the worker died; every later request got 503. Now the
/// second request is planned cold (nothing cached) and served.
#[test]
fn a_history_resent_with_a_completed_character_is_served_on_every_endpoint() {
    let tok = Tokenizer::from_gguf(&common::tiny_model(Variant::Q8).file).unwrap();
    let (script, k, done) = byte_split_case(&tok);
    let s = server::start(&[]);
    for api in APIS {
        let (path, first, second) = two_requests(api, &script, k, &done);
        let r = server::post(&s.addr, path, &first);
        assert_eq!(server::status(&r), 200, "{api} first: {r}");
        let (_, _, out, text) = usage_and_text(api, &server::json_body(&r));
        assert_eq!(out, k as u64, "{api}: {r}");
        // The reply really ends inside a character (shown as U+FFFD), and
        // it is visible text: thinking is off.
        assert!(text.ends_with('\u{fffd}'), "{api}: {text:?}");
        let r = server::post(&s.addr, path, &second);
        assert_eq!(server::status(&r), 200, "{api} second: {r}");
        let (prompt, cached, out, _) = usage_and_text(api, &server::json_body(&r));
        let want = tok.encode_chat(&rendered(api, &second)).len() as u64;
        assert_eq!((prompt, cached, out), (want, 0, k as u64), "{api}: {r}");
    }
    let r = server::get(&s.addr, "/health");
    assert_eq!(server::status(&r), 200, "{r}");
    let r = server::post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[{"role":"user","content":"x"}],"think":false,"ds4_test_script":"still here"}),
    );
    assert_eq!(server::status(&r), 200, "{r}");
    assert_eq!(
        server::json_body(&r)["choices"][0]["message"]["content"],
        "still here"
    );
}

/// The planner on real token histories: texts of multi-byte characters,
/// their tokens cut at every length. A cut inside a character plans cold,
/// any other cut reuses the live tokens, and the planned prompt decodes to
/// the request's text.
#[test]
fn the_reuse_planner_on_token_histories_that_split_characters() {
    let tok = Tokenizer::from_gguf(&common::tiny_model(Variant::Q8).file).unwrap();
    let mut rng = ds4::sampler::Rng::new(25);
    let pieces = SCRIPTS;
    let (mut cold, mut reused) = (0, 0);
    for _ in 0..300 {
        let n = 1 + (rng.next_u64() % 8) as usize;
        let pick =
            |rng: &mut ds4::sampler::Rng| pieces[(rng.next_u64() % pieces.len() as u64) as usize];
        let history: String = (0..n).map(|_| pick(&mut rng)).collect();
        let ids = tok.encode_chat(&history);
        let k = 1 + (rng.next_u64() % ids.len() as u64) as usize;
        let live_ids = &ids[..k];
        let decoded = tok.decode(live_ids);
        let text = format!("{history}{}", pick(&mut rng));
        let live = Live {
            tokens: live_ids,
            thinking_visible: None,
        };
        // Half the time the request's own tokens are withheld, so the
        // text rules decide (as when re-tokenizing changed the tokens).
        let full = if rng.next_u64() % 2 == 0 {
            tok.encode_chat(&text)
        } else {
            Vec::new()
        };
        match plan_live(&live, &text, &full, || decoded.clone()) {
            LivePlan::Append { from, .. } => {
                reused += 1;
                assert!(std::str::from_utf8(&decoded).is_ok(), "{text:?} k={k}");
                let mut eff = live_ids.to_vec();
                eff.extend(tok.encode_chat(&text[from..]));
                assert_eq!(tok.decode(&eff), text.as_bytes());
            }
            LivePlan::Tokens => {
                reused += 1;
                assert!(full.starts_with(live_ids));
            }
            LivePlan::Cold => {
                cold += 1;
                assert!(
                    std::str::from_utf8(&decoded).is_err(),
                    "a whole-character prefix went cold: {text:?} k={k}"
                );
            }
        }
    }
    // Both outcomes were exercised.
    assert!(cold > 0 && reused > 0, "cold={cold} reused={reused}");
}

fn chat(content_turns: &[(&str, &str)], script: &str, stream: bool) -> Value {
    let messages: Vec<Value> = content_turns
        .iter()
        .map(|(role, c)| json!({"role": role, "content": c}))
        .collect();
    json!({"messages": messages, "think": false, "stream": stream, "ds4_test_script": script})
}

fn cached_tokens(resp: &str) -> u64 {
    server::json_body(resp)["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens: {resp}"))
}

/// Issue 25 item 2: a job that panics fails alone (500, or an error event
/// once streaming), its session is reset, the next job is served, and
/// `/health` shows the panic.
#[test]
fn a_panicking_job_fails_alone_and_health_reports_it() {
    const MARKER: &str = "PANIC-IN-THE-WORKER";
    let s = server::start(&["--debug-panic-on-prompt", MARKER]);
    let path = "/v1/chat/completions";
    let a = [("user", "hello")];
    let b = [("user", "hello"), ("assistant", "hi"), ("user", "more")];
    // Control: without a panic the second turn reuses the live session.
    assert_eq!(
        server::status(&server::post(&s.addr, path, &chat(&a, "hi", false))),
        200
    );
    let r = server::post(&s.addr, path, &chat(&b, "ok", false));
    assert_eq!(server::status(&r), 200, "{r}");
    assert!(cached_tokens(&r) > 0, "{r}");

    assert_eq!(
        server::status(&server::post(&s.addr, path, &chat(&a, "hi", false))),
        200
    );
    let p = [("user", "hello"), ("assistant", "hi"), ("user", MARKER)];
    let r = server::post(&s.addr, path, &chat(&p, "never", false));
    assert_eq!(server::status(&r), 500, "{r}");
    assert!(
        r.contains("internal error") && r.contains("debug panic"),
        "{r}"
    );
    // The session was reset: the same second turn now reuses nothing.
    let r = server::post(&s.addr, path, &chat(&b, "ok", false));
    assert_eq!(server::status(&r), 200, "{r}");
    assert_eq!(cached_tokens(&r), 0, "{r}");
    assert_eq!(
        server::json_body(&r)["choices"][0]["message"]["content"],
        "ok"
    );

    // Streaming: the stream had started, so the failure is an error event.
    let r = server::post(&s.addr, path, &chat(&[("user", MARKER)], "never", true));
    assert_eq!(server::status(&r), 200, "{r}");
    assert!(
        r.contains("event: error") && r.contains("debug panic"),
        "{r}"
    );

    let r = server::post(&s.addr, path, &chat(&a, "served", false));
    assert_eq!(server::status(&r), 200, "{r}");
    assert_eq!(
        server::json_body(&r)["choices"][0]["message"]["content"],
        "served"
    );
    let h = server::get(&s.addr, "/health");
    assert_eq!(server::status(&h), 200, "{h}");
    let v = server::json_body(&h);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["worker"]["alive"], true, "{v}");
    assert_eq!(v["worker"]["panics"], 2, "{v}");
    let last = &v["worker"]["last_panic"];
    assert!(last["message"].as_str().unwrap().contains(MARKER), "{v}");
    assert!(last["time"].as_str().unwrap().ends_with(" UTC"), "{v}");
}

/// Issue 25 item 3: `ds4-server 2>&1 | head` killed the server with SIGPIPE
/// at its first log line. Here stdout and stderr go into a pipe whose
/// reader is gone before the server starts; it must start and serve.
#[test]
fn a_server_whose_log_reader_left_keeps_serving() {
    let port = server::free_port();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = server::command(&[], port)
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    server::wait_ready(&mut child, &addr);
    let s = server::Server::adopt(child, addr);
    for i in 0..3 {
        let want = format!("line {i}");
        let r = server::post(
            &s.addr,
            "/v1/chat/completions",
            &chat(&[("user", "log me")], &want, false),
        );
        assert_eq!(server::status(&r), 200, "{r}");
        assert_eq!(
            server::json_body(&r)["choices"][0]["message"]["content"],
            want.as_str()
        );
    }
    let mut s = s;
    assert!(s.child.try_wait().unwrap().is_none(), "the server exited");
    assert_eq!(server::status(&server::get(&s.addr, "/health")), 200);
}

/// `/health` is 503 once the worker thread is gone (here: after shutdown),
/// so a supervisor restarts a server whose engine no longer runs.
#[test]
fn health_is_503_when_the_worker_thread_is_gone() {
    use ds4::server::job;
    use ds4::server::metrics::Metrics;
    use ds4::server::worker::{self, WorkerConfig};
    use ds4::session::{Session, SessionOptions};
    use std::sync::Arc;

    let model = common::tiny_model(Variant::Q8);
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    let opts = SessionOptions {
        ctx: 256,
        ..SessionOptions::default()
    };
    let sess = Session::new(model, opts).unwrap();
    let cfg = WorkerConfig {
        queued_scripts: Vec::new(),
        trace: None,
        default_tokens: 8,
        exact_replay: true,
        tool_memory_max_ids: 100,
        debug_panic_on_prompt: None,
    };
    let metrics = Arc::new(Metrics::default());
    let q = worker::start(sess, tok, cfg, metrics, 4, Box::new(job::NoCache), None);
    let (status, body) = q.health().report();
    assert_eq!(
        (status, body["worker"]["alive"].clone()),
        (200, json!(true))
    );
    q.shutdown();
    // The thread marks itself dead as it ends; give it a bounded moment.
    let t0 = std::time::Instant::now();
    while q.health().alive() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (status, body) = q.health().report();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["worker"]["alive"], false);
}
