//! Outside programs the tests drive (python3 clients, a headless browser,
//! a server expected to refuse its start): run to their exit within a
//! bound, and the python3 modules a test needs.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the `ds4` binary with `args` to its exit.
pub fn ds4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(args)
        .output()
        .expect("ds4 runs")
}

/// Runs `cmd` with stdout and stderr piped until it exits; kills it and
/// panics, naming `what`, if it runs longer than `bound`.
pub fn run_bounded(mut cmd: Command, bound: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > bound {
            let _ = child.kill();
            panic!("{what} did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Whether `python3` can run `import {imports}`. Where it cannot, the test
/// is skipped (false) if the variable `skip_var` is set, and fails with
/// `need` otherwise.
pub fn python_has(imports: &str, skip_var: &str, need: &str) -> bool {
    let have = Command::new("python3")
        .args(["-c", &format!("import {imports}")])
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        if std::env::var_os(skip_var).is_some() {
            eprintln!("skipped: {skip_var} is set");
            return false;
        }
        panic!("{need} (or set {skip_var}=1)");
    }
    true
}
