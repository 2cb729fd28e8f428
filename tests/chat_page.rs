//! The chat page at `/` in a real browser (issue 21 item 3): headless
//! Chromium (Debian's `chromium`; `.ci/run` installs it) loads the page from
//! a `--demo --api-key` server on 127.0.0.1, is refused without the key,
//! then with it streams an answer, a folded reasoning block and a stopped
//! answer. `tests/chat_page/drive.py` steers Chromium over the DevTools
//! protocol; the screenshot stays at `target/tmp/chat_page.png`. Skipped,
//! with the reason printed, only where no `chromium` can be found.

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

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat_page.png");
    let _ = std::fs::remove_file(&shot);
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
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 1000);
    // The server is fine after the stopped stream.
    assert!(get(&s.addr, "/health").starts_with("HTTP/1.1 200"));
}
