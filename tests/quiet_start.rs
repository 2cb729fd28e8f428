//! A quiet start (issue 39): on a machine without a desktop session (no
//! `XDG_RUNTIME_DIR`, no display server) `ds4` and `ds4-server` print
//! nothing a user did not ask for while they probe the GPU. The Vulkan
//! probe used to enable wgpu's window-system extensions, and Mesa's
//! device-selection layer then tried the Wayland compositor: libwayland
//! printed `error: XDG_RUNTIME_DIR is invalid or not set in the
//! environment.` twice at every start.
//!
//! The probe runs in `--backend auto` (the default) and in `--list-devices`.
//! Where `CI` is set (lavapipe installed by .ci/run), the CLI test also
//! checks that the probe saw a Vulkan adapter, so it cannot pass by not
//! probing; the server's auto backend runs the same probe (it does not name
//! its backend at start).

mod common;

use std::process::Command;
use std::time::Duration;

use common::process::run_bounded;
use common::server::{lock_file, start_server_unset};
use ds4::testmodel::Variant;

/// The lines a start may not print: libwayland's and libxcb's complaints,
/// and any other line that reads as a failure.
fn noise(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            low.contains("xdg_runtime_dir")
                || low.contains("wayland")
                || low.contains("xcb")
                || low.starts_with("error")
                || low.starts_with("warning")
        })
        .collect()
}

fn ds4_without_runtime_dir(args: &[&str]) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4"));
    cmd.args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("DISPLAY");
    let o = run_bounded(cmd, Duration::from_secs(120), "ds4");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "ds4 {args:?} failed: {err}");
    (out, err)
}

#[test]
fn cli_start_without_runtime_dir_is_quiet() {
    let m = common::tiny_model_path(Variant::Q8);
    let (_, err) = ds4_without_runtime_dir(&[
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "2",
        "--temp",
        "0",
        "--nothink",
    ]);
    assert!(noise(&err).is_empty(), "noise at start:\n{err}");
    // The auto backend probed the GPU and said what it chose.
    assert!(err.contains("ds4: backend:"), "{err}");
    if std::env::var_os("CI").is_some() {
        assert!(
            err.contains("Vulkan"),
            "no Vulkan adapter was probed: {err}"
        );
    }

    let (out, err) = ds4_without_runtime_dir(&["--list-devices"]);
    assert!(noise(&err).is_empty(), "noise in --list-devices:\n{err}");
    if std::env::var_os("CI").is_some() {
        assert!(out.contains("(Vulkan, "), "no Vulkan adapter listed: {out}");
    }
}

#[test]
fn server_start_without_runtime_dir_is_quiet() {
    let unset = ["XDG_RUNTIME_DIR", "WAYLAND_DISPLAY", "DISPLAY"];
    let lock = lock_file();
    // `--backend auto`: the server probes the GPU before it listens.
    let server = start_server_unset(&["--backend", "auto"], &[], &unset, &lock);
    let err = server.stderr_text();
    drop(server);
    assert!(noise(&err).is_empty(), "noise at start:\n{err}");
    assert!(err.contains("loaded"), "{err}");
}
