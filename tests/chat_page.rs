//! The chat page at `/` in a real browser (issue 21 item 3): headless
//! Chromium (Debian's `chromium`; `.ci/run` installs it) loads the page from
//! a `--demo --api-key` server on 127.0.0.1, is refused without the key,
//! then with it streams an answer, a folded reasoning block and a stopped
//! answer. Issue 39 item 4: the model's name and context from `/v1/models`,
//! per-reply token counts and tokens/s, regenerate, edit-last, conversations
//! kept in localStorage (a new one, a switch, a reload) and the embedded
//! markdown renderer (a stored answer: headings, emphasis, lists, a code
//! block whose copy button copies, and markup in the text left as text).
//! `tests/chat_page/drive.py` steers Chromium over the DevTools protocol;
//! the screenshots stay at `target/tmp/chat_page.png` and
//! `target/tmp/chat_page_<feature>.png`. Skipped, with the reason printed,
//! only where no `chromium` can be found.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::process::run_bounded;
use common::server::{get, launch, lock_file, temp_path, Server};
use serde_json::Value;

const KEY: &str = "page-test-key";

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DS4_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// `ds4-server --demo` with a key, its demo model cached in the build tree.
fn demo_server() -> Server {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo-cache");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("XDG_CACHE_HOME", &cache)
        .env("DS4_LOCK_FILE", lock_file())
        .env_remove("DS4_API_KEY")
        .args(["--demo", "--port", "0", "--ctx", "4096", "--api-key", KEY]);
    // The first run writes the demo model into the cache: a wider bound.
    launch(cmd, temp_path("demo-stderr"), Duration::from_secs(300))
}

#[test]
fn the_chat_page_streams_in_headless_chromium() {
    let Some(chromium) = chromium() else {
        eprintln!("skipped: no chromium (Debian package `chromium`, installed by .ci/run; or set DS4_CHROMIUM)");
        return;
    };
    let s = demo_server();
    // The page itself needs no key; it is the embedded file.
    let page = get(&s.addr, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("content-security-policy: default-src 'none'"));
    assert!(page.ends_with(ds4::server::page::INDEX_HTML));

    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let shot = tmp.join("chat_page.png");
    let features = ["stats", "regenerate", "edit", "chats", "markdown"];
    let shots: Vec<PathBuf> = features
        .iter()
        .map(|f| tmp.join(format!("chat_page_{f}.png")))
        .collect();
    for p in std::iter::once(&shot).chain(&shots) {
        let _ = std::fs::remove_file(p);
    }
    let url = format!("http://{}/", s.addr);
    let mut py = Command::new("python3");
    py.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/chat_page/drive.py"
    ))
    .arg(&chromium)
    .arg(&url)
    .arg(KEY)
    .arg(&shot);
    // drive.py bounds itself (120 s); this is the backstop.
    let out = run_bounded(py, Duration::from_secs(180), "drive.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drive.py failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(stdout.trim()).unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
    eprintln!("screenshot: {}", shot.display());

    assert_eq!(r["title"], "ds4 chat");
    // Refused without the key, and the page says so.
    let nokey = &r["without_key"];
    assert_eq!(nokey["state"], "error", "{nokey}");
    assert!(
        nokey["status"]
            .as_str()
            .unwrap()
            .contains("invalid or missing API key"),
        "{nokey}"
    );
    // With it: text that arrived in several streamed pieces.
    let a = &r["answer"];
    assert_eq!(a["state"], "done", "{a}");
    assert!(a["chunks"].as_u64().unwrap() >= 2, "{a}");
    assert!(!a["text"].as_str().unwrap().is_empty(), "{a}");
    assert!(a["status"].as_str().unwrap().starts_with("finish: "), "{a}");
    // Thinking: the reasoning is shown, folded.
    let t = &r["thinking"];
    assert_eq!(t["state"], "done", "{t}");
    assert_eq!(t["reasoning_shown"], true, "{t}");
    assert_eq!(t["reasoning_open"], false, "{t}");
    assert!(!t["reasoning"].as_str().unwrap().is_empty(), "{t}");
    // Stop: the answer ends where it was stopped, the form is ready again.
    let st = &r["stopped"];
    assert_eq!(st["state"], "stopped", "{st}");
    assert_eq!(st["status"], "stopped");
    assert_eq!(r["buttons_after_stop"], serde_json::json!([false, true]));
    // Every request the page made went to this server.
    for u in r["requests"].as_array().unwrap() {
        let u = u.as_str().unwrap();
        assert!(u.starts_with(&url) || u.starts_with("data:"), "{u}");
    }
    for p in std::iter::once(&shot).chain(&shots) {
        let png = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 1000,
            "{}",
            p.display()
        );
    }
    issue_39_features(&r);
    // The server is fine after the stopped stream.
    assert!(get(&s.addr, "/health").starts_with("HTTP/1.1 200"));
}

/// What drive.py saw of issue 39's page features.
fn issue_39_features(r: &Value) {
    let num = |v: &Value| -> f64 { v.as_str().and_then(|s| s.parse().ok()).unwrap_or(-1.0) };
    // The model's name and context size from /v1/models (the key typed).
    let m = &r["model"];
    assert_eq!(m["id"], "deepseek-v4-flash", "{m}");
    assert_eq!(m["ctx"], "4096", "{m}");
    assert!(m["text"].as_str().unwrap().contains("context 4096"), "{m}");
    // Per reply: prompt tokens (cached), generated tokens, tokens/s.
    let a = &r["answer"];
    assert!(num(&a["prompt"]) > 0.0 && num(&a["cached"]) >= 0.0, "{a}");
    assert!(num(&a["generated"]) >= 2.0 && num(&a["tps"]) > 0.0, "{a}");
    let status = a["status"].as_str().unwrap();
    for part in ["prompt ", "(cached ", " tokens", " tok/s"] {
        assert!(status.contains(part), "{part}: {status}");
    }
    // Regenerate replaces the stopped answer with a new one.
    let g = &r["regenerate"];
    assert_eq!(g["state"], "done", "{g}");
    assert_eq!(g["answers_before"], g["answers_after"], "{g}");
    assert_eq!(g["answers_after"], 6, "three turns kept: {g}");
    assert_eq!(g["shown"], 3, "{g}");
    assert_eq!(g["stored_last"]["role"], "assistant", "{g}");
    assert_eq!(g["stored_last"]["state"], "done", "{g}");
    // Edit-last: the question back in the input, its turn gone, sent again.
    let e = &r["edit"];
    assert_eq!(e["input"], "Go on and on", "{e}");
    assert_eq!(
        e["users_after_click"].as_u64().unwrap() + 1,
        e["users_before"].as_u64().unwrap(),
        "{e}"
    );
    assert_eq!(e["users_after_send"], e["users_before"], "{e}");
    assert_eq!(e["answer"]["state"], "done", "{e}");
    assert_eq!(e["stored_last_question"], "Go on and on (edited)", "{e}");
    let roles: Vec<&str> = e["stored_roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        roles.chunks(2).all(|p| p == ["user", "assistant"]),
        "{roles:?}"
    );
    // Conversations: new, switch back, kept across a reload.
    let c = &r["chats"];
    assert_eq!(c["log_after_new"], 0, "{c}");
    assert_eq!(c["listed_after_new"], 2, "{c}");
    assert_eq!(c["second_answer"], "done", "{c}");
    assert_eq!(c["users_after_switch"], c["first_users"], "{c}");
    let after = &c["after_reload"];
    assert_eq!(after["listed"], 2, "{c}");
    assert_eq!(after["users"], c["first_users"], "{c}");
    assert_eq!(after["current"], true, "{c}");
    assert_eq!(after["titles"][0], "Second chat", "{c}");
    // Markdown, rendered by the page's own code.
    let md = &r["markdown"];
    assert_eq!(md["h1"], "Title", "{md}");
    assert_eq!(md["strong"], "bold", "{md}");
    assert_eq!(md["em"], "italic", "{md}");
    assert_eq!(md["inline_code"], "x < y", "{md}");
    assert_eq!(md["code"], "print(1 < 2)", "{md}");
    assert_eq!(md["label"], "python", "{md}");
    assert_eq!(md["items"], 2, "{md}");
    assert_eq!(md["copy_buttons"], 1, "{md}");
    // Markup in an answer stays text: no element, no script ran.
    assert_eq!(md["images"], 0, "{md}");
    assert_eq!(md["raw_tag_shown"], true, "{md}");
    assert_eq!(md["title"], "ds4 chat", "{md}");
    assert_eq!(md["copied"], "yes", "{md}");
    assert_eq!(md["clipboard"], "print(1 < 2)", "{md}");
}
