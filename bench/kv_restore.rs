//! Restore from a KVC file vs re-prefill, across prefix lengths
//! (`cargo bench --bench kv_restore`), on the backends `DS4_BENCH_BACKENDS`
//! names (default `cpu`, the fast CPU backend; `cpu-ref`, `wgpu`).
//!
//! The model is generated once into target/bench-models/: Flash's attention
//! state geometry — 43 layers in Flash's ratio pattern (window, window, then
//! CSA ratio 4 / HCA ratio 128), head dim 512, window 128, indexer dim 128,
//! the 129,280 vocabulary — so the session payload, and therefore the file
//! size and the restore work, are exactly Flash's for the same token count.
//! Everything else (embedding 256, 2 heads, 8 small experts, F32) is tiny,
//! so its prefill is far *faster* than Flash's: the prefill column is a lower
//! bound, and docs/PERFORMANCE.md scales it with the measured Flash-width
//! prefill rate.
//!
//! Per backend, a session with context M + 1 (M = the backend's longest
//! prefix) and per prefix length L (1024, 2048, … ≤ M): prefill to L (timed,
//! continuing from the previous L, so each figure is the cumulative time
//! from token 0), write the session as a KVC file (timed: serialise, write,
//! fsync, rename), then load it into a second session (timed: read,
//! checksum, place the state; the page cache is warm — a cold read adds file
//! size ÷ disk read speed), which must then hold the same tokens and logits.
//! A backend that cannot hold M (wgpu on lavapipe: a buffer over the
//! 128 MiB binding limit) prints one row with the error and the run goes on
//! with the next backend.
//!
//! Environment: `DS4_BENCH_BACKENDS` (e.g. `cpu,wgpu:4096,cpu-ref:2048`: a
//! backend name, optionally `:` its own longest prefix), `DS4_BENCH_KV_MAX`
//! (default longest prefix, 8192), `DS4_BENCH_KV_DIR` (where the files go;
//! default target/bench-kv).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ds4::backend::{BackendKind, BackendOptions};
use ds4::kvcache::{load_file, save_file, SaveReason};
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::{write_model, CoreShape, TestModelSpec, Variant, Vocab};

#[path = "support/mod.rs"]
mod support;
use support::env_usize;

fn model_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-models");
    std::fs::create_dir_all(&dir).expect("target/bench-models");
    let path = dir.join("flash-kv-geometry-f32.gguf");
    if !path.exists() {
        let flash = TestModelSpec::flash().core;
        let tiny = TestModelSpec::tiny();
        let spec = TestModelSpec {
            core: CoreShape {
                name: "Flash KV geometry, tiny compute (bench)".into(),
                compress_ratios: flash.compress_ratios.clone(),
                head_dim: flash.head_dim,
                n_rot: flash.n_rot,
                sliding_window: flash.sliding_window,
                indexer_head_dim: flash.indexer_head_dim,
                indexer_top_k: flash.indexer_top_k,
                indexer_heads: 4,
                n_head: 2,
                ..tiny.core
            },
            ..tiny
        };
        eprintln!("generating {} ...", path.display());
        let tmp = path.with_extension("tmp");
        write_model(
            &spec,
            Variant::F32,
            &Vocab::load_default().expect("vocab"),
            &tmp,
        )
        .expect("write model");
        std::fs::rename(&tmp, &path).expect("rename");
    }
    path
}

/// One backend of `DS4_BENCH_BACKENDS`: its kind, the label printed in the
/// table and the longest prefix to try.
struct BenchBackend {
    kind: BackendKind,
    label: String,
    max: usize,
}

/// `DS4_BENCH_BACKENDS=cpu,wgpu:4096,cpu-ref`: comma-separated backend
/// names (`BackendKind::parse`), each optionally with its own longest
/// prefix after a colon (default `DS4_BENCH_KV_MAX`).
fn backends(default_max: usize) -> Result<Vec<BenchBackend>, String> {
    let spec = std::env::var("DS4_BENCH_BACKENDS").unwrap_or_else(|_| "cpu".into());
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, max) = match item.split_once(':') {
            Some((n, m)) => (
                n,
                m.parse::<usize>()
                    .map_err(|_| format!("DS4_BENCH_BACKENDS: bad length in {item:?}"))?,
            ),
            None => (item, default_max),
        };
        let kind = BackendKind::parse(name).map_err(|e| format!("DS4_BENCH_BACKENDS: {e}"))?;
        out.push(BenchBackend {
            kind,
            label: name.to_string(),
            max,
        });
    }
    if out.is_empty() {
        return Err("DS4_BENCH_BACKENDS names no backend".into());
    }
    Ok(out)
}

fn main() {
    let max = env_usize("DS4_BENCH_KV_MAX", 8192);
    let backends = match backends(max) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("kv_restore: {e}");
            std::process::exit(2);
        }
    };
    let dir = std::env::var_os("DS4_BENCH_KV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-kv"));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let model = Arc::new(ModelFile::open(model_path()).expect("open"));
    let cfg = &model.config;
    let longest = backends.iter().map(|b| b.max).max().unwrap_or(0);
    let prompt: Vec<u32> = (0..longest as u32)
        .map(|i| (i * 7919) % 120_000 + 10)
        .collect();
    println!(
        "model: {} layers, head dim {}, window {}, indexer dim {}, vocab {} (Flash's KV geometry)",
        cfg.n_layer, cfg.head_dim, cfg.sliding_window, cfg.indexer_head_dim, cfg.n_vocab
    );
    println!("| backend | prefix tokens | re-prefill (this model) | save | restore | restore speedup | file | bytes/token above the first row |");
    println!("|---|---|---|---|---|---|---|---|");
    for b in &backends {
        if let Err(e) = run_backend(&model, b, &prompt[..b.max], &dir) {
            println!("| {} | {} | failed: {e} | | | | | |", b.label, b.max);
        }
    }
}

/// The rows of one backend: a live session sized for the longest prefix
/// prefills 1024, 2048, … tokens, continuing from the previous length (the
/// prefill column is cumulative from token 0); after each length it is
/// saved and loaded into a second session, which must then hold the same
/// tokens and logits.
fn run_backend(
    model: &Arc<ModelFile>,
    b: &BenchBackend,
    prompt: &[u32],
    dir: &Path,
) -> Result<(), String> {
    let opts = SessionOptions {
        ctx: prompt.len() + 1,
        backend: b.kind,
        backend_options: BackendOptions::from_env(),
        ..Default::default()
    };
    let t = Instant::now();
    let mut live = Session::new(model.clone(), opts.clone()).map_err(|e| e.to_string())?;
    let mut restored = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
    eprintln!(
        "{}: two sessions with ctx {} ready in {:.1} s",
        b.label,
        prompt.len() + 1,
        t.elapsed().as_secs_f64()
    );
    let device = live
        .backend_notice()
        .trim_start_matches("backend: ")
        .to_string();
    let mut first: Option<(usize, u64)> = None;
    let mut prefill_s = 0.0;
    let mut l = 1024.min(prompt.len());
    while l <= prompt.len() && l > 0 {
        let t = Instant::now();
        live.sync(&prompt[..l], &mut |_, _| {})
            .map_err(|e| format!("prefill to {l}: {e}"))?;
        prefill_s += t.elapsed().as_secs_f64();
        let path = dir.join(format!("prefix-{l}.kvc"));
        let t = Instant::now();
        let bytes =
            save_file(&path, &live, b"bench", SaveReason::Unknown).map_err(|e| e.to_string())?;
        let save_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let r = load_file(&path, &mut restored).map_err(|e| e.to_string());
        let restore_s = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&path);
        r?;
        if restored.logits() != live.logits() || restored.tokens() != live.tokens() {
            return Err(format!(
                "{l}: the restored session differs from the saved one"
            ));
        }
        let per_token = match first {
            Some((l0, b0)) => format!("{:.0} B", (bytes - b0) as f64 / (l - l0) as f64),
            None => "—".into(),
        };
        first.get_or_insert((l, bytes));
        println!(
            "| {device} | {l} | {prefill_s:.2} s | {:.0} ms | {:.0} ms | {:.0}× | {:.1} MiB | {per_token} |",
            save_s * 1e3,
            restore_s * 1e3,
            prefill_s / restore_s,
            bytes as f64 / (1u64 << 20) as f64
        );
        l *= 2;
    }
    Ok(())
}
