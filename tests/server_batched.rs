//! `ds4-server --batched-session N` on the tiny model (issue 18 items 1 and
//! 5): concurrent streaming clients on every endpoint each get exactly the
//! stream the same request gets when served alone; a client that leaves
//! frees its slot and changes no other stream; a prompt over `--ctx` is
//! refused while every slot is busy; requests beyond N wait in the queue;
//! a slot whose prefill fails errors to its own client only; `/metrics`
//! shows slots, queue and batch sizes. Every server is killed when its test
//! ends.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::server::{get, json_body, post, start, status, Server};

/// The SSE body of a streamed POST, de-chunked.
fn stream(addr: &str, path: &str, body: &Value) -> String {
    let resp = post(addr, path, body);
    assert_eq!(status(&resp), 200, "{resp}");
    dechunk(&resp[resp.find("\r\n\r\n").unwrap() + 4..])
}

/// Undoes HTTP/1.1 chunked transfer encoding.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some(i) = s.find("\r\n") {
        let n = usize::from_str_radix(s[..i].trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&s[i + 2..i + 2 + n]);
        s = &s[i + 2 + n + 2..];
    }
    out
}

/// What legitimately differs between two runs, removed: ids (minted per
/// request), timestamps.
fn scrub(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| {
                !(k == "id"
                    || k.ends_with("_id")
                    || k.starts_with("created")
                    || k == "system_fingerprint")
            });
            m.values_mut().for_each(scrub);
        }
        Value::Array(a) => a.iter_mut().for_each(scrub),
        _ => {}
    }
}

/// The events of an SSE body with what legitimately differs between two
/// runs removed: ids (minted per request), timestamps, keep-alive comments.
fn events(sse: &str) -> Vec<Value> {
    sse.split("\n\n")
        .filter_map(|e| {
            let mut name = Value::Null;
            let mut data = Value::Null;
            for l in e.lines() {
                if let Some(n) = l.strip_prefix("event: ") {
                    name = json!(n);
                } else if let Some(d) = l.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| json!(d));
                    scrub(&mut data);
                }
            }
            (!(name.is_null() && data.is_null())).then(|| json!([name, data]))
        })
        .collect()
}

fn metric(addr: &str, name: &str) -> u64 {
    let m = get(addr, "/metrics");
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in {m}"))
        .trim()
        .parse::<f64>()
        .unwrap() as u64
}

/// Polls `cond` every 20 ms for at most 20 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A streaming request whose reader can stop at any time.
struct Open {
    conn: TcpStream,
    got: Vec<u8>,
}

impl Open {
    fn post(addr: &str, path: &str, body: &Value) -> Open {
        let b = body.to_string();
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(
            conn,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        Open {
            conn,
            got: Vec::new(),
        }
    }

    /// Reads until the response holds `needle`.
    fn until(&mut self, needle: &str) {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&self.got).contains(needle) {
            let n = self.conn.read(&mut buf).unwrap();
            assert!(n > 0, "closed before {needle:?}");
            self.got.extend_from_slice(&buf[..n]);
        }
    }

    /// The whole SSE body.
    fn finish(mut self) -> String {
        self.conn.read_to_end(&mut self.got).unwrap();
        let r = String::from_utf8(self.got).unwrap();
        assert_eq!(status(&r), 200, "{r}");
        dechunk(&r[r.find("\r\n\r\n").unwrap() + 4..])
    }
}

const TOOL_SCRIPT: &str = "Need to list.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn bash_tool() -> Value {
    json!([{"type":"function","function":{"name":"bash","description":"Run a shell command.",
        "parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}])
}

fn chat(text: &str, seed: u64, max: u64) -> (&'static str, Value) {
    (
        "/v1/chat/completions",
        json!({"messages":[{"role":"user","content":text}],"stream":true,
               "stream_options":{"include_usage":true},"think":false,
               "seed":seed,"temperature":1.0,"max_tokens":max}),
    )
}

/// Eight requests over the four endpoints: sampled with a fixed seed
/// (every logit bit moves the draw) or greedy (thinking off: a thinking
/// request samples with the official values and, without a seed, a
/// per-request draw), short and long prompts (the
/// long ones take several prefill quanta), one with a scripted tool call
/// and one sampled with tools in the prompt.
fn eight_requests() -> Vec<(&'static str, Value)> {
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(30);
    vec![
        chat("Write a haiku about rust.", 7, 48),
        chat(&format!("{long}Summarise."), 11, 40),
        (
            "/v1/completions",
            json!({"prompt":"Once upon a time","stream":true,"think":false,"seed":3,"temperature":1.0,"max_tokens":48}),
        ),
        (
            "/v1/completions",
            json!({"prompt":long,"stream":true,"think":false,"temperature":0,"max_tokens":40}),
        ),
        (
            "/v1/responses",
            json!({"input":"Tell me a story.","stream":true,"temperature":0,"max_output_tokens":40,"reasoning":{"effort":"none"}}),
        ),
        (
            "/v1/messages",
            json!({"model":"deepseek-v4-flash","max_tokens":40,"stream":true,"temperature":0,
                   "thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Hello!"}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"List the files."}],"tools":bash_tool(),
                   "stream":true,"ds4_test_script":TOOL_SCRIPT}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"Use a tool if you like."}],"tools":bash_tool(),
                   "stream":true,"think":false,"seed":5,"temperature":1.0,"max_tokens":40}),
        ),
    ]
}

/// Runs `reqs` at once (released together) and returns their SSE bodies.
fn together(s: &Server, reqs: &[(&'static str, Value)]) -> Vec<String> {
    let go = Arc::new(Barrier::new(reqs.len()));
    let handles: Vec<_> = reqs
        .iter()
        .cloned()
        .map(|(path, body)| {
            let (addr, go) = (s.addr.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                stream(&addr, path, &body)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn eight_concurrent_streams_equal_each_served_alone() {
    let s = start(&["--batched-session", "8", "--mixed-prefill-quantum", "32"]);
    assert!(
        s.stderr_text().contains("8 KV slots ×"),
        "{}",
        s.stderr_text()
    );
    let reqs = eight_requests();
    let alone: Vec<String> = reqs.iter().map(|(p, b)| stream(&s.addr, p, b)).collect();
    for (i, a) in alone.iter().enumerate() {
        let ev = events(a);
        assert!(ev.len() > 5, "request {i} streamed too little: {a}");
    }
    // The scripted tool call streamed as a call.
    assert!(alone[6].contains("\"name\":\"bash\""), "{}", alone[6]);
    assert!(alone[6].contains("tool_calls"), "{}", alone[6]);
    let steps_before = metric(&s.addr, "ds4_batch_steps_total");
    let both = together(&s, &reqs);
    for (i, (a, b)) in alone.iter().zip(&both).enumerate() {
        assert_eq!(
            events(a),
            events(b),
            "request {i} ({}) differs when batched",
            reqs[i].0
        );
    }
    // They really ran together, in fewer steps than one after another.
    assert!(metric(&s.addr, "ds4_batch_max_step_slots") >= 4);
    let steps = metric(&s.addr, "ds4_batch_steps_total") - steps_before;
    assert!(
        steps < steps_before,
        "{steps} steps batched, {steps_before} alone"
    );
    assert_eq!(metric(&s.addr, "ds4_slots"), 8);
    assert_eq!(metric(&s.addr, "ds4_active_slots"), 0);
    assert_eq!(metric(&s.addr, "ds4_queue_depth"), 0);
}

#[test]
fn a_client_that_leaves_frees_its_slot_and_changes_no_other_stream() {
    let s = start(&["--batched-session", "3", "--mixed-prefill-quantum", "16"]);
    let a = chat("First stream.", 21, 120);
    let b = chat("Second stream, a little longer.", 22, 120);
    let alone = [stream(&s.addr, a.0, &a.1), stream(&s.addr, b.0, &b.1)];
    let generated_alone = metric(&s.addr, "ds4_generated_tokens_total");
    let mut leaver = Open::post(
        &s.addr,
        "/v1/chat/completions",
        &chat("Leave soon.", 23, 1500).1,
    );
    let (ra, rb) = (
        Open::post(&s.addr, a.0, &a.1),
        Open::post(&s.addr, b.0, &b.1),
    );
    leaver.until("\"content\"");
    drop(leaver);
    assert_eq!(events(&ra.finish()), events(&alone[0]));
    assert_eq!(events(&rb.finish()), events(&alone[1]));
    wait_for("the slot freed", || {
        metric(&s.addr, "ds4_active_slots") == 0
    });
    assert_eq!(metric(&s.addr, "ds4_cancelled_total"), 1);
    let left = metric(&s.addr, "ds4_generated_tokens_total") - 2 * generated_alone;
    assert!(left < 1500, "the cancelled stream generated {left} tokens");
}

/// Sessions that end early — a stop sequence, a full context — leave the
/// streams beside them bit-identical: three streams (one plain, one whose
/// context fills, one cut by a stop string) run together and each equals
/// the same request served alone.
#[test]
fn sessions_that_end_early_change_no_other_stream() {
    let s = start(&[
        "--batched-session",
        "3",
        "--ctx",
        "256",
        "--mixed-prefill-quantum",
        "16",
    ]);
    let plain = chat("A plain stream.", 51, 60);
    let mut fill = chat(&"word ".repeat(150), 52, 400);
    fill.1["max_tokens"] = json!(400);
    let mut stop = chat("Stop at the first e.", 53, 100);
    stop.1["stop"] = json!(["e"]);
    let reqs = vec![plain, fill, stop];
    let alone: Vec<String> = reqs.iter().map(|(p, b)| stream(&s.addr, p, b)).collect();
    assert!(
        alone[0].contains("\"finish_reason\":\"length\""),
        "{}",
        alone[0]
    );
    assert!(
        alone[1].contains("\"finish_reason\":\"length\""),
        "{}",
        alone[1]
    );
    assert!(
        alone[2].contains("\"finish_reason\":\"stop\""),
        "{}",
        alone[2]
    );
    let both = together(&s, &reqs);
    for (i, (a, b)) in alone.iter().zip(&both).enumerate() {
        assert_eq!(events(a), events(b), "request {i} differs when batched");
    }
    assert_eq!(metric(&s.addr, "ds4_active_slots"), 0);
}

/// A session cut by a stop string and one whose context fills free their
/// slot at once: with two slots, one held by a long stream, they and a
/// queued request all go through the other slot and finish while the long
/// stream is still running.
#[test]
fn sessions_that_end_early_free_their_slot_at_once() {
    let s = start(&[
        "--batched-session",
        "2",
        "--ctx",
        "512",
        "--mixed-prefill-quantum",
        "16",
    ]);
    let mut long = Open::post(
        &s.addr,
        "/v1/chat/completions",
        &chat("Keep going for a long time.", 61, 480).1,
    );
    long.until("\"content\"");
    let (p, mut stop) = chat("Stop at the first e.", 62, 200);
    stop["stop"] = json!(["e"]);
    let r = stream(&s.addr, p, &stop);
    assert!(r.contains("\"finish_reason\":\"stop\""), "{r}");
    let (p, fill) = chat(&"word ".repeat(440), 63, 400);
    let r = stream(&s.addr, p, &fill);
    assert!(r.contains("\"finish_reason\":\"length\""), "{r}");
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[{"role":"user","content":"x"}],"ds4_test_script":"next answer","think":false}),
    );
    assert_eq!(status(&r), 200, "{r}");
    assert!(r.contains("next answer"), "{r}");
    // All three went through the second slot while the long stream runs
    // (the gauge is updated after each step: poll for it).
    wait_for("one slot active: the long stream", || {
        metric(&s.addr, "ds4_active_slots") == 1
    });
    drop(long);
    wait_for("the long stream's slot freed", || {
        metric(&s.addr, "ds4_active_slots") == 0
    });
}

#[test]
fn over_context_is_refused_while_slots_are_busy_and_the_rest_queue() {
    let s = start(&["--batched-session", "2", "--ctx", "512"]);
    let busy: Vec<Open> = (0..2)
        .map(|i| {
            Open::post(
                &s.addr,
                "/v1/chat/completions",
                &chat("Keep going.", 30 + i, 480).1,
            )
        })
        .collect();
    let mut busy = busy;
    for o in &mut busy {
        o.until("\"content\"");
    }
    assert_eq!(metric(&s.addr, "ds4_active_slots"), 2);
    // ~700 tokens: under the byte bound (512 × 128), over the context.
    let big = json!({"messages":[{"role":"user","content":"word ".repeat(700)}],"max_tokens":4});
    let t = Instant::now();
    let r = post(&s.addr, "/v1/chat/completions", &big);
    assert_eq!(status(&r), 400, "{r}");
    assert!(r.contains("context"), "{r}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(metric(&s.addr, "ds4_active_slots"), 2);
    // A third request waits in the queue until a slot frees.
    let addr = s.addr.clone();
    let third = std::thread::spawn(move || {
        post(
            &addr,
            "/v1/chat/completions",
            &json!({"messages":[{"role":"user","content":"x"}],"ds4_test_script":"queued answer","think":false}),
        )
    });
    wait_for("the third request queued", || {
        metric(&s.addr, "ds4_queue_depth") == 1
    });
    drop(busy);
    let r = third.join().unwrap();
    assert_eq!(status(&r), 200, "{r}");
    assert!(r.contains("queued answer"), "{r}");
}

/// A prefill whose engine step fails, and a job that panics, end with an
/// error for their own clients; the streams decoding beside them (whose
/// slots the failed step reset) are rebuilt and stay bit-identical.
#[test]
fn a_failed_prefill_errors_to_its_client_only() {
    let s = start(&[
        "--batched-session",
        "3",
        "--mixed-prefill-quantum",
        "8",
        "--debug-fail-prefill-on-prompt",
        "POISON",
        "--debug-panic-on-prompt",
        "KABOOM",
    ]);
    let a = chat("Stream one.", 41, 160);
    let b = chat("Stream two.", 42, 160);
    let alone = [stream(&s.addr, a.0, &a.1), stream(&s.addr, b.0, &b.1)];
    let (mut ra, mut rb) = (
        Open::post(&s.addr, a.0, &a.1),
        Open::post(&s.addr, b.0, &b.1),
    );
    ra.until("\"content\"");
    rb.until("\"content\"");
    let p = json!({"messages":[{"role":"user","content":format!("POISON {}", "pad ".repeat(40))}],"max_tokens":8,"think":false});
    let r = post(&s.addr, "/v1/chat/completions", &p);
    assert_ne!(status(&r), 200, "{r}");
    assert!(r.contains("injected prefill failure"), "{r}");
    // A job that panics fails alone too.
    let k = json!({"messages":[{"role":"user","content":"KABOOM"}],"max_tokens":8,"think":false});
    let r = post(&s.addr, "/v1/chat/completions", &k);
    assert_eq!(status(&r), 500, "{r}");
    assert_eq!(events(&ra.finish()), events(&alone[0]));
    assert_eq!(events(&rb.finish()), events(&alone[1]));
    assert!(
        s.stderr_text().contains("retrying its slots one by one"),
        "{}",
        s.stderr_text()
    );
    let h = get(&s.addr, "/health");
    assert_eq!(status(&h), 200, "{h}");
    assert!(h.contains("\"panics\":1"), "{h}");
}

/// A long prompt arriving while another session streams is prefilled in
/// quanta between that session's decode steps: the stream goes on during
/// the prefill and is unchanged by it.
#[test]
fn a_long_prefill_is_cut_into_quanta_between_decode_steps() {
    let s = start(&["--batched-session", "2", "--mixed-prefill-quantum", "16"]);
    let a = chat("Keep streaming.", 61, 200);
    let alone = stream(&s.addr, a.0, &a.1);
    let mut ra = Open::post(&s.addr, a.0, &a.1);
    ra.until("\"content\"");
    let long = "word ".repeat(600);
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[{"role":"user","content":long}],"think":false,"ds4_test_script":"ok"}),
    );
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(events(&ra.finish()), events(&alone));
    // ~600 prompt tokens in pieces of 16: the steps that carried them also
    // carried the stream's decode rows (unless it had ended by then).
    let mixed = metric(&s.addr, "ds4_batch_mixed_steps_total");
    assert!(mixed >= 20, "{mixed} mixed steps");
}

/// The disk KV cache per slot: two sessions prefilled side by side store
/// their own checkpoints (their pieces cut at the save points); after a
/// restart each request loads its own prefix from disk and answers exactly
/// as before.
#[test]
fn the_disk_cache_saves_and_resumes_per_slot() {
    let dir = common::server::temp_path("kvdir");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap().to_string();
    let lock = common::server::lock_file();
    let args = [
        "--batched-session",
        "2",
        "--mixed-prefill-quantum",
        "24",
        "--kv-disk-dir",
        &d,
        "--kv-cache-min-tokens",
        "16",
        "--kv-cache-boundary-align-tokens",
        "16",
        "--kv-cache-continued-interval-tokens",
        "32",
    ];
    let text = "Some shared context for a long agent session. ".repeat(6);
    let reqs = vec![
        chat(&format!("{text} First question?"), 51, 24),
        chat(&format!("Another session entirely. {text}"), 52, 24),
    ];
    let mut s = common::server::start_server(&args, &[], &lock);
    let first = together(&s, &reqs);
    s.stop(libc::SIGTERM, Duration::from_secs(30));
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert!(files >= 2, "{files} checkpoints");
    let s = common::server::start_server(&args, &[], &lock);
    let again = together(&s, &reqs);
    for (a, b) in first.iter().zip(&again) {
        let (ea, eb) = (events(a), events(b));
        // The same text; only the usage's cached count differs.
        let strip = |e: &[Value]| -> Vec<Value> {
            e.iter()
                .filter(|v| v[1].get("usage").is_none_or(Value::is_null))
                .cloned()
                .collect()
        };
        assert_eq!(strip(&ea), strip(&eb));
        let cached = eb
            .iter()
            .find_map(|v| v[1]["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
            .unwrap();
        assert!(cached >= 16, "{cached} tokens from disk: {b}");
    }
    assert!(metric(&s.addr, "ds4_kv_disk_hits_total") >= 2);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Live prefix reuse and exact DSML replay per slot: two agents whose turns
/// interleave each continue in their own slot. The tool-call turn's
/// continuation renders the exact sampled DSML, so all of its live tokens
/// are reused; so are the plain chat's.
#[test]
fn each_session_continues_in_its_own_slot() {
    let s = start(&["--batched-session", "2"]);
    let json_of = |r: String| {
        assert_eq!(status(&r), 200, "{r}");
        common::server::json_body(&r)
    };
    let ua = json!({"role":"user","content":"List the files."});
    let a1 = json_of(post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[ua],"tools":bash_tool(),"ds4_test_script":TOOL_SCRIPT}),
    ));
    let ub = json!({"role":"user","content":"Hello, other agent here."});
    let b1 = json_of(post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[ub],"think":false,"ds4_test_script":"Hi there."}),
    ));
    let live = |v: &Value| v["usage"]["total_tokens"].as_u64().unwrap();
    // B continues first: its slot, not A's (the least recently used).
    let b2 = json_of(post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[ub,{"role":"assistant","content":"Hi there."},{"role":"user","content":"More?"}],
                "think":false,"ds4_test_script":"Sure."}),
    ));
    assert_eq!(
        b2["usage"]["prompt_tokens_details"]["cached_tokens"],
        live(&b1),
        "{b2}"
    );
    let call = &a1["choices"][0]["message"]["tool_calls"][0];
    let id = call["id"].as_str().unwrap();
    let assistant = json!({"role":"assistant","content":"Sure.","reasoning_content":"Need to list.",
        "tool_calls":[{"id":id,"type":"function","function":{"name":"bash","arguments":"{\"command\": \"ls && pwd\"}"}}]});
    let a2 = json_of(post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[ua, assistant, {"role":"tool","tool_call_id":id,"content":"a.c"}],
                "tools":bash_tool(),"ds4_test_script":"Done."}),
    ));
    assert_eq!(
        a2["usage"]["prompt_tokens_details"]["cached_tokens"],
        live(&a1),
        "{a2}"
    );
    assert_eq!(metric(&s.addr, "ds4_prefix_reuse_hits_total"), 2);
}

/// Issue 21's features beside issue 18's slots: a `json_schema` answer is
/// built under its grammar in its own slot while other sessions decode
/// (valid JSON with the required fields, and the same answer as alone).
#[test]
fn structured_output_per_slot() {
    let s = start(&["--batched-session", "4", "--mixed-prefill-quantum", "16"]);
    let schema = json!({"type":"object","additionalProperties":false,"required":["name","n","tags"],
        "properties":{"name":{"type":"string","maxLength":6},
                      "n":{"type":"integer","minimum":0,"maximum":9},
                      "tags":{"type":"array","maxItems":2,"items":{"enum":["a","b"]}}}});
    let structured = json!({"messages":[{"role":"user","content":"Describe a cat as JSON."}],
        "think":false,"seed":9,"temperature":1.0,"max_tokens":80,
        "response_format":{"type":"json_schema","json_schema":{"name":"cat","strict":true,"schema":schema}}});
    let answer = |resp: &str| -> Value {
        assert_eq!(status(resp), 200, "{resp}");
        let body = json_body(resp);
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        let text = body["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {v}"));
        assert!(o.len() == 3 && o["name"].as_str().is_some_and(|n| n.chars().count() <= 6));
        assert!((0..=9).contains(&o["n"].as_i64().unwrap()), "{v}");
        assert!(o["tags"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t == "a" || t == "b"));
        v
    };
    let alone = answer(&post(&s.addr, "/v1/chat/completions", &structured));
    // The same request while three streams decode beside it.
    let addr = s.addr.clone();
    let req = structured.clone();
    let go = Arc::new(Barrier::new(4));
    let g = go.clone();
    let constrained = std::thread::spawn(move || {
        g.wait();
        post(&addr, "/v1/chat/completions", &req)
    });
    let others: Vec<_> = (0..3)
        .map(|i| {
            let (addr, go) = (s.addr.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                let (p, b) = chat(&format!("Story number {i}."), 20 + i, 40);
                stream(&addr, p, &b)
            })
        })
        .collect();
    let beside = answer(&constrained.join().unwrap());
    for h in others {
        assert!(h.join().unwrap().contains("[DONE]"));
    }
    assert_eq!(alone, beside, "the constrained answer changed when batched");
    assert!(metric(&s.addr, "ds4_batch_max_step_slots") >= 2);
}

/// A JSON answer without what legitimately differs between two runs (ids,
/// timestamps).
fn scrubbed(resp: &str) -> Value {
    assert_eq!(status(resp), 200, "{resp}");
    let mut v = json_body(resp);
    scrub(&mut v);
    v
}

/// Every log-probability in a scrubbed answer or stream, in order, as f64:
/// the numbers under a key that names log-probabilities.
fn logprob_values(v: &Value, inside: bool, out: &mut Vec<f64>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k != "text_offset" {
                    logprob_values(x, inside || k.contains("logprob"), out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| logprob_values(x, inside, out)),
        Value::Number(n) if inside => out.push(n.as_f64().unwrap()),
        _ => {}
    }
}

/// Log-probabilities and `echo` per slot (issue 18 with issue 21): each
/// request served on `--batched-session 4` while three other sessions
/// decode beside it gets exactly the answer of `--batched-session 1`, the
/// serial server whose numbers tests/server_logprobs.rs checks against the
/// engine; every log-probability is the same f64, bit for bit. Prompts
/// longer than the quantum are scored piece by piece.
#[test]
fn logprobs_and_echo_per_slot_equal_the_serial_server() {
    let serial = start(&[]);
    let s = start(&["--batched-session", "4", "--mixed-prefill-quantum", "16"]);
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(6);
    let reqs: Vec<(&str, Value)> = vec![
        (
            "/v1/completions",
            json!({"prompt":"Once upon a time","logprobs":3,"max_tokens":12,"think":false,"temperature":0}),
        ),
        (
            "/v1/completions",
            json!({"prompt":long,"echo":true,"logprobs":2,"max_tokens":6,"seed":8,"temperature":1.0}),
        ),
        (
            "/v1/completions",
            json!({"prompt":"Echo me back.","echo":true,"max_tokens":0}),
        ),
        (
            "/v1/completions",
            json!({"prompt":[1, 300, 301, 302, 303, 304],"echo":true,"logprobs":1,"max_tokens":4,"seed":5}),
        ),
        (
            "/v1/completions",
            json!({"prompt":long,"echo":true,"logprobs":4,"stream":true,"max_tokens":8,"seed":4,"temperature":1.0}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"Name a colour."}],"logprobs":true,
                   "top_logprobs":3,"think":false,"seed":2,"temperature":1.0,"max_tokens":16}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":long}],"logprobs":true,"top_logprobs":2,
                   "stream":true,"think":true,"seed":6,"max_tokens":20}),
        ),
    ];
    let answer = |addr: &str, path: &str, body: &Value| -> Value {
        if body["stream"] == true {
            json!(events(&stream(addr, path, body)))
        } else {
            scrubbed(&post(addr, path, body))
        }
    };
    let mut checked = 0;
    for (path, body) in &reqs {
        let want = answer(&serial.addr, path, body);
        // Each request alone on the serial server (sampled ones with a seed:
        // every logit bit moves the draw), then with three streams decoding
        // beside it on the batched one.
        let go = Arc::new(Barrier::new(4));
        let others: Vec<_> = (0..3)
            .map(|i| {
                let (addr, go) = (s.addr.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let (p, b) = chat(&format!("Story number {i}."), 40 + i, 30);
                    stream(&addr, p, &b)
                })
            })
            .collect();
        go.wait();
        let got = answer(&s.addr, path, body);
        for h in others {
            assert!(h.join().unwrap().contains("[DONE]"));
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        logprob_values(&want, false, &mut a);
        logprob_values(&got, false, &mut b);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&a),
            bits(&b),
            "{path} {body}: log-probabilities differ"
        );
        assert_eq!(want, got, "{path} {body}: the answers differ");
        checked += a.len();
    }
    assert!(checked > 100, "only {checked} log-probabilities compared");
    assert!(metric(&s.addr, "ds4_batch_max_step_slots") >= 2);
}
