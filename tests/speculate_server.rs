//! Speculative decoding in the server and the binaries (issue 35): the
//! server streams the same text with and without speculation (greedy and
//! seeded sampling, a scripted DSML tool call), reports drafted and kept
//! tokens per request and the acceptance in `/metrics`; `ds4` prints the
//! same text with `--spec lookup`; bad flag combinations are refused
//! clearly; `ds4-server --batched-session 2 --spec lookup` is refused at
//! start.

mod common;

use common::process::ds4;

use std::process::Command;
use std::sync::Arc;

use common::in_process::tiny_worker_with;
use ds4::server::job;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::speculate::lookup::PromptLookup;
use ds4::speculate::{Policy, Speculator};
use ds4::testmodel::Variant;
use serde_json::{json, Value};

const CTX: usize = 768;

fn server(spec: Option<Speculator>) -> Arc<State> {
    let (queue, metrics, _tok) = tiny_worker_with(CTX, Box::new(job::NoCache), spec);
    state(queue, metrics)
}

/// The server over a session that drafts with the tiny model's MTP block
/// or its DSpark drafter (drafts of 3, fixed, so every step verifies).
fn model_drafter_server(dspark: bool) -> Arc<State> {
    use ds4::session::DraftModel;
    use ds4::speculate::draft_model::ModelDrafter;
    let mut m = ds4::model::ModelFile::open(common::tiny_model_path(Variant::Q8)).unwrap();
    let (drafter, model_drafter) = if dspark {
        m.attach_dspark(dspark_file("server")).unwrap();
        (DraftModel::Dspark, ModelDrafter::DSPARK)
    } else {
        m.attach_mtp(mtp_file("server")).unwrap();
        (DraftModel::Mtp, ModelDrafter::MTP)
    };
    let sess = ds4::session::Session::new(
        Arc::new(m),
        ds4::session::SessionOptions {
            ctx: CTX,
            drafter,
            ..Default::default()
        },
    )
    .unwrap();
    let spec = Speculator::new(Box::new(model_drafter), Policy::fixed(3, 3));
    let (queue, metrics, _tok) =
        common::in_process::worker_on(sess, Box::new(job::NoCache), Some(spec));
    state(queue, metrics)
}

fn state(
    queue: ds4::server::worker::Queue,
    metrics: Arc<ds4::server::metrics::Metrics>,
) -> Arc<State> {
    let opts = HttpOptions {
        allow_script: true,
        ..HttpOptions::default()
    };
    common::in_process::routes_state(queue, metrics, CTX, opts)
}

fn lookup() -> Speculator {
    // Fixed drafts of 4 where lookup finds a match, so the test sees
    // verify steps whatever the timings.
    Speculator::new(Box::new(PromptLookup::new()), Policy::fixed(4, 4))
}

async fn post(state: &Arc<State>, path: &str, body: &Value) -> String {
    let (status, text) = common::in_process::post(state, path, body).await;
    assert_eq!(status, 200, "{text:?}");
    text
}

async fn metrics(state: &Arc<State>) -> String {
    let r = warp::test::request()
        .method("GET")
        .path("/metrics")
        .reply(&routes::routes(state.clone()))
        .await;
    String::from_utf8(r.body().to_vec()).unwrap()
}

/// The content and reasoning deltas of an OpenAI SSE body, concatenated,
/// and the usage of its last chunk.
fn streamed(body: &str) -> (String, String, Value) {
    let (mut content, mut reasoning, mut usage) = (String::new(), String::new(), Value::Null);
    for e in body.split("\n\n") {
        let Some(d) = e.lines().find_map(|l| l.strip_prefix("data: ")) else {
            continue;
        };
        if d == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(d).unwrap();
        let delta = &v["choices"][0]["delta"];
        content += delta["content"].as_str().unwrap_or("");
        reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (content, reasoning, usage)
}

/// A prompt that repeats itself, so prompt lookup finds n-grams to draft.
fn repetitive() -> String {
    "fn add(a: i32, b: i32) -> i32 { a + b } ".repeat(6)
}

#[tokio::test]
async fn the_server_streams_the_same_text_with_speculation() {
    same_streams(server(Some(lookup())), "lookup").await;
}

/// The same with the MTP block drafting (it drafts on every step).
#[tokio::test]
async fn the_server_streams_the_same_text_with_mtp() {
    same_streams(model_drafter_server(false), "mtp").await;
}

/// The same with DSpark drafting.
#[tokio::test]
async fn the_server_streams_the_same_text_with_dspark() {
    same_streams(model_drafter_server(true), "dspark").await;
}

async fn same_streams(spec: Arc<State>, name: &str) {
    let plain = server(None);
    let mut drafted = 0;
    for (temperature, seed) in [(0.0, 5), (1.0, 7)] {
        for thinking in [false, true] {
            let body = json!({"messages":[{"role":"user","content":repetitive()}],
                "max_tokens":60, "temperature":temperature, "seed":seed, "stream":true,
                "stream_options":{"include_usage":true},
                "thinking":{"type": if thinking {"enabled"} else {"disabled"}}});
            let a = streamed(&post(&plain, "/v1/chat/completions", &body).await);
            let b = streamed(&post(&spec, "/v1/chat/completions", &body).await);
            let what = format!("temperature {temperature}, thinking {thinking}");
            assert_eq!(a.0, b.0, "{what}: content");
            assert_eq!(a.1, b.1, "{what}: reasoning");
            assert_eq!(
                a.2["completion_tokens"], b.2["completion_tokens"],
                "{what}: usage"
            );
            assert!(a.2.get("speculative").is_none(), "{what}: {}", a.2);
            if let Some(s) = b.2.get("speculative") {
                let d = s["drafted"].as_u64().unwrap();
                let k = s["accepted"].as_u64().unwrap();
                assert!(k <= d);
                assert_eq!(
                    b.2["completion_tokens_details"]["accepted_prediction_tokens"],
                    k
                );
                drafted += d;
            }
        }
    }
    assert!(drafted > 0, "{name} drafted nothing in four requests");
    let m = metrics(&spec).await;
    assert!(m.contains("ds4_spec_drafted_tokens_total"), "{m}");
    assert!(m.contains("ds4_spec_acceptance_rate"), "{m}");
    assert!(m.contains("ds4_spec_tokens_per_verify_step"), "{m}");
    assert!(!metrics(&plain).await.contains("ds4_spec_"));
}

const TOOL_SCRIPT: &str = "Need to list.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; ls &amp;&amp; ls</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

/// A scripted tool call (the DSML block, the live argument fragments, the
/// parsed call) is the same with speculation on.
#[tokio::test]
async fn dsml_tool_calls_are_unchanged() {
    let tools = json!([{"type":"function","function":{"name":"bash","description":"Run a shell command.",
        "parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]);
    let body = json!({"messages":[{"role":"user","content":repetitive()}],"tools":tools,
        "ds4_test_script":TOOL_SCRIPT,"max_tokens":200});
    let mut out = Vec::new();
    for spec in [None, Some(lookup())] {
        let s = server(spec);
        let v: Value =
            serde_json::from_str(&post(&s, "/v1/chat/completions", &body).await).unwrap();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let chunks = post(&s, "/v1/chat/completions", &sb).await;
        let args: String = chunks
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<Value>(d).unwrap())
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
        out.push((
            c["message"]["content"].clone(),
            c["message"]["tool_calls"][0]["function"].clone(),
            args,
        ));
    }
    assert_eq!(out[0], out[1]);
    assert_eq!(out[0].2, r#"{"command":"ls && ls && ls"}"#);
}

/// `ds4 --spec lookup` prints what `ds4` prints (greedy), and says what
/// speculation did on stderr.
#[test]
fn the_cli_prints_the_same_text() {
    let m = common::tiny_model_path(Variant::Q8);
    let p = repetitive();
    let base = greedy_args(&m, &p, "40");
    let plain = plain_cli(&base);
    let mtp = mtp_file("cli");
    let mtp = mtp.to_str().unwrap();
    let dspark = dspark_file("cli");
    let dspark = dspark.to_str().unwrap();
    let mtp = ["--mtp", "--mtp-model", mtp, "--draft", "3", "--draft-fixed"];
    let dspark = [
        "--dspark",
        "--mtp-model",
        dspark,
        "--draft",
        "4",
        "--draft-fixed",
    ];
    let mtp_streaming = [&mtp[..], &["--ssd-streaming"]].concat();
    let dspark_streaming = [&dspark[..], &["--ssd-streaming"]].concat();
    for (extra, name) in [
        (&["--spec", "lookup"][..], "lookup"),
        (
            &["--spec", "lookup", "--draft", "8", "--draft-fixed"],
            "lookup",
        ),
        (&mtp, "mtp"),
        // A 64 GB Mac's combination: the model file's experts stream.
        (&mtp_streaming, "mtp"),
        (&dspark, "dspark"),
        // The drafter's experts live in its file and are read whole.
        (&dspark_streaming, "dspark"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let o = ds4(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert_eq!(o.stdout, plain.stdout, "{extra:?}");
        assert!(err.contains(&format!("speculation ({name}):")), "{err}");
    }
}

/// V4.1 with its DSpark drafter prints plain decoding's text, with and
/// without `--ssd-streaming` (a `--draft` over the block clamped with a
/// note); a V4 drafter is refused at start, naming the family.
#[test]
fn the_cli_runs_dspark_on_v41() {
    use ds4::testmodel::dspark::{write_v41_dspark, DsparkSpec};
    use ds4::testmodel::v41::V41Spec;
    let m = common::v41_model_path();
    let dir = common::fresh_dir("spec-server-dspark", "v41");
    let ds = dir.join("tiny-v41.dspark.gguf");
    let spec = V41Spec::tiny();
    let n_vocab = ds4::model::v41::V41ModelFile::open(&m)
        .unwrap()
        .config
        .n_vocab;
    write_v41_dspark(
        &spec,
        &DsparkSpec::for_v41(&spec),
        Variant::F32,
        n_vocab,
        &ds,
    )
    .unwrap();
    let p = repetitive();
    let base = greedy_args(&m, &p, "24");
    let plain = plain_cli(&base);
    let ds = ds.to_str().unwrap();
    // A draft length over the file's block (4) is clamped, with a note.
    for (streaming, draft) in [(false, "7"), (true, "4")] {
        let mut args = base.to_vec();
        args.extend_from_slice(&["--dspark", "--mtp-model", ds, "--draft", draft]);
        args.push("--draft-fixed");
        if streaming {
            args.push("--ssd-streaming");
        }
        let o = ds4(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert_eq!(o.stdout, plain.stdout, "streaming {streaming}");
        assert!(err.contains("speculation (dspark):"), "{err}");
        let clamped = err.contains("drafts blocks of 4; drafting at most 4");
        assert_eq!(clamped, draft == "7", "{err}");
    }
    let v4_drafter = dspark_file("v4-on-v41");
    let mut args = base.to_vec();
    args.extend_from_slice(&["--dspark", "--mtp-model", v4_drafter.to_str().unwrap()]);
    let o = ds4(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("V4 (deepseek4-dspark)"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `ds4`'s arguments for `n` greedy tokens of model `m` after prompt `p`
/// on the fast CPU backend.
fn greedy_args<'a>(m: &'a std::path::Path, p: &'a str, n: &'a str) -> Vec<&'a str> {
    let m = m.to_str().unwrap();
    vec![
        "-m",
        m,
        "-p",
        p,
        "-n",
        n,
        "--temp",
        "0",
        "--nothink",
        "--cpu",
    ]
}

/// The plain run of `args`, which must succeed.
fn plain_cli(args: &[&str]) -> std::process::Output {
    let o = ds4(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// The tiny q8 model's DSpark drafter, in a directory of its own.
fn dspark_file(tag: &str) -> std::path::PathBuf {
    use ds4::testmodel::dspark::{write_dspark, DsparkSpec};
    let dir = common::fresh_dir("spec-server-dspark", tag);
    let p = dir.join("tiny-q8.dspark.gguf");
    let spec = ds4::testmodel::TestModelSpec::tiny();
    let n_vocab = common::tiny_model(Variant::Q8).config.n_vocab;
    write_dspark(
        &spec,
        &DsparkSpec::for_model(&spec),
        Variant::Q8,
        n_vocab,
        &p,
    )
    .unwrap();
    p
}

/// The tiny q8 model's MTP draft file, in a directory of its own.
fn mtp_file(tag: &str) -> std::path::PathBuf {
    let dir = common::fresh_dir("spec-server-mtp", tag);
    let p = dir.join("tiny-q8.mtp.gguf");
    ds4::testmodel::write_mtp(&ds4::testmodel::TestModelSpec::tiny(), Variant::Q8, &p).unwrap();
    p
}

/// Contradictions and missing drafter files are refused before any work,
/// naming the flags.
#[test]
fn bad_spec_flags_are_refused() {
    let m = common::tiny_model_path(Variant::Q8);
    let m = m.to_str().unwrap();
    for (args, want) in [
        (vec!["--spec", "ngram"], "--spec: expected"),
        (vec!["--mtp"], "--mtp-model"),
        (
            vec!["--mtp", "--dspark", "--mtp-model", "x"],
            "one of --mtp and --dspark",
        ),
        (
            vec!["--spec", "lookup", "--draft", "40"],
            "--draft must be in",
        ),
        (vec!["--draft", "3"], "go with --spec"),
        // The main file given as the MTP file.
        (vec!["--mtp", "--mtp-model", m], "no mtp.0.* tensors"),
    ] {
        let mut a = vec!["-m", m, "-p", "hi", "-n", "2"];
        a.extend(args.iter().copied());
        let o = ds4(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The batched server refuses speculation at start, saying why.
#[test]
fn batched_server_refuses_speculation() {
    let m = common::tiny_model_path(Variant::Q8);
    let o = Command::new(env!("CARGO_BIN_EXE_ds4-server"))
        .args([
            "-m",
            m.to_str().unwrap(),
            "--batched-session",
            "2",
            "--spec",
            "lookup",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("speculative decoding runs with one KV slot"),
        "{err}"
    );
}
