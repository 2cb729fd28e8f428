//! Tiny checkpoints in DeepSeek's official format, written by
//! `tools/checkpoint/make_checkpoint.py` (the converter's tests).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Runs the script with `--out dir` and `args`; fails the test, with the
/// script's stderr, if it fails.
pub fn make_checkpoint(dir: &Path, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/checkpoint/make_checkpoint.py");
    let out = Command::new("python3")
        .arg(script)
        .arg("--out")
        .arg(dir)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "make_checkpoint.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The script's checkpoint made with `args` in `fresh_dir(group, name)`,
/// once per test binary and `name`: the converter's tests share one
/// checkpoint of each kind across their tests.
pub fn checkpoint_once(group: &str, name: &str, args: &[&str]) -> PathBuf {
    static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    done.entry(name.to_string())
        .or_insert_with(|| {
            let dir = super::fresh_dir(group, name);
            make_checkpoint(&dir, args);
            dir
        })
        .clone()
}
