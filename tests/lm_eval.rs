//! lm-evaluation-harness against the real server (issue 21 item 4): `lm_eval
//! --model local-completions` with `tokenizer_backend=remote` runs the
//! six-document log-likelihood task of `tests/data/lm_eval/` (a local
//! JSON-lines file, nothing downloaded) on the tiny model, and each
//! document's log-likelihood it reports equals, bit for bit, the engine's
//! own scoring of the same tokens in this process. The install is in
//! `.ci/run` and docs/CLIENTS.md (`lm-eval` without its heavy dependencies:
//! no torch, no transformers).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{python_has, run_bounded};
use common::server::{cpu_engine, start, temp_path};
use ds4::sampler::{argmax, LogSoftmax};
use ds4::Tokenizer;
use serde_json::Value;

const TASK: &str = "ds4_tiny_loglikelihood";

fn samples_file(dir: &Path) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = samples_file(&p) {
                return Some(f);
            }
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("samples_{TASK}_")) && n.ends_with(".jsonl"))
        {
            return Some(p);
        }
    }
    None
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

#[test]
fn lm_eval_loglikelihoods_equal_the_engines_scoring() {
    if !python_has(
        "lm_eval, datasets, aiohttp, tenacity, pytablewriter",
        "DS4_SKIP_LM_EVAL",
        "python3 with lm-eval is needed: see docs/CLIENTS.md § lm-evaluation-harness for the light install",
    ) {
        return;
    }
    let s = start(&["--backend", "cpu"]);
    let out_dir = temp_path("lm-eval");
    let hf_home = temp_path("hf-home");
    let model_args = format!(
        "base_url=http://{}/v1/completions,model=deepseek-v4-flash,tokenizer_backend=remote",
        s.addr
    );
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
    ])
    .arg(&model_args)
    .args(["--tasks", TASK, "--include_path", "tests/data/lm_eval"])
    .args(["--log_samples", "--output_path"])
    .arg(&out_dir)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    // Nothing from the hub: the task's data is the local file.
    .env("HF_HUB_OFFLINE", "1")
    .env("HF_DATASETS_OFFLINE", "1")
    .env("HF_HOME", &hf_home);
    let t0 = Instant::now();
    let out = run_bounded(cmd, Duration::from_secs(300), "lm_eval");
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "lm_eval failed:\n{log}");
    eprintln!("lm_eval ran in {:.1} s", t0.elapsed().as_secs_f64());
    let samples = samples_file(&out_dir).unwrap_or_else(|| panic!("no samples file:\n{log}"));
    let lines = std::fs::read_to_string(&samples).unwrap();
    let _ = std::fs::remove_dir_all(&out_dir);
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
