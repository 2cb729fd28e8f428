//! `ds4-bench`'s modes for a machine without cargo (docs/GPU_ROUND.md):
//! `--check cuda|wgpu|cpu`, the backend self-check of the library
//! (`ds4::app::selfcheck`), one PASS/FAIL line per check and exit 1 on any
//! failure; `--list-devices`; `--make-model flash:N|tiny:VARIANT`, the
//! generated models the round benchmarks.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use ds4::app::selfcheck::{self, CheckOptions, Line, Size, Status};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::testmodel::{self, TestModelSpec, Variant, Vocab};

use super::Args;

/// `--check BACKEND`.
pub fn run(a: &Args, backend: &str, bo: BackendOptions) -> Result<(), String> {
    let backend = match backend {
        "cuda" => BackendKind::Cuda,
        "wgpu" => BackendKind::Wgpu,
        "cpu" => BackendKind::Cpu,
        o => return Err(format!("--check {o:?}: cuda, wgpu or cpu")),
    };
    let size = Size::parse(&a.check_size).map_err(|e| format!("--check-size: {e}"))?;
    let only = match &a.check_only {
        None => None,
        Some(list) => {
            let v: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
            if let Some(bad) = v.iter().find(|c| !selfcheck::CHECKS.contains(&c.as_str())) {
                return Err(format!(
                    "--check-only {bad:?}: one of {}",
                    selfcheck::CHECKS.join(", ")
                ));
            }
            Some(v)
        }
    };
    // A folder of our own is removed after; a given one keeps its models
    // for the next run.
    let (dir, ours) = match &a.check_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("ds4-check-{}", std::process::id())),
            true,
        ),
    };
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let mut csv = match &a.csv {
        Some(p) => {
            let mut f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            writeln!(f, "status,check,target,secs,figure").map_err(|e| e.to_string())?;
            Some(f)
        }
        None => None,
    };
    let name = format!("{backend:?}").to_lowercase();
    println!(
        "ds4-bench --check {name} ({}; models in {}; {threads} CPU threads for cpu-ref)",
        a.check_size,
        dir.display()
    );
    let t = Instant::now();
    let o = CheckOptions {
        backend,
        size,
        dir: dir.clone(),
        only,
        base: bo,
    };
    let mut csv_error = None;
    let lines = selfcheck::run(&o, &mut |l: &Line| {
        println!("{l}");
        let _ = std::io::stdout().flush();
        if let Some(f) = &mut csv {
            let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
            let status = format!("{:?}", l.status).to_uppercase();
            if let Err(e) = writeln!(
                f,
                "{status},{},{},{:.2},{}",
                q(&l.check),
                q(&l.target),
                l.secs,
                q(&l.figure)
            ) {
                csv_error = Some(e.to_string());
            }
        }
    });
    if ours {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let count = |s: Status| lines.iter().filter(|l| l.status == s).count();
    let (pass, fail, skip) = (
        count(Status::Pass),
        count(Status::Fail),
        count(Status::Skip),
    );
    println!(
        "self-check {name} ({}): {pass} passed, {fail} failed, {skip} skipped in {:.1} s",
        a.check_size,
        t.elapsed().as_secs_f64()
    );
    if let Some(e) = csv_error {
        return Err(format!("--csv: {e}"));
    }
    if fail > 0 || pass == 0 {
        return Err(format!(
            "--check {name}: {fail} of {} checks failed",
            lines.len()
        ));
    }
    Ok(())
}

/// `--make-model KIND`: writes the model to `-m`, which must not exist
/// (the default `-m` is where a real model lives); `flash:N` also writes
/// its MTP draft file beside it (`-m` with extension `.mtp.gguf`).
pub fn make_model(a: &Args, kind: &str) -> Result<(), String> {
    let (spec, variant) = match kind.split_once(':') {
        Some(("flash", n)) => {
            let layers: usize = n
                .parse()
                .ok()
                .filter(|&l| l >= 2)
                .ok_or_else(|| format!("--make-model {kind:?}: flash:N with N ≥ 2 layers"))?;
            (TestModelSpec::flash_bench(layers), Variant::Q2)
        }
        Some(("tiny", v)) => (
            TestModelSpec::tiny(),
            Variant::parse(v).ok_or_else(|| {
                format!("--make-model {kind:?}: tiny:f32, tiny:q8, tiny:q2, tiny:q4 or tiny:mxfp4")
            })?,
        ),
        _ => {
            return Err(format!(
            "--make-model {kind:?}: flash:N (the N-layer Flash-width bench model) or tiny:VARIANT"
        ))
        }
    };
    let out: &PathBuf = &a.model;
    if out.exists() {
        return Err(format!(
            "--make-model: {} exists (give -m a new file)",
            out.display()
        ));
    }
    let t = Instant::now();
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let vocab = Vocab::load_default()?;
    testmodel::write_model(&spec, variant, &vocab, &tmp)
        .and_then(|_| std::fs::rename(&tmp, out))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", out.display())
        })?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "ds4-bench: wrote {} ({}, {}, {}) in {:.1} s",
        out.display(),
        spec.core.name,
        variant.name(),
        ds4::app::report::human(bytes),
        t.elapsed().as_secs_f64()
    );
    if kind.starts_with("flash") {
        // Its MTP draft file beside it, for `--spec-table --mtp`.
        let mtp = out.with_extension("mtp.gguf");
        testmodel::write_mtp(&spec, variant, &mtp)
            .map_err(|e| format!("{}: {e}", mtp.display()))?;
        eprintln!("ds4-bench: wrote {}", mtp.display());
        // And a DSpark drafter of DeepSeek's shape, for `--spec-table --dspark`.
        let ds = out.with_extension("dspark.gguf");
        let n_vocab = vocab.tokens.len();
        let d = testmodel::dspark::DsparkSpec::flash_for(&spec, n_vocab);
        testmodel::dspark::write_dspark(&spec, &d, variant, n_vocab, &ds)
            .map_err(|e| format!("{}: {e}", ds.display()))?;
        eprintln!("ds4-bench: wrote {}", ds.display());
    }
    Ok(())
}
