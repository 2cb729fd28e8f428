//! The HTTP layer's limits and browser guards (issue 25 items 4 and 5;
//! docs/SECURITY.md), each on the real binary with short limits set by its
//! flags: slow headers, a stalled body, an idle keep-alive connection, the
//! connection cap, a large unauthenticated body, an oversize prompt, then
//! `Host`/`Origin`/`Content-Type` checks, `--cors`, and the key's sources.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use ds4::testmodel::Variant;
use ds4::Tokenizer;
use serde_json::{json, Value};

use crate::common::server::{header, lock_file, raw, start_server, status, temp_path, Server};

fn start(args: &[&str]) -> Server {
    start_server(args, &[], &lock_file())
}

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

/// Reads until the server closes (EOF or reset); the bytes and how long it took.
fn read_until_closed(c: &mut TcpStream) -> (String, Duration) {
    let t = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no close after {:?}: {e}", t.elapsed()),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), t.elapsed())
}

/// Reads one response with a `content-length` from a kept-alive connection.
fn read_response(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = header(&text, "content-length")
                .expect("content-length")
                .parse()
                .unwrap();
            if out.len() >= end + 4 + len {
                return text;
            }
        }
        let n = c.read(&mut buf).expect("response");
        assert!(n > 0, "closed mid-response: {text}");
        out.extend_from_slice(&buf[..n]);
    }
}

fn post_json(path: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn body_json(resp: &str) -> Value {
    let body = &resp[resp.find("\r\n\r\n").expect("a head") + 4..];
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

/// Kept alive, for the tests that reuse a connection.
const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";
const HEALTH_CLOSE: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[test]
fn slow_headers_are_cut_at_the_header_timeout() {
    let s = start(&["--header-timeout", "1", "--idle-timeout", "30"]);
    // Half a request head, then nothing; and a connection that never speaks.
    let mut half = connect(&s);
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nCont")
        .unwrap();
    let mut mute = connect(&s);
    let (got, took) = read_until_closed(&mut half);
    assert!(got.is_empty(), "{got}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let (got, took) = read_until_closed(&mut mute);
    assert!(got.is_empty(), "{got}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    // Others are served meanwhile and after.
    assert_eq!(status(&raw(&s.addr, HEALTH_CLOSE, false)), 200);
}

#[test]
fn a_stalled_body_gets_408_and_a_close() {
    let s = start(&["--body-timeout", "1"]);
    let mut c = connect(&s);
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messa")
        .unwrap();
    let t = Instant::now();
    let (r, _) = read_until_closed(&mut c);
    let took = t.elapsed();
    assert_eq!(status(&r), 408, "{r}");
    assert_eq!(header(&r, "connection"), Some("close"), "{r}");
    assert!(body_json(&r)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--body-timeout"));
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[test]
fn keep_alive_outlives_the_header_timeout_then_idles_out() {
    // Header deadline 1 s, keep-alive 3 s: a pause of 2 s between two
    // requests on one connection is fine; then the idle connection closes.
    let s = start(&["--header-timeout", "1", "--idle-timeout", "3"]);
    let mut c = connect(&s);
    c.write_all(HEALTH).unwrap();
    assert_eq!(status(&read_response(&mut c)), 200);
    std::thread::sleep(Duration::from_secs(2));
    c.write_all(HEALTH).unwrap();
    assert_eq!(status(&read_response(&mut c)), 200);
    let (got, took) = read_until_closed(&mut c);
    assert!(got.is_empty(), "{got}");
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(8),
        "{took:?}"
    );
}

#[test]
fn a_slow_head_on_a_kept_alive_connection_gets_the_header_deadline() {
    let s = start(&["--header-timeout", "1", "--idle-timeout", "30"]);
    let mut c = connect(&s);
    c.write_all(HEALTH).unwrap();
    assert_eq!(status(&read_response(&mut c)), 200);
    c.write_all(b"GET /health HTTP/1.1\r\nHo").unwrap();
    let (got, took) = read_until_closed(&mut c);
    assert!(got.is_empty(), "{got}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[test]
fn the_connection_cap_refuses_with_503_and_frees_slots() {
    let s = start(&["--max-connections", "3", "--header-timeout", "30"]);
    let held: Vec<TcpStream> = (0..3).map(|_| connect(&s)).collect();
    // The listener accepts in order: the fourth finds no slot.
    let mut over = connect(&s);
    let t = Instant::now();
    let (r, _) = read_until_closed(&mut over);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(status(&r), 503, "{r}");
    assert_eq!(header(&r, "connection"), Some("close"), "{r}");
    assert_eq!(header(&r, "retry-after"), Some("1"), "{r}");
    assert!(body_json(&r)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-connections"));
    // A slot frees when a held connection closes.
    drop(held);
    let t = Instant::now();
    loop {
        let r = raw(&s.addr, HEALTH_CLOSE, false);
        if status(&r) == 200 {
            break;
        }
        assert_eq!(status(&r), 503, "{r}");
        assert!(t.elapsed() < Duration::from_secs(10), "no slot freed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_large_unauthenticated_body_gets_401_before_it_is_read() {
    let s = start_server(&[], &[("DS4_API_KEY", "k3y")], &lock_file());
    let total: usize = 60 << 20;
    let mut c = connect(&s);
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {total}\r\n\r\n"
    )
    .unwrap();
    let chunk = vec![b' '; 64 << 10];
    c.write_all(&chunk).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    let n = c.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header(&head, "connection"), Some("close"), "{head}");
    // The rest of the body is never taken in: the server closed, so the
    // writes fail long before 60 MiB (socket buffers hold a few MiB).
    let mut written = chunk.len();
    c.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let big = vec![b' '; 1 << 20];
    while written < total {
        match c.write(&big) {
            Ok(n) => written += n,
            Err(_) => break,
        }
    }
    eprintln!("a refused 60 MiB body: {written} bytes written before the close");
    assert!(written < 32 << 20, "{written} bytes were taken in");
}

/// The byte bound the server derives: ctx × the longest token.
fn prompt_bound(ctx: usize) -> usize {
    let model = crate::common::tiny_model(Variant::Q8);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let longest = (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.token_bytes(id).map(<[u8]>::len))
        .max()
        .unwrap();
    ctx * longest
}

#[test]
fn an_oversize_prompt_is_refused_at_once_even_while_the_worker_is_busy() {
    let ctx = 256;
    let s = start(&["--ctx", "256"]);
    let bound = prompt_bound(ctx);
    // Occupy the worker with a long streamed generation.
    let mut busy = connect(&s);
    let b = json!({"messages":[{"role":"user","content":"go"}],"stream":true,"max_tokens":200,"think":false})
        .to_string();
    busy.write_all(&post_json("/v1/chat/completions", &b, ""))
        .unwrap();
    let mut first = [0u8; 64];
    assert!(busy.read(&mut first).unwrap() > 0);
    let long = "a".repeat(bound + 1);
    for (path, body, anthropic) in [
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":long}]}),
            false,
        ),
        (
            "/v1/messages",
            json!({"max_tokens":8,"messages":[{"role":"user","content":long}]}),
            true,
        ),
        ("/v1/completions", json!({"prompt": long}), false),
    ] {
        let t = Instant::now();
        let r = raw(&s.addr, &post_json(path, &body.to_string(), ""), false);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{path}: {:?}",
            t.elapsed()
        );
        assert_eq!(status(&r), 400, "{path}: {r}");
        let v = body_json(&r);
        if anthropic {
            assert_eq!(v["type"], "error", "{v}");
        } else {
            assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        }
        assert_eq!(v["error"]["n_ctx"], ctx, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("no prompt over {bound} bytes")));
    }
    // Under the bound, the worker's own token count still decides.
    drop(busy);
    let short =
        json!({"messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ok","think":false});
    let r = raw(
        &s.addr,
        &post_json("/v1/chat/completions", &short.to_string(), ""),
        false,
    );
    assert_eq!(status(&r), 200, "{r}");
}

#[test]
fn cross_site_posts_and_rebinding_hosts_are_refused_without_a_key() {
    let s = start(&[]);
    let chat =
        json!({"messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ok","think":false})
            .to_string();
    // A form-like cross-site POST: text/plain, a foreign Origin.
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{chat}",
        chat.len()
    );
    let r = raw(&s.addr, req.as_bytes(), false);
    assert_eq!(status(&r), 403, "{r}");
    assert!(r.contains("--cors"), "{r}");
    assert_eq!(header(&r, "access-control-allow-origin"), None, "{r}");
    // The same without Origin (an old browser, or a no-cors fetch): the
    // content type alone refuses it; no type at all too.
    for ct in ["Content-Type: text/plain\r\n", ""] {
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n{chat}",
            chat.len()
        );
        let r = raw(&s.addr, req.as_bytes(), false);
        assert_eq!(status(&r), 415, "{r}");
    }
    // DNS rebinding: the page's own name in Host.
    for path in ["/metrics", "/v1/models", "/health"] {
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: evil.example:8000\r\nConnection: close\r\n\r\n");
        let r = raw(&s.addr, req.as_bytes(), false);
        assert_eq!(status(&r), 403, "{path}: {r}");
        assert!(r.contains("DNS rebinding"), "{r}");
        assert!(!r.contains("ds4_requests"), "{r}");
    }
    for host in ["localhost", "127.0.0.1:8000", "[::1]:8000"] {
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        assert_eq!(status(&raw(&s.addr, req.as_bytes(), false)), 200, "{host}");
    }
    // A JSON POST from a local client is served.
    let r = raw(
        &s.addr,
        &post_json("/v1/chat/completions", &chat, ""),
        false,
    );
    assert_eq!(status(&r), 200, "{r}");
    // The default bind (127.0.0.1) gives no exposure warning.
    assert!(!s.stderr_text().contains("warning"), "{}", s.stderr_text());
}

#[test]
fn an_origin_named_by_cors_is_served_with_cors_headers() {
    let s = start(&[
        "--cors",
        "http://localhost:3000",
        "--cors",
        "https://app.example",
    ]);
    let pre = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, authorization\r\nConnection: close\r\n\r\n";
    let r = raw(&s.addr, pre.as_bytes(), false);
    assert_eq!(status(&r), 204, "{r}");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert!(header(&r, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert_eq!(
        header(&r, "access-control-allow-headers"),
        Some("content-type, authorization")
    );
    assert_eq!(header(&r, "vary"), Some("origin"));
    let chat =
        json!({"messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ok","think":false})
            .to_string();
    let r = raw(
        &s.addr,
        &post_json(
            "/v1/chat/completions",
            &chat,
            "Origin: https://app.example\r\n",
        ),
        false,
    );
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(body_json(&r)["choices"][0]["message"]["content"], "ok");
    // Streamed answers carry it too.
    let sse = json!({"messages":[{"role":"user","content":"hi"}],"ds4_test_script":"ok","think":false,"stream":true})
        .to_string();
    let r = raw(
        &s.addr,
        &post_json(
            "/v1/chat/completions",
            &sse,
            "Origin: http://localhost:3000\r\n",
        ),
        false,
    );
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    // Another origin, even on localhost, is refused (preflight and request).
    let other = pre.replace("localhost:3000", "localhost:3001");
    let r = raw(&s.addr, other.as_bytes(), false);
    assert_eq!(status(&r), 403, "{r}");
    assert_eq!(header(&r, "access-control-allow-origin"), None);
}

fn exit_status(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env_remove("DS4_API_KEY")
        .env("DS4_LOCK_FILE", lock_file())
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (o.status.code(), err)
}

#[test]
fn cors_star_needs_a_key_and_bad_limits_exit_2() {
    let (code, err) = exit_status(&["--cors", "*"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs an API key"), "{err}");
    for args in [
        &["--cors", "localhost:3000"][..],
        &["--header-timeout", "0"],
        &["--body-timeout", "-1"],
        &["--idle-timeout", "nan"],
        &["--max-connections", "0"],
        &["--max-connections", "99999999999"],
    ] {
        let (code, err) = exit_status(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }
    // With a key, '*' lets any page call (and send the key).
    let s = start_server(&["--cors", "*"], &[("DS4_API_KEY", "k3y")], &lock_file());
    let r = raw(
        &s.addr,
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nOrigin: https://any.example\r\nAuthorization: Bearer k3y\r\nConnection: close\r\n\r\n",
        false,
    );
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
}

#[test]
fn the_key_comes_from_a_file_or_the_environment() {
    let file = temp_path("key");
    std::fs::write(&file, "fil3-key\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let f = file.to_str().unwrap();
    let by_file = start(&["--api-key-file", f]);
    let by_env = start_server(&[], &[("DS4_API_KEY", "env-key")], &lock_file());
    for (s, key) in [(&by_file, "fil3-key"), (&by_env, "env-key")] {
        let get = |auth: &str| {
            let req = format!(
                "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
            );
            status(&raw(&s.addr, req.as_bytes(), false))
        };
        assert_eq!(get(""), 401, "{key}");
        assert_eq!(get("Authorization: Bearer wrong\r\n"), 401, "{key}");
        assert_eq!(
            get(&format!("Authorization: Bearer {key}\r\n")),
            200,
            "{key}"
        );
        assert_eq!(get(&format!("x-api-key: {key}\r\n")), 200, "{key}");
        // With a key, other Host names are served (the key is the guard).
        let req = format!(
            "GET /v1/models HTTP/1.1\r\nHost: ds4.lan:8000\r\nx-api-key: {key}\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(status(&raw(&s.addr, req.as_bytes(), false)), 200, "{key}");
    }
    assert!(by_file.stderr_text().contains("--api-key-file"));
    assert!(
        !by_file.stderr_text().contains("warning"),
        "{}",
        by_file.stderr_text()
    );
    assert!(by_env.stderr_text().contains("DS4_API_KEY"));
    // The key never shows in the process list (only the file's path does).
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", by_env.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("env-key"));
    // A key file others can read still works, with a warning.
    let shared = temp_path("key");
    std::fs::write(&shared, "  spaced-key  \n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let s = start(&["--api-key-file", shared.to_str().unwrap()]);
    assert!(
        s.stderr_text().contains("can be read by other users"),
        "{}",
        s.stderr_text()
    );
    let req = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nx-api-key: spaced-key\r\nConnection: close\r\n\r\n";
    assert_eq!(status(&raw(&s.addr, req.as_bytes(), false)), 200);
    drop(s);
    std::fs::remove_file(&shared).ok();
    // A missing or empty file, or two sources at once: exit 2.
    let empty = temp_path("key");
    std::fs::write(&empty, "\n").unwrap();
    for args in [
        vec!["--api-key-file", "/nonexistent/ds4-key"],
        vec!["--api-key-file", empty.to_str().unwrap()],
        vec!["--api-key", "a", "--api-key-file", f],
    ] {
        let (code, err) = exit_status(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }
    std::fs::remove_file(&file).ok();
    std::fs::remove_file(&empty).ok();
}
