//! `--backend cuda` on a machine without a usable NVIDIA GPU (or a binary
//! built without the `cuda` feature) is a clear one-line error with exit
//! status 1, never a panic; `--list-devices` says why no CUDA device is
//! listed. On a machine with a CUDA device the error cases are skipped.

mod common;

use std::process::Command;

use ds4::testmodel::Variant;

fn cuda_present() -> bool {
    ds4::backend::cuda_device_lines().is_ok_and(|l| !l.is_empty())
}

#[test]
fn backend_cuda_without_a_gpu_is_a_clear_error() {
    if cuda_present() {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    let m = common::tiny_model_path(Variant::Q8);
    for flags in [&["--backend", "cuda"][..], &["--cuda"][..]] {
        let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
            .args([
                "-m",
                m.to_str().unwrap(),
                "-p",
                "Hello",
                "--nothink",
                "-n",
                "1",
            ])
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("ds4: ") && l.contains("backend cuda"))
            .unwrap_or_else(|| panic!("{flags:?}: no ds4: line naming cuda in {err}"));
        assert!(line.contains("not available"), "{line}");
        assert!(
            o.stdout.is_empty(),
            "{flags:?}: generated text without a backend"
        );
    }
}

#[test]
fn list_devices_says_why_no_cuda_device_is_listed() {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .arg("--list-devices")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    if cuda_present() {
        assert!(
            out.lines()
                .any(|l| l.starts_with("cuda:0 ") && l.contains("sm_")),
            "{out}"
        );
    } else {
        let line = out
            .lines()
            .find(|l| l.starts_with("cuda: none ("))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(line.len() > "cuda: none ()".len(), "{line}");
    }
}
