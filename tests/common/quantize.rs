//! The `ds4-quantize` command as the converter's tests run it.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `ds4-quantize` with `args` to its exit.
pub fn quantize_tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds4-quantize"))
        .args(args)
        .output()
        .expect("ds4-quantize runs")
}

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ds4-quantize --hf checkpoint --recipe recipe [extra] -o out --quiet`.
pub fn convert(checkpoint: &Path, recipe: &str, extra: &[&str], out: &Path) -> Output {
    let mut args = vec!["--hf", s(checkpoint), "--recipe", recipe];
    args.extend_from_slice(extra);
    args.extend(["-o", s(out), "--quiet"]);
    quantize_tool(&args)
}
