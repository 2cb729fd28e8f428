//! The real `ds4-server` binary on 127.0.0.1 (ephemeral port, tiny model,
//! scripted test mode): the official openai/anthropic Python SDKs, a client
//! that disconnects mid-stream, raw malformed/truncated/slow HTTP. Every
//! server is killed when its test ends.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use ds4::server::render;
use ds4::server::request::{self, ParseContext};
use ds4::testmodel::Variant;
use ds4::Tokenizer;
use serde_json::{json, Value};

use common::process::python_has;
use common::server::{lock_file, raw, start_server, status, Server, CTX};

fn start() -> Server {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Server {
    start_locked(extra, &lock_file())
}

fn start_locked(extra: &[&str], lock: &str) -> Server {
    start_server(extra, &[], lock)
}

fn post(addr: &str, path: &str, body: &Value) -> String {
    let b = body.to_string();
    raw(
        addr,
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        )
        .as_bytes(),
        false,
    )
}

#[test]
fn official_python_sdks_work_unchanged() {
    if !python_has(
        "openai, anthropic",
        "DS4_SKIP_SDK_TESTS",
        "python3 with the openai and anthropic packages is needed: pip install openai==1.99.9 anthropic==0.64.0",
    ) {
        return;
    }
    let model = common::tiny_model(Variant::Q8);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let pc = ParseContext {
        ctx: CTX,
        allow_script: false,
    };
    let count = |r: request::GenRequest| {
        tok.encode_chat(&render::render(&r, &mut render::NoReplay))
            .len()
    };
    let chat = json!({"model":"deepseek-chat","messages":[{"role":"user","content":"Say hi."}]});
    let msgs = json!({"max_tokens":50,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Say hi."}]});
    let expect = json!({
        "chat_prompt": count(request::parse_chat(chat.to_string().as_bytes(), pc).unwrap()),
        "anthropic_prompt": count(request::parse_messages(msgs.to_string().as_bytes(), pc).unwrap()),
        "hello_tokens": tok.encode_chat("Hello there.").len(),
        "tool_suffix": tok.encode_chat("<｜end▁of▁sentence｜><｜User｜><tool_result>a.c\n/srv</tool_result><｜Assistant｜><think>").len(),
    });
    let s = start();
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/sdk/sdk_clients.py"
        ))
        .arg(format!("http://{}", s.addr))
        .arg(expect.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    assert!(text.contains("all SDK checks passed"), "{text}");
}

#[test]
fn a_client_that_leaves_mid_stream_frees_the_worker() {
    let s = start();
    let body = json!({"messages":[{"role":"user","content":"go"}],"stream":true,"max_tokens":1500,"think":false}).to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 2048];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("content") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    // 1500 tokens would take long; the next request is served at once.
    let t = Instant::now();
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[{"role":"user","content":"x"}],"ds4_test_script":"next","think":false}),
    );
    assert_eq!(status(&r), 200, "{r}");
    assert!(r.contains("\"content\":\"next\""), "{r}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let m = raw(
        &s.addr,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        false,
    );
    assert!(m.contains("ds4_cancelled_total 1"), "{m}");
}

#[test]
fn malformed_truncated_and_slow_requests() {
    let s = start();
    // A malformed request line: hyper's parser answers 400 (empty body).
    let r = raw(&s.addr, b"BLAH\r\n\r\n", false);
    assert_eq!(status(&r), 400, "{r}");
    // A body shorter than its Content-Length, then the client stops sending.
    let r = raw(
        &s.addr,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messa",
        true,
    );
    assert_eq!(status(&r), 400, "{r}");
    assert!(r.contains("bad HTTP request"), "{r}");
    // A slow client holding a half-sent request does not block others.
    let mut slow = TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nCont")
        .unwrap();
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages":[{"role":"user","content":"x"}],"ds4_test_script":"fine","think":false}),
    );
    assert_eq!(status(&r), 200, "{r}");
    let body = &r[r.find("\r\n\r\n").unwrap() + 4..];
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "fine");
    drop(slow);
    // Invalid UTF-8 in a request body.
    let r = raw(
        &s.addr,
        b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{\"model\":\"\xff\"}",
        false,
    );
    assert_eq!(status(&r), 400, "{r}");
    assert!(r.contains("invalid JSON request"), "{r}");
}

#[test]
fn trace_file_records_each_request() {
    let path = std::env::temp_dir().join(format!("ds4-trace-{}.txt", std::process::id()));
    let s = start_with(&["--trace", path.to_str().unwrap()]);
    let q = json!({"role":"user","content":"hi"});
    let b1 = json!({"model":"deepseek-chat","messages":[q],"ds4_test_script":"Hello."});
    assert_eq!(status(&post(&s.addr, "/v1/chat/completions", &b1)), 200);
    let b2 = json!({"model":"deepseek-chat","messages":[q,{"role":"assistant","content":"Hello."},
        {"role":"user","content":"again"}],"ds4_test_script":"Bye."});
    assert_eq!(status(&post(&s.addr, "/v1/chat/completions", &b2)), 200);
    drop(s);
    let t = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(t.contains("===== request 1 "), "{t}");
    assert!(t.contains("cache_source: none"), "{t}");
    assert!(
        t.contains(
            "--- rendered prompt ---\n<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>\n"
        ),
        "{t}"
    );
    assert!(t.contains("content:\nHello.\n"), "{t}");
    assert!(t.contains("===== request 2 "), "{t}");
    assert!(t.contains("cache_source: memory-t"), "{t}");
    assert!(t.contains("===== end request 2 ====="), "{t}");
}

#[test]
fn bad_flags_exit_2_and_sigint_exits_cleanly() {
    for args in [
        &["--host", "example.com"][..],
        &["--ctx", "1"],
        &["--port", "x"],
        &["--nope"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ds4-server"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
    // A second server on the same lock file refuses to start (status 2).
    let lock = lock_file();
    let mut s = start_locked(&[], &lock);
    let m = common::tiny_model_path(Variant::Q8);
    let o = Command::new(env!("CARGO_BIN_EXE_ds4-server"))
        .args(["-m", m.to_str().unwrap(), "--port", "0"])
        .env("DS4_LOCK_FILE", &lock)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another ds4 process"));
    s.stop(libc::SIGINT, Duration::from_secs(20));
}
