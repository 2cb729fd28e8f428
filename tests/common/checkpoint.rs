//! Tiny checkpoints in DeepSeek's official format, written by
//! `tools/checkpoint/make_checkpoint.py` (the converter's tests).

use std::path::Path;
use std::process::Command;

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
