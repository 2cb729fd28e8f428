//! `--backend cuda` on a machine without a usable NVIDIA GPU (or a binary
//! built without the `cuda` feature) is a clear one-line error with exit
//! status 1, never a panic; `--list-devices` says why no CUDA device is
//! listed. On a machine with a CUDA device the error cases are skipped.

mod common;

use std::process::{Command, Output};

use ds4::testmodel::Variant;

fn cuda_present() -> bool {
    ds4::backend::cuda_device_lines().is_ok_and(|l| !l.is_empty())
}

/// `o`, a run of `bin` with `flags` asking for CUDA where there is none,
/// failed with exit status 1 and one `<bin>: ` line naming the backend as
/// not available, no panic, and nothing on stdout (`no_output` says what
/// would have been there).
fn assert_no_cuda_error(o: &Output, bin: &str, flags: &[&str], no_output: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{flags:?}: {err}");
    assert!(!err.contains("panicked"), "{flags:?}: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with(&format!("{bin}: ")) && l.contains("backend cuda"))
        .unwrap_or_else(|| panic!("{flags:?}: no {bin}: line naming cuda in {err}"));
    assert!(line.contains("not available"), "{line}");
    assert!(o.stdout.is_empty(), "{flags:?}: {no_output}");
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
        assert_no_cuda_error(&o, "ds4", flags, "generated text without a backend");
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

#[test]
fn bandwidth_on_cuda_without_a_gpu_is_a_clear_error() {
    if cuda_present() {
        eprintln!("skipped: a CUDA device is present");
        return;
    }
    for flags in [&["--backend", "cuda"][..], &["--cuda"][..]] {
        let o = Command::new(env!("CARGO_BIN_EXE_ds4-bench"))
            .arg("--bandwidth")
            .args(flags)
            .output()
            .unwrap();
        assert_no_cuda_error(&o, "ds4-bench", flags, "a table without a device");
    }
}

#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

/// `LD_LIBRARY_PATH` for a child process that should run on CUDA: nothing
/// when a real device is present, else the host emulator's folder.
#[cfg(feature = "cuda")]
fn cuda_child_env() -> Option<std::path::PathBuf> {
    if cuda_present() {
        return None;
    }
    let lib = cuda_emu::library().unwrap_or_else(|e| panic!("no CUDA emulator: {e}"));
    Some(lib.parent().unwrap().to_path_buf())
}

/// `ds4-bench --bandwidth --backend cuda` end to end (on the emulator in
/// CI, small shapes so it takes seconds): a device-read line, a copy line,
/// one matvec line per Flash shape and the fused gate+up line, each with a
/// positive finite GB/s and a fraction of device read, in the table and in
/// the CSV.
#[cfg(feature = "cuda")]
#[test]
fn bandwidth_mode_runs_on_cuda() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda_bw");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join(format!("bw-{}.csv", std::process::id()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-bench"));
    cmd.args(["--bandwidth", "--backend", "cuda", "--bw-mib", "2"])
        .args(["--bw-trials", "1", "--bw-max-out", "24", "--csv"])
        .arg(&csv);
    if let Some(d) = cuda_child_env() {
        cmd.env("LD_LIBRARY_PATH", d);
    }
    let o = cmd.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.starts_with("device: ") && out.contains("(cuda, sm_"),
        "{out}"
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .map(|l| {
            // Quoted fields hold no commas here except the device name,
            // which is the first field: split it off first.
            let rest = l.rsplitn(13, ',').collect::<Vec<_>>();
            rest.into_iter().rev().skip(1).map(str::to_string).collect()
        })
        .collect();
    // host read, device read, device copy, 8 matvecs, fused gate+up.
    let n_shapes = ds4::backend::bandwidth::FLASH_MATVECS.len();
    assert_eq!(rows.len(), 3 + n_shapes + 1, "{text}");
    let kinds: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        &kinds[..3],
        ["\"host read (CPU)\"", "\"device read\"", "\"device copy\""]
    );
    assert!(
        kinds[3..3 + n_shapes].iter().all(|k| *k == "\"matvec\""),
        "{kinds:?}"
    );
    assert_eq!(kinds[3 + n_shapes], "\"fused gate+up\"");
    for (r, (name, ty, n_in, n_out)) in rows[3..3 + n_shapes]
        .iter()
        .zip(ds4::backend::bandwidth::FLASH_MATVECS)
    {
        assert_eq!(r[1], format!("\"{name}\""));
        assert_eq!(r[2], ty.name());
        assert_eq!(r[3], n_in.to_string());
        assert_eq!(r[4], n_out.min(&24).to_string());
    }
    for r in &rows[1..] {
        let gbps: f64 = r[8].parse().unwrap();
        let frac: f64 = r[9].parse().unwrap();
        assert!(gbps.is_finite() && gbps > 0.0, "{r:?}");
        assert!(frac.is_finite() && frac > 0.0, "{r:?}");
        assert_eq!(r[10], "event", "{r:?}");
    }
    // Every measured line is in the table too.
    assert_eq!(
        out.lines().filter(|l| l.ends_with("event")).count(),
        rows.len() - 1,
        "{out}"
    );
    let _ = std::fs::remove_file(&csv);
}

/// `ds4 --info --backend cuda` measures the CUDA device's read bandwidth
/// and prints the decode roofline from it.
#[cfg(feature = "cuda")]
#[test]
fn info_prints_the_cuda_decode_roofline() {
    let m = common::tiny_model_path(Variant::Q8);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4"));
    cmd.args(["-m", m.to_str().unwrap(), "--info", "--backend", "cuda"]);
    if let Some(d) = cuda_child_env() {
        cmd.env("LD_LIBRARY_PATH", d);
    }
    let o = cmd.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let roof = &out[out
        .find("== decode roofline ==")
        .unwrap_or_else(|| panic!("{out}"))..];
    assert!(roof.contains("(cuda, sm_"), "{roof}");
    let bw: f64 = roof
        .lines()
        .find_map(|l| l.strip_prefix("read bandwidth (measured)"))
        .and_then(|l| l.trim().strip_suffix("GB/s"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{roof}"));
    assert!(bw.is_finite() && bw > 0.0, "{roof}");
    assert!(roof.contains("tokens/s"), "{roof}");
}
