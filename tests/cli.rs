//! The `ds4` binary end to end on a generated tiny model: token dump format,
//! generation, the logprob dump, and clear errors (exit 1, one line, no
//! panic) for bad input.

mod common;

use common::process::ds4;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ds4::testmodel::Variant;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The stdout of a run that must have succeeded (its stderr says why not).
fn success_stdout(o: Output) -> String {
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// A fresh folder `<name>-<pid>` under the system's temporary folder.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `ds4 -m <tiny model of variant> --info`: its report.
fn info(variant: Variant) -> String {
    let m = common::tiny_model_path(variant);
    success_stdout(ds4(&["-m", m.to_str().unwrap(), "--info"]))
}

/// A ds4-bench prompt file in `dir`: `sentence` 40 times.
fn bench_prompt(dir: &Path, sentence: &str) -> PathBuf {
    let prompt = dir.join("p.txt");
    std::fs::write(&prompt, sentence.repeat(40)).unwrap();
    prompt
}

/// `ds4-bench` on the model `m` and the prompt file `prompt`, with `more`.
fn bench(m: &Path, prompt: &Path, more: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds4-bench"))
        .args([
            "-m",
            m.to_str().unwrap(),
            "--prompt-file",
            prompt.to_str().unwrap(),
        ])
        .args(more)
        .output()
        .unwrap()
}

/// The CSV ds4-bench printed: its header and its rows' cells.
fn bench_csv(csv: &str) -> (&str, Vec<Vec<&str>>) {
    let lines: Vec<&str> = csv.lines().collect();
    let rows = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    (lines[0], rows)
}

/// The interactive REPL on the tiny q8 model (greedy, no thinking, `-n`
/// tokens per answer) fed `input` on stdin; its output once stdin closes.
fn repl(n: &str, input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let m = common::tiny_model_path(Variant::Q8);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args([
            "-m",
            m.to_str().unwrap(),
            "-n",
            n,
            "--temp",
            "0",
            "--nothink",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn assert_clean_error(o: &Output, what: &str) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{what}: status {:?}, stderr {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(err.lines().any(|l| l.starts_with("ds4: ")), "{what}: {err}");
}

#[test]
fn dump_tokens_prints_ids_and_vocab_strings() {
    let m = common::tiny_model_path(Variant::F32);
    let out = success_stdout(ds4(&[
        "-m",
        m.to_str().unwrap(),
        "--dump-tokens",
        "-p",
        "Hello world</｜DSML｜",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "[19923, 2058, 1718, 128825]");
    assert_eq!(lines[1], " 19923  Hello");
    assert_eq!(lines[2], "  2058  Ġworld");
    assert_eq!(lines[4], "128825  ｜DSML｜");
    assert_eq!(lines.len(), 5);
}

#[test]
fn info_prints_config_and_tensor_table() {
    let out = info(Variant::Q2);
    assert!(out.contains("layer kinds          W W C4 H16 C4 H16"));
    assert!(
        out.contains("blk.2.ffn_gate_exps.weight")
            && out.contains("IQ2_XXS")
            && out.contains("Q2_K")
    );
    assert!(out.contains("active weight bytes per token:"));
    // The decode ceiling of the device the default backend would use (the
    // host here: lavapipe is not a real GPU for `auto`).
    assert!(out.contains("== decode roofline =="), "{out}");
    let bw: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("read bandwidth (measured)"))
        .and_then(|r| r.trim().split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no bandwidth line: {out}"));
    assert!(bw > 0.0, "{out}");
    assert!(out.contains("decode ceiling"), "{out}");
}

#[test]
fn info_prints_the_type_mix_of_an_mxfp4_file() {
    let out = info(Variant::Mxfp4);
    assert!(out.contains("== type mix (bound tensors) =="), "{out}");
    // 6 layers × gate/up/down.
    assert!(
        out.lines()
            .any(|l| l.starts_with("MXFP4") && l.contains(" 18 tensors")),
        "{out}"
    );
    assert!(out.contains("routed experts: gate MXFP4, up MXFP4, down MXFP4 (6 layers)"));
    assert!(out.contains("active weight bytes per token:"));
}

#[test]
fn greedy_generation_and_logprob_dump_agree() {
    let m = common::tiny_model_path(Variant::Q8);
    let m = m.to_str().unwrap();
    let dir = scratch_dir("ds4-cli");
    let lp = dir.join("lp.json");
    let hello = ["-m", m, "-p", "Hello", "--nothink", "-sys", "", "-n", "4"];
    let dump = [
        "--dump-logprobs",
        lp.to_str().unwrap(),
        "--logprobs-top-k",
        "3",
    ];
    let o = ds4(&[&hello[..], &dump].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        o.stdout.is_empty(),
        "--dump-logprobs writes nothing to stdout"
    );
    let text = std::fs::read_to_string(&lp).unwrap();
    assert!(text.starts_with("{\n  \"source\":\"ds4\",\n  \"prompt_tokens\":"));
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    // BOS <｜User｜> Hello <｜Assistant｜> </think>
    assert_eq!(j["prompt_tokens"], 5);
    assert_eq!(j["top_k"], 3);
    let steps = j["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() <= 4);
    for s in steps {
        let tops = s["top_logprobs"].as_array().unwrap();
        assert_eq!(tops.len(), 3);
        assert_eq!(s["selected"]["id"], tops[0]["token"]["id"]);
        let lps: Vec<f64> = tops
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap())
            .collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0);
    }
    // Greedy generation prints the same tokens the dump selected.
    let o = ds4(&[&hello[..], &["--temp", "0"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("generation:"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_a_clear_error() {
    let m = common::tiny_model_path(Variant::F32);
    let m = m.to_str().unwrap();
    let dir = scratch_dir("ds4-cli-bad");
    let bad_utf8 = dir.join("bad.txt");
    std::fs::write(&bad_utf8, b"caf\xe9").unwrap();
    let long = dir.join("long.txt");
    std::fs::write(&long, "word ".repeat(400)).unwrap();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("-n 0", vec!["-m", m, "-p", "hi", "-n", "0"]),
        ("empty prompt", vec!["-m", m, "-p", ""]),
        (
            "invalid UTF-8",
            vec!["-m", m, "--prompt-file", bad_utf8.to_str().unwrap()],
        ),
        (
            "unknown backend",
            vec!["-m", m, "-p", "hi", "--backend", "tpu"],
        ),
        ("unavailable backend", vec!["-m", m, "-p", "hi", "--cuda"]),
        (
            "prompt longer than ctx",
            vec![
                "-m",
                m,
                "--prompt-file",
                long.to_str().unwrap(),
                "--ctx",
                "64",
            ],
        ),
        (
            "bad numerics",
            vec!["-m", m, "-p", "hi", "--numerics", "fast"],
        ),
        (
            "missing model",
            vec!["-m", "/nonexistent/model.gguf", "-p", "hi"],
        ),
        (
            "not a gguf",
            vec!["-m", bad_utf8.to_str().unwrap(), "-p", "hi"],
        ),
        (
            "bad dump name",
            vec!["-m", m, "-p", "hi", "--dump", "nosuchvalue@0", "-n", "1"],
        ),
    ];
    for (what, args) in cases {
        assert_clean_error(&ds4(&args), what);
    }
    // No model at all: says how to get one.
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["-p", "hi"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_clean_error(&o, "no model");
    assert!(stderr(&o).contains("tools/download_model.sh"));
    // Usage errors exit 2, like ds4.
    assert_eq!(ds4(&["--no-such-flag"]).status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn repl_reuses_the_session_across_turns() {
    let o = repl("3", "hello\n/think\n/bogus\nand again\n/quit\n");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Thinking mode: high."), "{out}");
    assert!(err.contains("unknown command: /bogus"), "{err}");
    let prefills: Vec<&str> = err.lines().filter(|l| l.contains("new tokens")).collect();
    assert_eq!(prefills.len(), 2, "{err}");
    assert!(prefills[0].contains("(0 reused)"), "{err}");
    // The second turn reuses the first: BOS, system, turn one, answer, EOS.
    assert!(!prefills[1].contains("(0 reused)"), "{err}");
}

#[test]
fn ds4_bench_writes_one_csv_row_per_frontier() {
    let m = common::tiny_model_path(Variant::Q8);
    let dir = scratch_dir("ds4-bench");
    let prompt = bench_prompt(&dir, "The quick brown fox jumps over the lazy dog. ");
    let o = bench(
        &m,
        &prompt,
        &[
            "--ctx-start",
            "64",
            "--ctx-max",
            "160",
            "--step-incr",
            "48",
            "-n",
            "4",
        ],
    );
    let csv = success_stdout(o);
    let (header, rows) = bench_csv(&csv);
    assert_eq!(
        header,
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"
    );
    let frontiers: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(frontiers, ["64", "112", "160"]);
    let new: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    assert_eq!(new, ["64", "48", "48"]);
    // The snapshot grows with the frontier.
    let kv: Vec<u64> = rows.iter().map(|r| r[5].parse().unwrap()).collect();
    assert!(kv[0] < kv[1] && kv[1] < kv[2]);
    // Too short a prompt is an error.
    let o = bench(&m, &prompt, &["--ctx-max", "100000"]);
    assert_eq!(o.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ds4_bench_restore_mode_stores_and_loads_each_frontier() {
    let m = common::tiny_model_path(Variant::Q8);
    let dir = scratch_dir("ds4-bench-kv");
    let prompt = bench_prompt(&dir, "Pack my box with five dozen liquor jugs. ");
    let kv = dir.join("kv");
    let o = bench(
        &m,
        &prompt,
        &[
            "--ctx-start",
            "48",
            "--ctx-max",
            "144",
            "--step-mul",
            "3",
            "-n",
            "2",
            "--kv-restore-dir",
            kv.to_str().unwrap(),
        ],
    );
    let err = stderr(&o);
    let csv = success_stdout(o);
    let (header, rows) = bench_csv(&csv);
    assert_eq!(
        header,
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,\
         prefill_total_s,kv_store_s,kv_restore_s,kv_file_bytes"
    );
    assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), ["48", "144"]);
    for r in &rows {
        // A file holds the session payload plus header and text.
        let payload: u64 = r[5].parse().unwrap();
        let file: u64 = r[9].parse().unwrap();
        assert!(file > payload + 52, "{r:?}");
        let total: f64 = r[6].parse().unwrap();
        let restore: f64 = r[8].parse().unwrap();
        assert!(total > 0.0 && restore > 0.0, "{r:?}");
    }
    // One store and one hit per frontier (the loaded logits were checked
    // equal to the stored ones, or the run would have failed); no files left.
    assert_eq!(err.matches("kv cache: stored tokens=").count(), 2, "{err}");
    assert_eq!(err.matches("kv cache: hit tokens=").count(), 2, "{err}");
    let left: Vec<_> = std::fs::read_dir(&kv).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn repl_commands_check_their_arguments() {
    let o = repl(
        "2",
        "/think x\n/nothink x\n/ctx abc\n/ctx 300\nhello\n/quit\n",
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    // `/think x` is refused, not taken as Think Max.
    assert!(!out.contains("Thinking mode"), "{out}");
    assert_eq!(err.matches("takes no argument").count(), 2, "{err}");
    assert!(err.contains("/ctx: expected a number"), "{err}");
    assert!(err.contains("context is now 300 tokens"), "{err}");
    assert_eq!(err.matches("new tokens").count(), 1, "{err}");
}

#[test]
fn demo_without_n_is_short() {
    let dir = scratch_dir("ds4-cli-demo");
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["--demo", "-p", "Hello", "--temp", "0", "--nothink"])
        .env("XDG_CACHE_HOME", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("DEMO MODE"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `/save FILE` in one REPL, `/load FILE` in the next: the second chat goes on
/// from the saved KV state (only the new turn is evaluated); a missing file is
/// an error line and the chat goes on.
#[test]
fn repl_save_and_load_continue_a_conversation() {
    let dir = scratch_dir("ds4-cli-save");
    let file = dir.join("chat.kv");
    let run = |input: String| {
        let o = repl("3", &input);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        err
    };
    let f = file.display();
    let err = run(format!("hello\n/save {f}\n/save\n/quit\n"));
    assert!(err.contains("ds4: saved "), "{err}");
    assert!(err.contains("/save: expected a file name"), "{err}");
    assert!(file.exists());
    let err = run(format!("/load {f}.missing\n/load {f}\nand again\n/quit\n"));
    assert!(err.contains(".missing"), "{err}");
    let loaded: usize = err
        .lines()
        .filter(|l| l.contains(" tokens from "))
        .find_map(|l| l.strip_prefix("ds4: loaded "))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no load line: {err}"));
    assert!(loaded > 3, "{err}");
    // The only prefill reuses exactly the loaded tokens.
    let prefills: Vec<&str> = err.lines().filter(|l| l.contains("new tokens")).collect();
    assert_eq!(prefills.len(), 1, "{err}");
    assert!(prefills[0].contains(&format!("({loaded} reused)")), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `ds4-bench --bandwidth --bw-decode`: the device lines, the matvec lines and
/// one whole decode step of the given model as a fraction of device read.
#[test]
fn ds4_bench_bandwidth_reports_a_decode_step() {
    let m = common::tiny_model_path(Variant::Q8);
    let o = Command::new(env!("CARGO_BIN_EXE_ds4-bench"))
        .args([
            "--bandwidth",
            "--bw-decode",
            "--bw-decode-steps",
            "1",
            "--bw-mib",
            "8",
            "--bw-trials",
            "1",
            "-m",
            m.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("device read"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("decode step") && l.contains("tiny-q8.gguf"))
        .unwrap_or_else(|| panic!("no decode-step line: {out}"));
    // "... MiB ms GB/s of-read % timer": the share of device read is positive.
    let pct: f64 = row
        .split_whitespace()
        .rev()
        .nth(2)
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no share in {row:?}"));
    assert!(pct > 0.0, "{row}");
}
