//! `ds4-server --ssd-streaming` on 127.0.0.1 (ephemeral port, a private
//! copy of the tiny model): a request is answered with experts streamed
//! from disk; the GGUF replaced on disk while serving fails the next
//! requests with an error naming the file, and the server goes on
//! answering. The server is killed when the test ends.

mod common;

use std::process::Command;

use serde_json::json;

use common::server::{get, launch, lock_file, post, status, temp_path, Server, START_BOUND};
use ds4::testmodel::Variant;

/// The server on `model` with `extra` flags; returns once it listens.
fn start(model: &std::path::Path, extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("DS4_LOCK_FILE", lock_file())
        .env_remove("DS4_API_KEY")
        .args(extra)
        .args(["-m", model.to_str().unwrap(), "--port", "0", "--ctx", "256"]);
    launch(cmd, temp_path("ssd-stderr"), START_BOUND)
}

#[test]
fn a_gguf_replaced_while_serving_fails_requests_and_the_server_goes_on() {
    let dir = std::env::temp_dir().join(format!("ds4-ssd-server-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    std::fs::copy(common::tiny_model_path(Variant::Q8), &model).unwrap();
    let s = start(
        &model,
        &[
            "--cpu",
            "--ssd-streaming",
            "--ssd-streaming-cache-experts",
            "2",
        ],
    );
    let body = json!({
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 4,
        "temperature": 0
    });
    let r = post(&s.addr, "/v1/chat/completions", &body);
    assert_eq!(status(&r), 200, "{r}");

    // Replaced by a copy of itself: new inode and modification time.
    let copy = dir.join("tiny.new");
    std::fs::copy(&model, &copy).unwrap();
    std::fs::rename(&copy, &model).unwrap();
    for i in 0..2 {
        let body = json!({
            "model": "deepseek-v4-flash",
            "messages": [{"role": "user", "content": format!("Another question {i}.")}],
            "max_tokens": 4
        });
        let r = post(&s.addr, "/v1/chat/completions", &body);
        assert!(status(&r) >= 500, "{r}");
        assert!(
            r.contains("changed on disk") && r.contains("tiny.gguf"),
            "{r}"
        );
    }
    // Still serving.
    assert_eq!(status(&get(&s.addr, "/v1/models")), 200);
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}
