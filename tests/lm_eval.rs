//! lm-evaluation-harness against the real server: `lm_eval --model
//! local-completions` on the tiny model, with tasks read from
//! `tests/data/lm_eval/` (a local JSON-lines file, nothing downloaded).
//!
//! - Issue 21 item 4: with `tokenizer_backend=remote`, the six-document
//!   log-likelihood task; each document's log-likelihood it reports equals,
//!   bit for bit, the engine's own scoring of the same tokens in this
//!   process.
//! - Issue 39 item 3: a `generate_until` task with text prompts, run twice
//!   with the two settings docs/CLIENTS.md gives for plain greedy answers
//!   (`model=deepseek-chat`; the default model with `thinking: false`
//!   passed through `--gen_kwargs`): the answers of both runs equal the
//!   engine's own greedy continuation of each templated prompt, and a
//!   thinking request's replaced `temperature` is said once in the log.
//!
//! The install is in `.ci/run` and docs/CLIENTS.md (`lm-eval` without its
//! heavy dependencies: no torch, no transformers).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{python_has, run_bounded};
use common::server::{cpu_engine, json_body, post, start, temp_path};
use ds4::chat::{self, ThinkMode, DEFAULT_SYSTEM};
use ds4::sampler::{argmax, LogSoftmax};
use ds4::Tokenizer;
use serde_json::{json, Value};

const TASK: &str = "ds4_tiny_loglikelihood";

fn samples_file(dir: &Path, task: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = samples_file(&p, task) {
                return Some(f);
            }
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("samples_{task}_")) && n.ends_with(".jsonl"))
        {
            return Some(p);
        }
    }
    None
}

/// Runs `lm_eval --model local-completions --model_args MODEL_ARGS` on
/// `task` (from `tests/data/lm_eval`) with `extra` arguments and `hf_home`
/// as its Hugging Face cache (runs that share one read the dataset once);
/// returns its samples file (one JSON line per document).
fn lm_eval(task: &str, model_args: &str, extra: &[&str], hf_home: &Path) -> String {
    let out_dir = temp_path("lm-eval");
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
    ])
    .arg(model_args)
    .args(["--tasks", task, "--include_path", "tests/data/lm_eval"])
    .args(extra)
    .args(["--log_samples", "--output_path"])
    .arg(&out_dir)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    // Nothing from the hub: the task's data is the local file.
    .env("HF_HUB_OFFLINE", "1")
    .env("HF_DATASETS_OFFLINE", "1")
    .env("HF_HOME", hf_home);
    let t0 = Instant::now();
    let out = run_bounded(cmd, Duration::from_secs(300), "lm_eval");
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "lm_eval failed:\n{log}");
    eprintln!("lm_eval {task} ran in {:.1} s", t0.elapsed().as_secs_f64());
    let samples = samples_file(&out_dir, task).unwrap_or_else(|| panic!("no samples file:\n{log}"));
    let lines = std::fs::read_to_string(&samples).unwrap();
    let _ = std::fs::remove_dir_all(&out_dir);
    lines
}

/// lm-eval's split of a document (`TemplateLM._encode_pair`): trailing
/// spaces of the context move to the continuation, the whole text is
/// encoded once and the context's own length marks where scoring starts.
fn split(tok: &Tokenizer, context: &str, continuation: &str) -> (Vec<u32>, usize) {
    let trimmed = context.trim_end();
    let moved = &context[trimmed.len()..];
    let whole = tok.encode_chat(&format!("{trimmed}{moved}{continuation}"));
    (whole, tok.encode_chat(trimmed).len())
}

/// Whether python3 has lm-eval (`DS4_SKIP_LM_EVAL` skips the tests).
fn lm_eval_installed() -> bool {
    python_has(
        "lm_eval, datasets, aiohttp, tenacity, pytablewriter",
        "DS4_SKIP_LM_EVAL",
        "python3 with lm-eval is needed: see docs/CLIENTS.md § lm-evaluation-harness for the light install",
    )
}

#[test]
fn lm_eval_loglikelihoods_equal_the_engines_scoring() {
    if !lm_eval_installed() {
        return;
    }
    let s = start(&["--backend", "cpu"]);
    let model_args = format!(
        "base_url=http://{}/v1/completions,model=deepseek-v4-flash,tokenizer_backend=remote",
        s.addr
    );
    let hf_home = temp_path("hf-home");
    let lines = lm_eval(TASK, &model_args, &[], &hf_home);
    let _ = std::fs::remove_dir_all(&hf_home);

    // The engine on the server's backend, scoring each document itself.
    let (mut sess, tok) = cpu_engine();
    let v = sess.n_vocab();
    let mut seen = 0;
    for line in lines.lines() {
        let d: Value = serde_json::from_str(line).unwrap();
        let (context, continuation) = (
            d["doc"]["context"].as_str().unwrap(),
            d["doc"]["continuation"].as_str().unwrap(),
        );
        let (whole, ctxlen) = split(&tok, context, continuation);
        let rows = sess.score(&whole).unwrap();
        let (mut ll, mut greedy) = (0.0f64, true);
        for i in ctxlen..whole.len() {
            let row = &rows[(i - 1) * v..i * v];
            ll += LogSoftmax::new(row).of(row[whole[i] as usize]);
            greedy &= argmax(row) == whole[i] as usize;
        }
        let resp = &d["resps"][0][0];
        let reported: f64 = resp[0].as_str().unwrap().parse().unwrap();
        eprintln!("doc {}: lm_eval {reported:e}, engine {ll:e}", d["doc_id"]);
        assert_eq!(
            reported.to_bits(),
            ll.to_bits(),
            "doc {}: {line}",
            d["doc_id"]
        );
        assert_eq!(
            resp[1].as_str().unwrap(),
            if greedy { "True" } else { "False" }
        );
        seen += 1;
    }
    assert_eq!(seen, 6, "{lines}");
}

const GEN_TASK: &str = "ds4_tiny_generate";
/// The task's `until` and `max_gen_toks` (tests/data/lm_eval/ds4_tiny_generate.yaml).
const UNTIL: [&str; 2] = ["\n", "."];
const MAX_GEN: usize = 12;

/// The engine's own greedy answer to a `/v1/completions` text prompt that
/// does not think: the single-turn template (PROMPT.md §3.4), argmax at
/// every step, cut before the first `UNTIL` string, at EOS or after
/// `MAX_GEN` tokens. Also whether a stop string ended it.
fn greedy_answer(sess: &mut ds4::Session, tok: &Tokenizer, context: &str) -> (String, bool) {
    let prompt = chat::render_one_shot(DEFAULT_SYSTEM, context, ThinkMode::None);
    sess.sync(&tok.encode_chat(&prompt), &mut |_, _| {})
        .unwrap();
    let mut bytes = Vec::new();
    for step in 0..MAX_GEN {
        let id = argmax(sess.logits()) as u32;
        if id == tok.specials().eos {
            break;
        }
        bytes.extend_from_slice(tok.token_bytes(id).unwrap());
        let text = String::from_utf8_lossy(&bytes);
        if let Some(at) = UNTIL.iter().filter_map(|u| text.find(u)).min() {
            return (text[..at].to_string(), true);
        }
        if step + 1 < MAX_GEN {
            sess.eval(id).unwrap();
        }
    }
    (String::from_utf8_lossy(&bytes).into_owned(), false)
}

/// Each document's context and lm-eval's answer, in document order.
fn answers(samples: &str) -> Vec<(String, String)> {
    let mut out: Vec<(u64, String, String)> = samples
        .lines()
        .map(|line| {
            let d: Value = serde_json::from_str(line).unwrap();
            let context = d["doc"]["context"].as_str().unwrap().to_string();
            let answer = d["resps"][0][0]
                .as_str()
                .unwrap_or_else(|| panic!("{line}"));
            (d["doc_id"].as_u64().unwrap(), context, answer.to_string())
        })
        .collect();
    out.sort_by_key(|a| a.0);
    out.into_iter().map(|(_, c, a)| (c, a)).collect()
}

#[test]
fn lm_eval_generate_until_gives_the_engines_greedy_answers() {
    if !lm_eval_installed() {
        return;
    }
    let s = start(&["--backend", "cpu"]);
    // Text prompts (`tokenizer_backend=none`): ds4's template applies, and
    // with it the thinking mode unless the request turns it off. Run 1 by
    // the model name, run 2 by `thinking: false` through `--gen_kwargs`
    // (lm-eval sends the task's kwargs it does not know in the body).
    let base = format!(
        "base_url=http://{}/v1/completions,tokenizer_backend=none",
        s.addr
    );
    // Both at once: each lm_eval spends most of its time indexing its
    // tasks, and the server's one worker takes their requests in turn.
    let homes = [temp_path("hf-home"), temp_path("hf-home")];
    let runs = [
        (format!("{base},model=deepseek-chat"), &[][..]),
        (
            format!("{base},model=deepseek-v4-flash"),
            &["--gen_kwargs", "thinking=False"][..],
        ),
    ];
    let [by_name, by_field] = std::thread::scope(|sc| {
        let run = |i: usize| {
            let (args, extra) = (&runs[i].0, runs[i].1);
            let home = &homes[i];
            sc.spawn(move || answers(&lm_eval(GEN_TASK, args, extra, home)))
        };
        let (a, b) = (run(0), run(1));
        [a.join().unwrap(), b.join().unwrap()]
    });
    for h in &homes {
        let _ = std::fs::remove_dir_all(h);
    }
    assert_eq!(by_name.len(), 6, "{by_name:?}");
    assert_eq!(by_name, by_field, "the two runs answered differently");

    // The engine on the server's backend, greedy on each templated prompt.
    let (mut sess, tok) = cpu_engine();
    let mut stopped = 0;
    for (context, answer) in &by_name {
        let (mine, stop) = greedy_answer(&mut sess, &tok, context);
        eprintln!("{context:?}: lm_eval {answer:?}, engine {mine:?} (stop string: {stop})");
        assert_eq!(answer, &mine, "{context:?}");
        stopped += stop as usize;
    }
    assert!(
        stopped > 0,
        "no answer met a stop string: `until` went untested"
    );

    // Neither run thought, so no field was replaced. A thinking request's
    // `temperature: 0` is replaced and said once, however many come.
    let said = "request that thinks asked for";
    assert!(!s.stderr_text().contains(said), "{}", s.stderr_text());
    for _ in 0..2 {
        let body = json!({"prompt": "Hi", "temperature": 0, "max_tokens": 1});
        let r = json_body(&post(&s.addr, "/v1/completions", &body));
        assert!(r["choices"][0]["text"].is_string(), "{r}");
    }
    let log = s.stderr_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(said)).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("/v1/completions") && lines[0].contains("temperature 0"),
        "{}",
        lines[0]
    );
}
