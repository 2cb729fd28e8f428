//! DeepSeek V4.1 through the session, the CLI and the server (issue 19
//! items 5 and 6): prefill/decode and live prefix reuse against a
//! from-scratch run, snapshots, the disk KV cache, KV checkpoints refused
//! across V4/V4.1 in both directions, the chat template's bytes against the
//! official encoder's published vectors, think levels, the V4.1 DSML round
//! trip, and the real `ds4` and `ds4-server` binaries on the tiny V4.1 model.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ds4::backend::BackendKind;
use ds4::chat::{Dialect, ThinkMode};
use ds4::kvcache::{self, DiskCache, LookupOutcome, SaveReason, StoreOutcome};
use ds4::model::forward::Numerics;
use ds4::model::{AnyModel, Arch};
use ds4::server::dsml::{self, LiveTools, ToolEvent};
use ds4::server::render::{self, NoReplay};
use ds4::server::request::{self, ParseContext};
use ds4::session::{Batch, Session, SessionOptions, SlotWork};
use ds4::testmodel::v41::{write_v41_model, V41Spec};
use ds4::testmodel::{Variant, Vocab};
use serde_json::{json, Value};

use common::server::{get, json_body, launch, lock_file, post, START_BOUND};

const CTX: usize = 256;

/// `ds4-server -m <tiny V4.1 model>` on a free port, context 512, 8 tokens
/// per answer, cpu-ref, no API key; the caller adds the rest.
fn v41_server() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("DS4_LOCK_FILE", lock_file())
        .env_remove("DS4_API_KEY")
        .arg("-m")
        .arg(v41_path())
        .args(["--port", "0", "--ctx", "512", "-n", "8"])
        .args(["--backend", "cpu-ref"]);
    cmd
}

/// The tiny V4.1 model (`ds4-make-test-model --arch deepseek41`), made
/// once per build tree.
fn v41_path() -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-models");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-v41-f32.gguf");
    if !path.exists() {
        let tmp = dir.join(format!("tiny-v41.{}.tmp", std::process::id()));
        let vocab = Vocab::load_default().unwrap();
        write_v41_model(&V41Spec::tiny(), Variant::F32, &vocab, &tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn v41_model() -> AnyModel {
    AnyModel::open(v41_path()).unwrap()
}

fn opts() -> SessionOptions {
    SessionOptions {
        ctx: CTX,
        prefill_chunk: 16,
        numerics: Numerics::Plain,
        backend: BackendKind::CpuRef,
        ..SessionOptions::default()
    }
}

fn v41_session() -> Session {
    Session::open_any(&v41_model(), opts()).unwrap()
}

fn v4_session() -> Session {
    Session::new(common::tiny_model(Variant::F32), opts()).unwrap()
}

/// Issue 36: a V4.1 session under `--numerics model` runs the official
/// rounding steps on the CPU backends and on wgpu (lavapipe in CI): its
/// logits move away from `plain`, and every backend lands near cpu-ref's
/// (tests/v41_model_numerics.rs holds cpu-ref to the float64 reference).
#[test]
fn v41_model_numerics_run_on_every_backend_and_differ_from_plain() {
    let model = v41_model();
    let with = |numerics, backend| SessionOptions {
        numerics,
        backend,
        ..opts()
    };
    let toks = ids(24, 3);
    let mut reference: Option<Vec<f32>> = None;
    for (backend, name) in [
        (BackendKind::CpuRef, "cpu-ref"),
        (BackendKind::Cpu, "cpu"),
        (BackendKind::Wgpu, "wgpu"),
    ] {
        let mut s = Session::open_any(&model, with(Numerics::Model, backend)).unwrap();
        let mut plain = Session::open_any(&model, with(Numerics::Plain, backend)).unwrap();
        // `model` is not `plain`: the rounding steps move the logits.
        let (m, p) = (s.score(&toks).unwrap(), plain.score(&toks).unwrap());
        let d = max_diff(&m, &p);
        eprintln!("{name}: max |model − plain| logit {d:.3e}");
        assert!(d > 1e-3, "{name}: model numerics changed nothing ({d:e})");
        // Every backend runs the same steps: near cpu-ref, far from plain.
        match &reference {
            None => reference = Some(m),
            Some(r) => {
                let e = max_diff(&m, r);
                eprintln!("{name}: max |model − cpu-ref model| logit {e:.3e}");
                assert!(
                    e < d / 10.0,
                    "{name}: {e:e} from cpu-ref under model numerics"
                );
            }
        }
    }
}

fn ids(n: usize, seed: u64) -> Vec<u32> {
    // Ids of the tiny vocabulary; a repeated span makes Engram rows recur.
    let mut v = common::tokens(n, seed);
    if n > 20 {
        let span: Vec<u32> = v[3..9].to_vec();
        v[12..18].copy_from_slice(&span);
    }
    v
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prefill in chunks, then decode: the logits after every token equal
/// those of one whole-prompt scoring pass; a longer prompt reuses the
/// live prefix and matches a cold run; the Engram reader counts its reads.
#[test]
fn v41_session_prefill_decode_and_live_reuse_match_a_cold_run() {
    let toks = ids(40, 7);
    let mut cold = v41_session();
    let all = cold.score(&toks).unwrap();
    let v = cold.n_vocab();
    let mut s = v41_session();
    assert_eq!(s.arch(), Arch::V41);
    let st = s.sync(&toks[..30], &mut |_, _| {}).unwrap();
    assert_eq!((st.reused, st.evaluated), (0, 30));
    let d = max_diff(s.logits(), &all[29 * v..30 * v]);
    assert!(d < 1e-4, "prefill differs by {d}");
    for (i, &t) in toks[30..35].iter().enumerate() {
        s.eval(t).unwrap();
        let p = 30 + i;
        let d = max_diff(s.logits(), &all[p * v..(p + 1) * v]);
        assert!(d < 1e-4, "decode at {p} differs by {d}");
    }
    // Live prefix reuse: the session holds 35 tokens, the request 40.
    let st = s.sync(&toks, &mut |_, _| {}).unwrap();
    assert_eq!((st.reused, st.evaluated), (35, 5));
    let d = max_diff(s.logits(), &all[39 * v..40 * v]);
    assert!(d < 1e-4, "after reuse differs by {d}");
    // A diverging prompt starts over and still matches.
    let mut other = toks.clone();
    other[20] = (other[20] + 1) % v as u32;
    let st = s.sync(&other, &mut |_, _| {}).unwrap();
    assert_eq!(st.reused, 0);
    let want = cold.score(&other).unwrap();
    let d = max_diff(s.logits(), &want[39 * v..40 * v]);
    assert!(d < 1e-4, "restart differs by {d}");
    let e = s.engram_stats().expect("a V4.1 session reads Engram rows");
    assert!(e.tokens >= 80 && e.rows_requested > 0 && e.bytes_read > 0);
    assert!(e.cache_hits > 0, "the repeated span hits the hot-row cache");
    assert!(v4_session().engram_stats().is_none());
}

/// A snapshot restores the whole V4.1 state: decode after a load equals
/// decode without the round trip.
#[test]
fn v41_snapshot_round_trips_and_decode_continues() {
    let toks = ids(33, 3);
    let mut a = v41_session();
    a.sync(&toks, &mut |_, _| {}).unwrap();
    let payload = a.save_snapshot().unwrap();
    assert_eq!(&payload[..4], b"DS41");
    let mut b = v41_session();
    b.load_snapshot(&payload).unwrap();
    assert_eq!(b.tokens(), a.tokens());
    assert_eq!(b.logits(), a.logits());
    for t in [5u32, 9, 11, 5] {
        a.eval(t).unwrap();
        b.eval(t).unwrap();
        let d = max_diff(a.logits(), b.logits());
        assert!(d < 1e-6, "after load, decode differs by {d}");
    }
}

/// A V4 payload offered to a V4.1 session, and the reverse, is refused by
/// its first word: nothing is loaded, the session is left empty.
#[test]
fn snapshots_of_the_other_family_are_refused_both_ways() {
    let toks = ids(20, 1);
    let mut v4 = v4_session();
    v4.sync(&toks, &mut |_, _| {}).unwrap();
    let mut v41 = v41_session();
    v41.sync(&toks, &mut |_, _| {}).unwrap();
    let p4 = v4.save_snapshot().unwrap();
    let p41 = v41.save_snapshot().unwrap();
    let e = v41.load_snapshot(&p4).unwrap_err().to_string();
    assert!(
        e.contains("DeepSeek V4 (deepseek4)") && e.contains("refused"),
        "{e}"
    );
    assert!(v41.tokens().is_empty());
    let e = v4.load_snapshot(&p41).unwrap_err().to_string();
    assert!(
        e.contains("DeepSeek V4.1 (deepseek41)") && e.contains("refused"),
        "{e}"
    );
    assert!(v4.tokens().is_empty());
}

/// KVC files: the header names the family (byte 7); `load_file` refuses a
/// checkpoint of the other family before reading its payload, and the
/// disk cache never picks one (a miss, the file kept), in both directions.
#[test]
fn kv_checkpoints_are_refused_by_their_header_across_v4_and_v41() {
    let dir = common::fresh_dir("v41-session", "kvc");
    let toks = ids(24, 5);
    let mut v4 = v4_session();
    v4.sync(&toks, &mut |_, _| {}).unwrap();
    let mut v41 = v41_session();
    v41.sync(&toks, &mut |_, _| {}).unwrap();
    let (f4, f41) = (dir.join("v4.kv"), dir.join("v41.kv"));
    kvcache::save_file(&f4, &v4, b"text", SaveReason::Unknown).unwrap();
    kvcache::save_file(&f41, &v41, b"text", SaveReason::Unknown).unwrap();
    let byte7 = |p: &Path| std::fs::read(p).unwrap()[7];
    assert_ne!(byte7(&f4), byte7(&f41), "the header must tell them apart");
    let (h, _) = kvcache::load_file(&f41, &mut v41).unwrap();
    assert_eq!(h.arch, Arch::V41);
    let e = kvcache::load_file(&f4, &mut v41).unwrap_err().to_string();
    assert!(e.contains("header") && e.contains("refused"), "{e}");
    assert_eq!(
        v41.tokens().len(),
        toks.len(),
        "a refused file loads nothing"
    );
    let e = kvcache::load_file(&f41, &mut v4).unwrap_err().to_string();
    assert!(e.contains("header") && e.contains("refused"), "{e}");
    assert_eq!(v4.tokens().len(), toks.len());

    // The disk cache, both ways: each family's checkpoint is a miss for
    // the other and stays on disk; each loads into its own.
    cache_keeps_families_apart(&mut v4, &mut v41, &toks);
    cache_keeps_families_apart(&mut v41, &mut v4, &toks);
}

fn cache_keeps_families_apart(writer: &mut Session, reader: &mut Session, toks: &[u32]) {
    writer.sync(toks, &mut |_, _| {}).unwrap();
    let n = toks.len();
    let cdir = common::fresh_dir("v41-session", &format!("cache-{:?}", writer.arch()));
    let cache = DiskCache::open(&common::disk_cache_config(&cdir, 0), 2)
        .unwrap()
        .unwrap();
    let text = b"a rendered prompt of some length, cached";
    let out = cache.store(
        writer,
        text,
        kvcache::CacheKey::Tokens,
        SaveReason::Cold,
        &[],
    );
    assert!(matches!(out, StoreOutcome::Stored { .. }), "{out:?}");
    let files = || std::fs::read_dir(&cdir).unwrap().count();
    assert_eq!(files(), 1);
    reader.reset();
    let hit = cache.lookup(reader, text);
    assert!(matches!(hit, LookupOutcome::Miss), "{hit:?}");
    assert!(reader.tokens().is_empty());
    assert_eq!(files(), 1, "the other family's checkpoint is kept");
    assert_eq!(cache.metrics().snapshot().load_failures, 0);
    writer.reset();
    assert!(matches!(cache.lookup(writer, text), LookupOutcome::Hit(_)));
    assert_eq!(writer.tokens().len(), n);
}

fn vectors() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v41-chat-vectors.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

const PC: ParseContext = ParseContext {
    ctx: 1 << 20,
    allow_script: false,
};

fn render_v41(body: &Value, default_level: u8) -> String {
    let mut r = request::parse_chat(body.to_string().as_bytes(), PC).unwrap();
    r.set_dialect(Dialect::V41 { default_level });
    render::render(&r, &mut NoReplay)
}

/// The V4.1 renderer against the official encoder's output as published
/// in other projects' tests (tests/data/v41-chat-vectors.json, each case
/// naming its source; tools/v41_chat_vectors.py re-derives them from the
/// encoder): byte for byte.
#[test]
fn v41_template_bytes_match_the_official_encoder_vectors() {
    let doc = vectors();
    let default = doc["default_level"].as_u64().unwrap() as u8;
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let mut got = render_v41(&c["request"], default);
        if let Some(from) = c["expected_from"].as_str() {
            let at = got
                .find(from)
                .unwrap_or_else(|| panic!("{name}: no {from:?} in {got:?}"));
            got = got[at..].to_string();
        }
        if let Some(want) = c["expected"].as_str() {
            assert_eq!(got, want, "{name}");
        }
        for s in c["expected_contains"].as_array().into_iter().flatten() {
            assert!(got.contains(s.as_str().unwrap()), "{name}: missing {s}");
        }
        for s in c["expected_absent"].as_array().into_iter().flatten() {
            assert!(!got.contains(s.as_str().unwrap()), "{name}: has {s}");
        }
    }
    // V4 requests render as before (PROMPT.md example 2).
    let body = json!({"messages":[{"role":"user","content":"What is 2+2?"}]});
    let r = request::parse_chat(body.to_string().as_bytes(), PC).unwrap();
    assert_eq!(
        render::render(&r, &mut NoReplay),
        "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>"
    );
}

/// Think levels: effort names and numbers of the official API, the
/// server's default, and `0` = no thinking.
#[test]
fn think_levels_from_requests_and_the_server_default() {
    let line = |l: u8| {
        format!(
            "Reasoning Effort: {l} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
        )
    };
    let user = json!([{"role":"user","content":"Hi"}]);
    let with = |extra: Value| {
        let mut b = json!({"messages": user});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (extra, level) in [
        (json!({}), 75),
        (json!({"reasoning_effort":"low"}), 50),
        (json!({"reasoning_effort":"high"}), 75),
        (json!({"reasoning_effort":"max"}), 100),
        (json!({"reasoning_effort":30}), 30),
        (json!({"reasoning_effort":100}), 100),
    ] {
        let got = render_v41(&with(extra.clone()), 75);
        let want = format!(
            "<｜begin▁of▁sentence｜><｜System｜>{}<｜User｜>Hi<｜Assistant｜><think>",
            line(level)
        );
        assert_eq!(got, want, "{extra}");
    }
    let none = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>";
    for extra in [
        json!({"reasoning_effort":"none"}),
        json!({"reasoning_effort":0}),
        json!({"thinking":{"type":"disabled"}}),
    ] {
        assert_eq!(render_v41(&with(extra.clone()), 75), none, "{extra}");
    }
    // Server default 40; 0 = a request that says nothing does not think
    // (and its output is then not parsed as reasoning).
    assert!(render_v41(&with(json!({})), 40).contains(&line(40)));
    assert_eq!(render_v41(&with(json!({})), 0), none);
    let mut r = request::parse_chat(with(json!({})).to_string().as_bytes(), PC).unwrap();
    r.set_dialect(Dialect::V41 { default_level: 0 });
    assert_eq!(r.mode, ThinkMode::None);
    assert!(render_v41(&with(json!({"reasoning_effort":"high"})), 0).contains(&line(75)));
    // Out of range is a 400, not a clamp.
    let bad = with(json!({"reasoning_effort":101}));
    assert!(request::parse_chat(bad.to_string().as_bytes(), PC).is_err());
    // The CLI's mapping of levels onto V4's modes.
    assert_eq!(ThinkMode::of_level(0), ThinkMode::None);
    assert_eq!(ThinkMode::of_level(40), ThinkMode::High);
    assert_eq!(ThinkMode::of_level(100), ThinkMode::Max);
}

/// DSML with the V4.1 spelling: the canonical block the renderer writes
/// parses back to the same calls (whole and streamed), entities are not
/// decoded in V4.1 string values, and V4 blocks parse as before.
#[test]
fn v41_dsml_round_trips_through_the_parser() {
    let body = json!({"messages":[
        {"role":"user","content":"go"},
        {"role":"assistant","content":"","tool_calls":[
            {"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls && echo &amp;\",\"timeout\":10,\"env\":{\"A\":[1,2]}}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"ok"}],
        "tools":[{"type":"function","function":{"name":"bash","parameters":{"type":"object"}}}]});
    let text = render_v41(&body, 75);
    let block = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"bash\">\n<｜DSML｜ parameter name=\"command\" string=\"true\">ls && echo &amp;</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"timeout\" string=\"false\">10</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"env\" string=\"false\">{\"A\": [1, 2]}</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    assert!(text.contains(block), "{text}");
    let out = format!("Let me look.</think>Sure.{block}");
    let p = dsml::parse_output(&out, true);
    assert!(!p.failed, "{p:?}");
    assert_eq!(p.reasoning.as_deref(), Some("Let me look."));
    assert_eq!(p.content, "Sure.");
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].name, "bash");
    let args: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
    assert_eq!(
        args,
        json!({"command":"ls && echo &amp;","timeout":10,"env":{"A":[1,2]}})
    );
    assert_eq!(p.raw_dsml.as_deref(), Some(block));
    // Streamed a few bytes at a time, the fragments build the same call.
    let (pos, v) = dsml::block_start(out.as_bytes()).unwrap();
    let open = dsml::block_open(v);
    assert_eq!(open, "<｜DSML｜ calls>");
    let after = &out[pos + out[pos..].find(open).unwrap() + open.len()..];
    let mut lt = LiveTools::new(v);
    let mut args_text = String::new();
    let mut name = String::new();
    let chars: Vec<char> = after.chars().collect();
    for piece in chars.chunks(3) {
        for e in lt.push(&piece.iter().collect::<String>()) {
            match e {
                ToolEvent::Start(n) => name = n,
                ToolEvent::Args(a) => args_text.push_str(&a),
                ToolEvent::End => {}
            }
        }
    }
    assert!(!lt.broken());
    assert_eq!(name, "bash");
    let streamed: Value = serde_json::from_str(&args_text).unwrap();
    assert_eq!(streamed, args);
    // V4's spelling parses as before, entities decoded.
    let v4 = "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">a &amp; b</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let p = dsml::parse_output(v4, true);
    assert_eq!(p.calls[0].arguments, r#"{"x":"a & b"}"#);
}

fn ds4() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4"));
    c.args([
        "--backend",
        "cpu-ref",
        "--ctx",
        "256",
        "--temp",
        "0",
        "-n",
        "6",
    ]);
    c
}

/// `ds4 -m v41.gguf -p …` generates, prints the Engram line, honours
/// `--think-level`, and refuses bad levels; the REPL's /save and /load
/// keep a V4.1 transcript.
#[test]
fn ds4_cli_runs_the_tiny_v41_model() {
    let m = v41_path();
    let run = |extra: &[&str]| {
        let out = ds4().arg("-m").arg(&m).args(extra).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = run(&["-p", "hello"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("DeepSeek V4.1"), "{err}");
    // `--numerics model` (the default) runs every official step on V4.1
    // (issue 36): nothing to warn about, under either numerics.
    assert!(!err.contains("warning"), "{err}");
    let (code, _, plain) = run(&["-p", "hello", "--numerics", "plain"]);
    assert_eq!(code, Some(0), "{plain}");
    assert!(!plain.contains("warning"), "{plain}");
    let line = err
        .lines()
        .find(|l| l.starts_with("ds4: engram: "))
        .unwrap_or_else(|| panic!("no engram line: {err}"));
    assert!(line.contains("bytes read per token") && line.contains("hit rate"));
    // Same seedless greedy run, levels 0 and 30: different prompts.
    let (c0, out0, e0) = run(&["-p", "hello", "--think-level", "0"]);
    let (c30, _, e30) = run(&["-p", "hello", "--think-level", "30"]);
    assert_eq!((c0, c30), (Some(0), Some(0)), "{e0}{e30}");
    let _ = out0;
    // The prompt token counts show the effort line is there at 30, not at 0.
    let prefill_tokens = |e: &str| {
        e.lines()
            .find_map(|l| l.strip_prefix("ds4: engram: "))
            .and_then(|l| l.split(" over ").nth(1))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap()
    };
    assert!(prefill_tokens(&e30) > prefill_tokens(&e0) + 10);
    let (code, _, err) = run(&["-p", "hello", "--think-level", "101"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--think-level must be in 0..=100"), "{err}");
    let (code, _, err) = run(&["-p", "hello", "--think-level", "5", "--nothink"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--think-level"), "{err}");
}

/// `ds4-server -m v41.gguf`: the model ids, a chat completion, a streamed
/// tool-free answer, `/metrics` with the Engram counters, the disk KV
/// cache storing and reusing a V4.1 checkpoint; a V4 checkpoint in the
/// same folder is never loaded.
#[test]
fn ds4_server_serves_the_tiny_v41_model() {
    let dir = common::fresh_dir("v41-session", "server-cache");
    // A V4 checkpoint already in the folder, for the same text the V4.1
    // server will render: it must be left alone.
    let mut cmd = v41_server();
    cmd.args(["--think-level", "40", "--kv-disk-dir"])
        .arg(&dir)
        .args(common::server::SMALL_SAVES);
    let log = common::server::temp_path("v41-server");
    let s = launch(cmd, log.clone(), START_BOUND);
    // The default numerics are `model`, which V4.1 runs whole (issue 36):
    // nothing to warn about at start.
    let started = std::fs::read_to_string(&log).unwrap();
    assert!(
        !started.lines().any(|l| l.contains("warning: --numerics")),
        "{started}"
    );
    let models = json_body(&get(&s.addr, "/v1/models"));
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["deepseek-v4-flash", "deepseek-v4-pro"]);
    assert_eq!(models["data"][0]["name"], "DeepSeek V4.1 Flash");
    assert!(get(&s.addr, "/v1/models/deepseek-v4-pro").starts_with("HTTP/1.1 200"));
    let long = "tell me a story about a lighthouse keeper and the sea, ".repeat(3);
    let turn1 = json!([{"role":"user","content":long}]);
    let ask = |msgs: &Value| {
        let body = json!({"model":"deepseek-v4-flash","messages":msgs,"max_tokens":4,
            "temperature":0,"reasoning_effort":"none"});
        json_body(&post(&s.addr, "/v1/chat/completions", &body))
    };
    let r1 = ask(&turn1);
    assert_eq!(r1["object"], "chat.completion", "{r1}");
    assert!(r1["usage"]["prompt_tokens"].as_u64().unwrap() > 20);
    // The next turn continues the live session (live prefix reuse).
    let reply = r1["choices"][0]["message"]["content"].as_str().unwrap();
    let turn2 = json!([{"role":"user","content":long},
        {"role":"assistant","content":reply},
        {"role":"user","content":"and then?"}]);
    let r2 = ask(&turn2);
    let cached = |r: &Value| {
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
    };
    assert!(cached(&r2) > 20, "live reuse: {r2}");
    // The first turn again: the live session has moved on, so the cold
    // checkpoint on disk (a V4.1 one) is what brings it back.
    let r3 = ask(&turn1);
    assert!(cached(&r3) > 0, "disk checkpoint: {r3}");
    // A request that thinks (at the server's --think-level 40).
    let body = json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":2});
    let r4 = json_body(&post(&s.addr, "/v1/chat/completions", &body));
    assert_eq!(r4["object"], "chat.completion", "{r4}");
    // /metrics: the Engram counters (set after each job).
    let t0 = Instant::now();
    let text = loop {
        let t = get(&s.addr, "/metrics");
        if t.contains("ds4_engram_bytes_per_token") || t0.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        common::server::metric(&text, "ds4_engram_tokens_total") > 20,
        "{text}"
    );
    assert!(text.contains("ds4_engram_hit_rate"), "{text}");
    assert!(
        common::server::metric(&text, "ds4_kv_disk_hits_total") >= 1,
        "{text}"
    );
    let log = s.terminate();
    assert!(log.contains("ds4-server"), "{log}");
    // The cache folder holds V4.1 checkpoints (byte 7 names the family).
    let kvs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "kv"))
        .collect();
    assert!(!kvs.is_empty(), "no checkpoint written: {log}");
    for e in &kvs {
        let b = std::fs::read(e.path()).unwrap();
        let h = ds4::kvcache::file::KvcHeader::decode(b[..48].try_into().unwrap()).unwrap();
        assert_eq!(h.arch, Arch::V41);
    }
}

/// Several slots on a V4.1 model (`--batched-session N`): the slots step
/// one after another (a session per slot; V4.1's pass is not recorded over
/// several state sets yet), so each slot's logits after every piece are its
/// own session's, bit for bit, whatever else ran in the step: prompts of
/// different lengths, start times and piece sizes, one piece scored at
/// every row. A slot's snapshot restores into another slot.
#[test]
fn v41_batch_slots_equal_their_sessions_run_alone() {
    let model = v41_model();
    let mut b = Batch::open_any(&model, opts(), 3).unwrap();
    assert_eq!(b.slots(), 3);
    assert!(
        b.backend_notice().contains("one step per slot: V4.1"),
        "{}",
        b.backend_notice()
    );
    assert_eq!(b.model().arch(), Arch::V41);
    // (tokens, first step, piece lengths, the piece scored at every row)
    let plans: [(Vec<u32>, usize, Vec<usize>, usize); 3] = [
        (ids(40, 1), 0, vec![21, 1, 14, 1, 1, 1, 1], 2),
        (ids(26, 2), 1, vec![5, 1, 1, 17, 1, 1], 9),
        (ids(33, 3), 3, vec![30, 1, 1, 1], 0),
    ];
    let mut alone: Vec<Session> = (0..3).map(|_| v41_session()).collect();
    let (mut next, mut done) = ([0usize; 3], [0usize; 3]);
    let mut step = 0;
    let mut shared_steps = 0;
    while (0..3).any(|i| next[i] < plans[i].2.len()) {
        let mut work = Vec::new();
        for (i, (toks, start, pieces, every)) in plans.iter().enumerate() {
            if step >= *start && next[i] < pieces.len() {
                let (a, z) = (done[i], done[i] + pieces[next[i]]);
                work.push(SlotWork {
                    slot: i,
                    tokens: &toks[a..z],
                    all_logits: next[i] == *every,
                });
            }
        }
        shared_steps += usize::from(work.len() > 1);
        b.step(&work).unwrap();
        for w in &work {
            let i = w.slot;
            let want_rows = if w.all_logits {
                alone[i].score_more(w.tokens).unwrap()
            } else {
                let z = done[i] + w.tokens.len();
                alone[i].sync(&plans[i].0[..z], &mut |_, _| {}).unwrap();
                Vec::new()
            };
            let same = |a: &[f32], b: &[f32]| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            };
            assert!(
                same(b.logits(i), alone[i].logits()),
                "slot {i}, piece {}: logits differ from its session alone",
                next[i]
            );
            assert!(same(b.piece_logits(i), &want_rows), "slot {i} rows");
            if w.all_logits {
                assert_eq!(want_rows.len(), w.tokens.len() * alone[i].n_vocab());
            }
            done[i] += w.tokens.len();
            next[i] += 1;
        }
        step += 1;
    }
    assert!(shared_steps >= 4, "{shared_steps} steps held several slots");
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(b.tokens(i), &p.0[..], "slot {i} holds its tokens");
    }
    // Slot 0's state into slot 2: the next token gives the same logits.
    let snap = b.save_snapshot(0).unwrap();
    b.reset(2);
    b.load_snapshot(2, &snap).unwrap();
    assert_eq!(b.tokens(2), b.tokens(0));
    let t = [5u32];
    for slot in [0, 2] {
        b.step(&[SlotWork {
            slot,
            tokens: &t,
            all_logits: false,
        }])
        .unwrap();
    }
    assert_eq!(b.logits(0), b.logits(2));
    // A V4 snapshot is refused by a V4.1 slot, which is left empty.
    let mut v4 = v4_session();
    v4.sync(&ids(10, 4), &mut |_, _| {}).unwrap();
    assert!(b.load_snapshot(1, &v4.save_snapshot().unwrap()).is_err());
    assert!(b.tokens(1).is_empty());
}

/// `ds4-server -m v41.gguf --batched-session 3`: three requests at once
/// each get the answer they get alone, with the disk KV cache on.
#[test]
fn ds4_server_serves_v41_requests_in_slots() {
    let dir = common::fresh_dir("v41-session", "slots-cache");
    let mut cmd = v41_server();
    cmd.args(["--batched-session", "3"])
        .args(["--mixed-prefill-quantum", "16", "--kv-disk-dir"])
        .arg(&dir)
        .args(common::server::SMALL_SAVES);
    let s = launch(cmd, common::server::temp_path("v41-slots"), START_BOUND);
    assert!(
        s.stderr_text().contains("3 KV slots ×"),
        "{}",
        s.stderr_text()
    );
    let bodies: Vec<Value> = [
        "tell me a story about a lighthouse keeper and the sea",
        "list three colours",
        "what is the capital of a small island nation, and why does it matter so much to the people",
    ]
    .iter()
    .map(|q| {
        json!({"messages":[{"role":"user","content":q}],"max_tokens":6,
            "temperature":0,"reasoning_effort":"none"})
    })
    .collect();
    let answer = |addr: &str, body: &Value| {
        let r = json_body(&post(addr, "/v1/chat/completions", body));
        assert_eq!(r["object"], "chat.completion", "{r}");
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let alone: Vec<String> = bodies.iter().map(|b| answer(&s.addr, b)).collect();
    let go = std::sync::Arc::new(std::sync::Barrier::new(bodies.len()));
    let together: Vec<String> = bodies
        .iter()
        .cloned()
        .map(|b| {
            let (addr, go) = (s.addr.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                answer(&addr, &b)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(alone, together);
    assert!(s.metric("ds4_batch_max_step_slots") >= 2);
    assert_eq!(s.metric("ds4_slots"), 3);
    // The Engram counters sum the slots' readers.
    assert!(s.metric("ds4_engram_tokens_total") > 60);
    let log = s.terminate();
    let kvs = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "kv"))
        .count();
    assert!(kvs > 0, "no checkpoint written: {log}");
}

/// `<｜System｜>` is one control token where the vocabulary has it (the
/// V4.1 tokenizer) and plain text where it does not (the V4 tokenizer, whose
/// chat text must tokenize exactly as before).
#[test]
fn the_system_marker_is_a_chat_marker_only_where_the_vocabulary_has_it() {
    use ds4::tokenizer::{markers, Tokenizer};
    let text = format!("{}Reasoning Effort: 50{}hi", markers::SYSTEM, markers::USER);
    let v = Vocab::load_default().expect("the V4 tokenizer.json");
    let v4 = Tokenizer::from_vocab(
        v.tokens.clone(),
        v.merges.clone(),
        Some(v.token_types.clone()),
    )
    .unwrap();
    assert_eq!(v4.token_id(markers::SYSTEM), None);
    let user = v4.specials().user;
    let mut plain = v4.encode_plain(&format!("{}Reasoning Effort: 50", markers::SYSTEM));
    plain.push(user);
    plain.extend(v4.encode_plain("hi"));
    assert_eq!(v4.encode_chat(&text), plain);

    let (mut tokens, mut types) = (v.tokens, v.token_types);
    tokens.push(markers::SYSTEM.to_string());
    types.push(3);
    let v41 = Tokenizer::from_vocab(tokens, v.merges, Some(types)).unwrap();
    let system = v41.token_id(markers::SYSTEM).expect("the added marker");
    let mut want = vec![system];
    want.extend(v41.encode_plain("Reasoning Effort: 50"));
    want.push(user);
    want.extend(v41.encode_plain("hi"));
    assert_eq!(v41.encode_chat(&text), want);
}

/// The weights a decoded token reads, from the tensor directory of the
/// file by name (one embedding row, every dense tensor, top-k of n of each
/// routed-expert tensor, no Engram table), against the model's own
/// accounting; the resident bytes are everything but the tables.
#[test]
fn v41_weight_bytes_per_token_match_the_tensor_directory() {
    let AnyModel::V41(m) = v41_model() else {
        panic!("the tiny V4.1 model opened as V4")
    };
    let c = &m.config;
    let infos = m.file.tensor_infos();
    // Every tensor of the file is bound, so the directory is the model.
    assert_eq!(infos.len(), m.weights.all().len());
    let (mut active, mut tables, mut total) = (0u64, 0u64, 0u64);
    for t in infos {
        total += t.n_bytes;
        if t.name.ends_with(".engram_embd.weight") {
            tables += t.n_bytes;
        } else if t.name == "token_embd.weight" {
            active += t.n_bytes / c.n_vocab as u64;
        } else if t.name.contains("_exps.") {
            active += t.n_bytes / c.n_expert as u64 * c.n_expert_used as u64;
        } else {
            active += t.n_bytes;
        }
    }
    // The tiny tables: 420 and 508 rows of 32 E4M3 codes + 1 scale.
    assert_eq!(tables, (420 + 508) * 33);
    assert_eq!(m.weights.engram_table_bytes(), tables);
    assert_eq!(m.weights.resident_bytes(), total - tables);
    assert_eq!(m.weights.active_bytes_per_token(c), active);
    let mix: u64 = m.weights.type_mix().iter().map(|s| s.bytes).sum();
    assert_eq!(mix, total);
    assert_eq!(ds4::app::report::v41_engram_cold_bytes(c), 2 * 4 * 33);
}

fn ds4_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4-bench"))
}

/// `ds4-bench -m v41.gguf`: one CSV row per frontier with the weight bytes
/// per token (the model's accounting), the Engram bytes read per token and
/// hit rates (consistent with each other: every miss reads one 33-byte row,
/// 8 lookups a token), and the roofline percentage from those bytes; a V4
/// file keeps its columns unless `--roofline`; V4-only options are refused.
#[test]
fn ds4_bench_runs_a_v41_file_with_bytes_and_hit_rates() {
    let m = v41_path();
    let dir = common::fresh_dir("v41-session", "bench");
    let prompt = dir.join("p.txt");
    std::fs::write(
        &prompt,
        "the cat sat on the mat, and the dog sat too. ".repeat(20),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let o = ds4_bench()
            .arg("-m")
            .arg(&m)
            .arg("--prompt-file")
            .arg(&prompt)
            .args([
                "--backend",
                "cpu-ref",
                "--ctx-start",
                "32",
                "--ctx-max",
                "96",
            ])
            .args(["--step-incr", "32", "-n", "6"])
            .args(extra)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,\
         weight_bytes_per_token,prefill_engram_bytes_per_token,prefill_engram_hit_pct,\
         gen_engram_bytes_per_token,gen_engram_hit_pct,read_gbps,gen_roofline_pct"
    );
    let AnyModel::V41(model) = v41_model() else {
        panic!()
    };
    let weights = model.weights.active_bytes_per_token(&model.config);
    let rows: Vec<Vec<f64>> = lines[1..]
        .iter()
        .map(|l| l.split(',').map(|x| x.parse::<f64>().unwrap()).collect())
        .collect();
    assert_eq!(
        rows.iter().map(|r| r[0] as u64).collect::<Vec<_>>(),
        [32, 64, 96]
    );
    let per_token = 8.0 * 33.0;
    for r in &rows {
        assert_eq!(r[6] as u64, weights, "{r:?}");
        // bytes = misses × 33 = lookups × (1 − hit) × 33, per token.
        for (bytes, hit) in [(r[7], r[8]), (r[9], r[10])] {
            assert!((0.0..=100.0).contains(&hit), "{r:?}");
            let want = per_token * (1.0 - hit / 100.0);
            assert!((bytes - want).abs() <= 1.0, "{bytes} vs {want}: {r:?}");
        }
        // The roofline: (weights + Engram) per decoded token × tokens/s ÷ bandwidth.
        let (tps, gbps, pct) = (r[4], r[11], r[12]);
        assert!(tps > 0.0 && gbps > 0.0 && pct > 0.0, "{r:?}");
        let want = 100.0 * (r[6] + r[9]) * tps / (gbps * 1e9);
        assert!((pct - want).abs() <= 0.05 * want + 0.1, "{pct} vs {want}");
    }
    // The prompt repeats itself: later frontiers find rows in the cache.
    assert!(rows[2][8] > 50.0, "{rows:?}");
    // The run's whole line: lookups = 8 per token over every evaluated token.
    let line = err
        .lines()
        .find(|l| l.starts_with("ds4-bench: engram: "))
        .unwrap_or_else(|| panic!("no engram line: {err}"));
    assert!(line.contains("hot-row hit rate"), "{line}");
    assert!(err.contains("DeepSeek V4.1: Engram tables"), "{err}");

    // A one-row cache: nearly every lookup misses, so more bytes per token.
    let (code, out1, err1) = run(&["--engram-cache-rows", "1"]);
    assert_eq!(code, Some(0), "{err1}");
    let last = |o: &str| -> Vec<f64> {
        o.lines()
            .last()
            .unwrap()
            .split(',')
            .map(|x| x.parse().unwrap())
            .collect()
    };
    assert!(last(&out1)[7] > last(&out)[7], "{out1}\n{out}");

    // Options that do not apply to V4.1 are errors naming the file's family.
    for bad in [
        &["--sessions", "1,2"][..],
        &["--ssd-streaming"][..],
        &["--engram-cache-rows", "0"][..],
    ] {
        let (code, _, err) = run(bad);
        assert_eq!(code, Some(1), "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("ds4-bench: "), "{err}");
    }
    let (_, _, err) = run(&["--sessions", "1"]);
    assert!(err.contains("DeepSeek V4.1 file"), "{err}");

    // V4: the columns it always had, and with --roofline the weights of
    // its own accounting; the Engram options are refused.
    let v4 = common::tiny_model_path(Variant::Q8);
    let run4 = |extra: &[&str]| {
        ds4_bench()
            .arg("-m")
            .arg(&v4)
            .arg("--prompt-file")
            .arg(&prompt)
            .args(["--ctx-start", "32", "--ctx-max", "32", "-n", "2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = run4(&["--roofline"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut l = out.lines();
    assert_eq!(
        l.next().unwrap(),
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,\
         weight_bytes_per_token,read_gbps,gen_roofline_pct"
    );
    let row: Vec<&str> = l.next().unwrap().split(',').collect();
    let m4 = common::tiny_model(Variant::Q8);
    assert_eq!(
        row[6].parse::<u64>().unwrap(),
        m4.weights.active_bytes_per_token(&m4.config)
    );
    let o = run4(&["--engram-cold"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("V4.1 files only"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `ds4 --info` on a V4.1 file: the family, the layer roles (the tiny
/// geometry of docs/V41.md), both Engram tables with their sizes, the
/// resident bytes (all but the tables) and the roofline section.
#[test]
fn ds4_info_describes_a_v41_file() {
    let m = v41_path();
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .arg("-m")
        .arg(&m)
        .args(["--info", "--cpu"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{}{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("DeepSeek V4.1 (general.architecture deepseek41)"),
        "{out}"
    );
    assert!(
        out.contains("layer roles          W W S2 U2<2/2 S1 U1<4/4 R1<4 U1<4/6 "),
        "{out}"
    );
    let table = |l: &str| {
        out.lines()
            .find(|x| x.starts_with(&format!("table blk.{l} ")))
            .unwrap_or_else(|| panic!("no table line for {l}: {out}"))
    };
    assert!(table("1").contains(" 420 rows, 13860 bytes "), "{out}");
    assert!(table("4").contains(" 508 rows, 16764 bytes "), "{out}");
    assert!(out.contains("at most 264 bytes"), "{out}");
    let AnyModel::V41(model) = v41_model() else {
        panic!()
    };
    let num = |key: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key}: {out}"))
    };
    let dir_total: u64 = model.file.tensor_infos().iter().map(|t| t.n_bytes).sum();
    assert_eq!(num("total weight bytes:"), dir_total);
    assert_eq!(num("resident weight bytes:"), dir_total - (420 + 508) * 33);
    assert_eq!(
        num("active weight bytes per token:"),
        model.weights.active_bytes_per_token(&model.config)
    );
    assert!(out.contains("== decode roofline =="), "{out}");
    assert!(out.contains("decode ceiling"), "{out}");
}

/// The strict-tool grammar in each dialect's DSML spelling, over the V4.1
/// tokenizer: V4.1's takes a `<｜DSML｜ calls>` block and refuses V4's
/// `tool_calls`, V4's the reverse; the accepted V4.1 block parses back
/// into the call.
#[test]
fn strict_tool_grammar_uses_each_dialects_spelling() {
    use ds4::constrain::{GrammarEngine, OutputGrammar};
    use ds4::server::strict;
    use ds4::Tokenizer;
    let model = v41_model();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let body = json!({"tools": [{"type": "function", "function": {"name": "bash", "strict": true,
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 600}},
            "required": ["command"]}}}],
        "tool_choice": "required"});
    let g = strict::parse(body.as_object().unwrap()).unwrap().unwrap();
    assert!(g.forced);
    let dsml_id = tok.specials().dsml;
    let v41 = g.lark(dsml_id, Dialect::V41 { default_level: 75 });
    let v4 = g.lark(dsml_id, Dialect::V4);
    assert!(
        v41.contains(r#"" calls>\n""#) && !v41.contains("tool_calls"),
        "{v41}"
    );
    assert!(v41.contains(r#"" invoke name=\"""#), "{v41}");
    assert!(
        v41.contains(r#"" parameter name=\"command\" string=\"true\">""#),
        "{v41}"
    );
    assert!(
        v4.contains(r#""tool_calls>\n""#) && !v4.contains(" calls"),
        "{v4}"
    );
    let accepts = |grammar: &str, text: &str| -> bool {
        let mut c = engine
            .constraint(&OutputGrammar::Lark(grammar.to_string()))
            .unwrap();
        for t in tok.encode_chat(text) {
            if !c.allowed().unwrap().is_allowed(t) {
                return false;
            }
            c.commit(t).unwrap();
        }
        c.accepting()
    };
    let block41 = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"bash\">\n<｜DSML｜ parameter name=\"command\" string=\"true\">ls -la</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"timeout\" string=\"false\">10</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    let block4 = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls -la</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    assert!(accepts(&v41, block41));
    assert!(!accepts(&v41, block4));
    assert!(accepts(&v4, block4));
    assert!(!accepts(&v4, block41));
    assert!(!accepts(&v41, &block41.replace(">10<", ">9999<")));
    let p = dsml::parse_output(&format!("</think>{block41}"), true);
    assert_eq!(p.calls.len(), 1, "{p:?}");
    assert_eq!(p.calls[0].name, "bash");
    let args: Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
    assert_eq!(args, json!({"command": "ls -la", "timeout": 10}));
}

/// `ds4-server -m v41.gguf` with a strict tool and `tool_choice` forcing
/// it: the random model's answer is a V4.1-spelled DSML block (the trace's
/// generated text), returned as an OpenAI tool call whose arguments satisfy
/// the schema.
#[test]
fn ds4_server_forces_a_strict_tool_call_in_v41_tags() {
    let trace = common::server::temp_path("v41-strict-trace");
    let mut cmd = v41_server();
    cmd.arg("--trace").arg(&trace);
    let log = common::server::temp_path("v41-strict-server");
    let s = launch(cmd, log, START_BOUND);
    let tool = json!({"type": "function", "function": {"name": "weather", "description": "t",
        "strict": true, "parameters": {"type": "object", "properties": {
            "city": {"enum": ["Paris", "Oslo", "Lima"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": false}}});
    for (i, choice) in [
        json!("required"),
        json!({"type": "function", "function": {"name": "weather"}}),
    ]
    .iter()
    .enumerate()
    {
        let body = json!({"messages": [{"role": "user", "content": "weather?"}],
            "reasoning_effort": "none", "max_tokens": 200, "temperature": i as f64, "seed": 5,
            "tools": [tool], "tool_choice": choice, "parallel_tool_calls": false});
        let v = json_body(&post(&s.addr, "/v1/chat/completions", &body));
        assert_eq!(
            v["choices"][0]["finish_reason"], "tool_calls",
            "{choice}: {v}"
        );
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["function"]["name"], "weather");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        let o = args.as_object().unwrap();
        assert_eq!(o.len(), 2, "{args}");
        assert!(
            ["Paris", "Oslo", "Lima"].contains(&o["city"].as_str().unwrap()),
            "{args}"
        );
        assert!((1..=7).contains(&o["days"].as_i64().unwrap()), "{args}");
    }
    s.terminate();
    let t = std::fs::read_to_string(&trace).unwrap();
    let generated: Vec<&str> = t
        .split("--- generated text ---\n")
        .skip(1)
        .map(|x| x.split("\n\n--- parsed message ---").next().unwrap())
        .collect();
    assert_eq!(generated.len(), 2, "{t}");
    for g in generated {
        assert!(
            g.starts_with("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"weather\">\n"),
            "{g}"
        );
        assert!(g.contains("</｜DSML｜ invoke>\n</｜DSML｜ calls>"), "{g}");
        assert!(!g.contains("tool_calls"), "{g}");
    }
    let _ = std::fs::remove_file(&trace);
}

/// `--ssd-streaming` on a V4.1 file: the routed experts read from the GGUF
/// into a cache of k (every step evicts) or k + 1 slots per layer give the
/// resident run's logits bit for bit and its greedy tokens, on both CPU
/// backends (the Engram tables are read by their own reader either way).
#[test]
fn v41_streamed_experts_give_bit_identical_logits_on_the_cpu_backends() {
    for backend in [BackendKind::CpuRef, BackendKind::Cpu] {
        v41_streaming_is_exact(backend, &[1, 2, 3, 17, 33, 40], 10, 3);
    }
}

/// The same on wgpu, the cache's slots in device memory (lavapipe, ~20 s:
/// one case, the smallest budget, and a shorter run).
#[test]
fn v41_streamed_experts_give_bit_identical_logits_on_wgpu() {
    v41_streaming_is_exact(BackendKind::Wgpu, &[1, 2, 17], 3, 1);
}

/// Logits after prefill pieces ending at `ends`, then `decode` greedy
/// tokens, with the first `n_cases` streaming set-ups against the resident
/// run on `backend`.
fn v41_streaming_is_exact(backend: BackendKind, ends: &[usize], decode: usize, n_cases: usize) {
    use ds4::backend::BackendOptions;
    let model = v41_model();
    let AnyModel::V41(m) = &model else {
        panic!("the tiny V4.1 file opens as V4.1")
    };
    let (n_expert, k) = (m.config.n_expert, m.config.n_expert_used);
    let prompt = ids(*ends.last().unwrap(), 7);
    let run = |s: &mut Session| {
        let mut rows = Vec::new();
        for &end in ends {
            s.sync(&prompt[..end], &mut |_, _| {}).unwrap();
            rows.push(s.logits().iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        let mut out = Vec::new();
        for _ in 0..decode {
            let next = ds4::sampler::argmax(s.logits()) as u32;
            out.push(next);
            s.eval(next).unwrap();
            rows.push(s.logits().iter().map(|x| x.to_bits()).collect());
        }
        (rows, out)
    };
    let base = SessionOptions { backend, ..opts() };
    let (want, want_out) = run(&mut Session::open_any(&model, base.clone()).unwrap());
    for so in common::streaming_cases(k).into_iter().take(n_cases) {
        let (slots, policy, full) = (common::case_slots(&so), so.policy, so.full_layers);
        let o = SessionOptions {
            backend_options: BackendOptions {
                ssd_streaming: Some(so),
                ..BackendOptions::default()
            },
            ..base.clone()
        };
        let mut s = Session::open_any(&model, o).unwrap();
        let cache = s.expert_cache().expect("a streaming backend has a cache");
        let (got, out) = run(&mut s);
        let what = format!("V4.1 {backend:?} {slots} slots {policy:?} full layers {full}");
        let plan = cache.plan().expect("planned at the first graph").clone();
        assert_eq!((plan.slots, plan.full_layers), (slots, full), "{what}");
        assert_eq!(out, want_out, "{what}: greedy output");
        assert!(got == want, "{what}: logits differ from the resident run");
        let st = cache.stats();
        eprintln!("{what}: {}", st.line());
        assert!(slots < n_expert);
        assert!(st.misses > 0 && st.hits > 0, "{what}: {st:?}");
        assert!(st.bytes_read > 0 && st.lookups == st.hits + st.misses);
    }
}
