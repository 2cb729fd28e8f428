//! The real `ds4-server` with `--kv-disk-dir` on 127.0.0.1 (ephemeral port,
//! tiny model, scripted outputs): a conversation survives a SIGTERM restart
//! with only the suffix evaluated, tool calls included (their ids come back
//! from the checkpoints' KTM maps); a full disk (injected ENOSPC) leaves the
//! server serving; a corrupt checkpoint is skipped with a log line. Every
//! server is killed when its test ends.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::server::{launch, Server, SMALL_SAVES, START_BOUND};
use ds4::testmodel::Variant;
use serde_json::{json, Value};

/// Starts ds4-server on the tiny model with the disk cache in `dir`
/// (small save thresholds so a short chat gets checkpoints).
fn start(dir: &Path, name: &str, env: &[(&str, &str)]) -> Server {
    let m = common::tiny_model_path(Variant::Q8);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.args(["-m", m.to_str().unwrap(), "--port", "0"])
        .args(["--ctx", "1024", "-n", "16", "--kv-disk-dir"])
        .arg(dir)
        .args(SMALL_SAVES)
        .env("DS4_SERVER_TEST_SCRIPTS", "1")
        // A lock file per test: the single-instance lock lets the tests'
        // servers run side by side (the restart reuses it after the exit).
        .env("DS4_LOCK_FILE", dir.with_extension("lock"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    launch(cmd, dir.with_extension(format!("{name}.log")), START_BOUND)
}

/// A chat completion that must succeed; its JSON body.
fn post(s: &Server, body: &Value) -> Value {
    let resp = http(&s.addr, "POST", "/v1/chat/completions", &body.to_string());
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{resp}");
    serde_json::from_str(body).unwrap()
}

fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8(out).unwrap()
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("server_kvdisk_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "kv"));
    v.sort();
    v
}

fn all_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

const SYSTEM: &str = "You are a careful assistant. Answer briefly and precisely, and say so when you do not know something for sure.";
const REPLY: &str = "Paris is the capital of France, on the river Seine.";

fn turn1() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": "What is the capital of France? Please answer in one sentence."}),
    ]
}

fn turn2() -> Vec<Value> {
    let mut m = turn1();
    m.push(json!({"role": "assistant", "content": REPLY}));
    m.push(json!({"role": "user", "content": "And which river flows through it?"}));
    m
}

fn chat(messages: Vec<Value>, script: &str) -> Value {
    json!({
        "model": "deepseek-v4-flash",
        "messages": messages,
        "max_tokens": 16,
        "thinking": {"type": "disabled"},
        "ds4_test_script": script,
    })
}

fn usage(r: &Value) -> (u64, u64, u64) {
    let u = &r["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn a_restarted_server_resumes_from_disk_with_only_the_suffix_evaluated() {
    let dir = fresh_dir("restart");
    let s1 = start(&dir, "a", &[]);
    let r1 = post(&s1, &chat(turn1(), REPLY));
    assert_eq!(r1["choices"][0]["message"]["content"], REPLY);
    let (p1, c1, g1) = usage(&r1);
    assert_eq!(c1, 0, "a fresh server has nothing cached");
    assert_eq!(s1.metric("ds4_prompt_tokens_evaluated_total"), p1);
    // The cold save of the first prompt.
    assert!(s1.metric("ds4_kv_disk_saves_total") >= 1);
    assert_eq!(s1.metric("ds4_kv_disk_misses_total"), 1);
    let log1 = s1.terminate();
    assert!(log1.contains("disk KV cache in"), "{log1}");
    // Continued saves every 16 tokens: in the prefill and between decode
    // steps (the live length crossed a multiple of 16 while generating).
    let continued: Vec<u64> = log1
        .lines()
        .filter(|l| l.contains("reason=continued"))
        .filter_map(|l| l.split("tokens=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(continued.contains(&16) && continued.contains(&32), "{log1}");
    assert!(
        continued
            .iter()
            .any(|&n| n > p1 && n <= p1 + g1 && n % 16 == 0),
        "a continued save during decode ({p1} + {g1} tokens): {log1}"
    );
    let files = checkpoints(&dir);
    assert!(files.len() >= 2, "cold + shutdown checkpoints: {files:?}");

    // A new process: the live session is empty, the longer conversation
    // resumes from the shutdown checkpoint (the prompt and the reply).
    let s2 = start(&dir, "b", &[]);
    let r2 = post(&s2, &chat(turn2(), "The Seine."));
    let (p2, c2, _) = usage(&r2);
    assert_eq!(c2, p1 + g1, "cached = the checkpoint of turn 1 + reply");
    assert!(p2 > c2);
    assert_eq!(
        s2.metric("ds4_prompt_tokens_evaluated_total"),
        p2 - c2,
        "only the suffix is evaluated"
    );
    assert_eq!(s2.metric("ds4_kv_disk_hits_total"), 1);
    assert_eq!(s2.metric("ds4_kv_disk_misses_total"), 0);
    assert_eq!(s2.metric("ds4_prefix_reused_tokens_total"), c2);
    // A third turn continues from the live session, not from disk.
    let mut m3 = turn2();
    m3.push(json!({"role": "assistant", "content": "The Seine."}));
    m3.push(json!({"role": "user", "content": "Thanks."}));
    let r3 = post(&s2, &chat(m3, "You are welcome."));
    let (p3, c3, g3) = usage(&r3);
    assert!(c3 >= p2 && c3 < p3, "{c3} of {p3}");
    assert_eq!(s2.metric("ds4_kv_disk_hits_total"), 1);
    // An unrelated conversation replaces the live session: evict save
    // first, then a disk miss.
    let other = vec![json!({"role": "user", "content": "Something else entirely."})];
    let (_, c4, _) = usage(&post(&s2, &chat(other, "Sure.")));
    assert_eq!(c4, 0);
    assert_eq!(s2.metric("ds4_kv_disk_misses_total"), 1);
    let log2 = s2.terminate();
    assert!(log2.contains("ds4: kv cache: hit"), "{log2}");
    let evict = format!("stored tokens={} reason=evict", p3 + g3);
    assert!(log2.contains(&evict), "{evict}: {log2}");
}

#[test]
fn a_full_disk_leaves_the_server_serving() {
    let dir = fresh_dir("full");
    // Every checkpoint write fails with ENOSPC after 4 KiB.
    let s = start(&dir, "a", &[("DS4_KV_TEST_WRITE_LIMIT", "4096")]);
    let r1 = post(&s, &chat(turn1(), REPLY));
    assert_eq!(r1["choices"][0]["message"]["content"], REPLY);
    let r2 = post(&s, &chat(turn2(), "The Seine."));
    assert_eq!(r2["choices"][0]["message"]["content"], "The Seine.");
    let (_, c2, _) = usage(&r2);
    assert!(c2 > 0, "the live session is still reused");
    assert!(s.metric("ds4_kv_disk_save_failures_total") >= 1);
    assert_eq!(s.metric("ds4_kv_disk_saves_total"), 0);
    assert_eq!(s.metric("ds4_kv_disk_bytes_written_total"), 0);
    let log = s.terminate();
    // Logged once, however many saves failed.
    assert_eq!(
        log.matches("ds4: kv cache: store failed").count(),
        1,
        "{log}"
    );
    // Nothing half-written is left behind.
    assert_eq!(all_files(&dir), Vec::<String>::new());
}

#[test]
fn a_corrupt_checkpoint_is_skipped_with_a_log_line() {
    let dir = fresh_dir("corrupt");
    let s1 = start(&dir, "a", &[]);
    post(&s1, &chat(turn1(), REPLY));
    s1.terminate();
    // Flip one byte in the payload of every checkpoint (the last byte is
    // payload: these files carry no tool map).
    let files = checkpoints(&dir);
    assert!(!files.is_empty());
    for f in &files {
        let mut b = std::fs::read(f).unwrap();
        let n = b.len();
        b[n - 1] ^= 0x40;
        std::fs::write(f, b).unwrap();
    }
    let s2 = start(&dir, "b", &[]);
    let r = post(&s2, &chat(turn2(), "The Seine."));
    let (p, c, _) = usage(&r);
    assert_eq!(c, 0, "nothing loads from a corrupt file");
    assert_eq!(s2.metric("ds4_prompt_tokens_evaluated_total"), p);
    assert_eq!(s2.metric("ds4_kv_disk_hits_total"), 0);
    assert_eq!(s2.metric("ds4_kv_disk_corrupt_removed_total"), 1);
    let log = s2.stderr_text();
    assert!(
        log.contains("ds4: kv cache: load failed") && log.contains("(removed)"),
        "{log}"
    );
    drop(s2);
}

/// The sampled tool call: DSML whose bytes differ from what the server
/// renders for the client's JSON (escaped `&&`, parameters in sampled
/// order), so only the exact-replay memory reproduces them.
const BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

fn bash_tool() -> Value {
    json!([{"type":"function","function":{"name":"bash","description":"Run a shell command.",
        "parameters":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}}}}}])
}

fn tool_chat(messages: Vec<Value>, script: &str) -> Value {
    json!({
        "model": "deepseek-v4-flash",
        "messages": messages,
        "tools": bash_tool(),
        "max_tokens": 200,
        "thinking": {"type": "disabled"},
        "ds4_test_script": script,
    })
}

/// Header fields of a checkpoint and its KTM entries, read by hand from
/// KVCACHE.md §4.1/§4.5's byte layout: (tokens, ext flags, entries, file
/// length, where the KTM section starts).
fn ktm_of(path: &Path) -> (u32, u8, Vec<(String, String)>, usize, usize) {
    let b = std::fs::read(path).unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let tokens = u32_at(8);
    let flags = b[6];
    let payload = u64::from_le_bytes(b[40..48].try_into().unwrap()) as usize;
    let start = 52 + u32_at(48) as usize + payload;
    let mut entries = Vec::new();
    if flags & 1 != 0 {
        assert_eq!(&b[start..start + 4], b"KTM\x01");
        let mut p = start + 8;
        for _ in 0..u32_at(start + 4) {
            let (il, dl) = (u32_at(p) as usize, u32_at(p + 4) as usize);
            let id = String::from_utf8(b[p + 8..p + 8 + il].to_vec()).unwrap();
            let dsml = String::from_utf8(b[p + 8 + il..p + 8 + il + dl].to_vec()).unwrap();
            entries.push((id, dsml));
            p += 8 + il + dl;
        }
        assert_eq!(p, b.len(), "the KTM section ends the file");
    } else {
        assert_eq!(start, b.len(), "no tool map, nothing after the payload");
    }
    (tokens, flags, entries, b.len(), start)
}

#[test]
fn a_restarted_server_maps_resent_tool_call_ids_back_through_the_ktm_map() {
    let dir = fresh_dir("toolids");
    let s1 = start(&dir, "a", &[]);
    let user = json!({"role": "user", "content": "List the files here, please."});
    let r1 = post(
        &s1,
        &tool_chat(vec![user.clone()], &format!("Sure.{BLOCK}")),
    );
    let c = &r1["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r1}");
    let id = c["message"]["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (p1, _, _) = usage(&r1);
    let log1 = s1.terminate();
    assert!(
        log1.lines()
            .any(|l| l.contains("reason=shutdown") && l.contains("tool_ids=1")),
        "{log1}"
    );
    // The shutdown checkpoint (the longest) carries exactly the call's id
    // and sampled block; the cold one (prompt only, no block) has no map.
    let mut files: Vec<_> = checkpoints(&dir)
        .iter()
        .map(|f| (ktm_of(f), f.clone()))
        .collect();
    files.sort_by_key(|((tokens, ..), _)| *tokens);
    let ((shut_tokens, flags, entries, _, _), _) = files.last().unwrap().clone();
    assert_eq!(flags & 1, 1);
    assert_eq!(entries, vec![(id.clone(), BLOCK.to_string())]);
    assert!(shut_tokens as u64 > p1);
    let ((_, cold_flags, cold_entries, _, _), _) = &files[0];
    assert_eq!((cold_flags & 1, cold_entries.len()), (0, 0));

    // A copy of the folder without the maps (bit0 cleared, section cut):
    // the control below.
    let bare = fresh_dir("toolids_bare");
    std::fs::create_dir_all(&bare).unwrap();
    for ((_, flags, _, _, start), f) in &files {
        let mut b = std::fs::read(f).unwrap();
        b.truncate(*start);
        b[6] = flags & !1;
        std::fs::write(bare.join(f.file_name().unwrap()), b).unwrap();
    }

    // The client resends the conversation with the call as JSON (its own
    // key order) and the tool's result.
    let resend = vec![
        user,
        json!({"role": "assistant", "content": "Sure.", "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "bash", "arguments": "{\"timeout\": 10, \"command\": \"ls && pwd\"}"}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": "a.c\n/srv"}),
    ];
    let s2 = start(&dir, "b", &[]);
    let r2 = post(&s2, &tool_chat(resend.clone(), "Done."));
    let (p2, c2, _) = usage(&r2);
    assert_eq!(
        c2, shut_tokens as u64,
        "the shutdown checkpoint loads: {r2}"
    );
    assert_eq!(
        s2.metric("ds4_prompt_tokens_evaluated_total"),
        p2 - c2,
        "only the suffix is evaluated"
    );
    assert_eq!(s2.metric("ds4_kv_disk_hits_total"), 1);
    let log2 = s2.terminate();
    assert!(log2.contains("restored 1 tool ids from disk"), "{log2}");

    // Without the map the id is unknown, the call renders from the JSON,
    // and only the cold checkpoint (the prompt before the call) matches.
    let s3 = start(&bare, "c", &[]);
    let r3 = post(&s3, &tool_chat(resend, "Done."));
    let (p3, c3, _) = usage(&r3);
    assert!(c3 <= p1 && c3 < c2, "{c3} cached without the map");
    assert_ne!(p3, p2, "the call rendered differently");
    drop(s3);
}

#[test]
fn bad_kv_flags_are_refused_by_name() {
    let m = common::tiny_model_path(Variant::Q8);
    let dir = fresh_dir("flags");
    for (args, name) in [
        (&["--kv-disk-space-mb", "0"][..], "--kv-disk-space-mb"),
        (&["--kv-cache-min-tokens", "0"][..], "--kv-cache-min-tokens"),
        (
            &[
                "--kv-cache-min-tokens",
                "100",
                "--kv-cache-cold-max-tokens",
                "50",
            ][..],
            "--kv-cache-cold-max-tokens",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ds4-server"))
            .args(["-m", m.to_str().unwrap(), "--port", "0"])
            .args(["--kv-disk-dir", dir.to_str().unwrap()])
            .args(args)
            .env("DS4_LOCK_FILE", dir.with_extension("lock"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(name), "{args:?}: {err}");
    }
    assert!(!dir.exists(), "a refused start creates no folder");
}
