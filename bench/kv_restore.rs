//! Restore from a KVC file vs re-prefill, across prefix lengths
//! (`cargo bench --bench kv_restore`), on the CPU backend.
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
//! Per prefix length L: prefill to L (timed, continuing from the previous L,
//! so each figure is the cumulative time from token 0), write the session as
//! a KVC file (timed: serialise, write, fsync, rename), then load it into a
//! fresh session (timed: read, checksum, place the state; the page cache is
//! warm — a cold read adds file size ÷ disk read speed).
//!
//! Environment: DS4_BENCH_KV_MAX (default 8192), DS4_BENCH_KV_DIR (where the
//! files go; default target/bench-kv).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ds4::kvcache::{load_file, save_file, SaveReason};
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn model_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-models");
    std::fs::create_dir_all(&dir).expect("target/bench-models");
    let path = dir.join("flash-kv-geometry-f32.gguf");
    if !path.exists() {
        let flash = TestModelSpec::flash();
        let spec = TestModelSpec {
            name: "Flash KV geometry, tiny compute (bench)".into(),
            compress_ratios: flash.compress_ratios.clone(),
            head_dim: flash.head_dim,
            n_rot: flash.n_rot,
            sliding_window: flash.sliding_window,
            indexer_head_dim: flash.indexer_head_dim,
            indexer_top_k: flash.indexer_top_k,
            indexer_heads: 4,
            n_head: 2,
            ..TestModelSpec::tiny()
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

fn main() {
    let max = env("DS4_BENCH_KV_MAX", 8192);
    let dir = std::env::var_os("DS4_BENCH_KV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-kv"));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let model = Arc::new(ModelFile::open(model_path()).expect("open"));
    let cfg = &model.config;
    let opts = SessionOptions {
        ctx: max + 1,
        ..Default::default()
    };
    let prompt: Vec<u32> = (0..max as u32).map(|i| (i * 7919) % 120_000 + 10).collect();
    let mut live = Session::new(model.clone(), opts.clone()).expect("session");
    let mut restored = Session::new(model.clone(), opts).expect("session");
    println!(
        "model: {} layers, head dim {}, window {}, indexer dim {}, vocab {} (Flash's KV geometry)",
        cfg.n_layer, cfg.head_dim, cfg.sliding_window, cfg.indexer_head_dim, cfg.n_vocab
    );
    println!("| prefix tokens | re-prefill (this model) | save | restore | restore speedup | file | bytes/token above the fixed part |");
    println!("|---|---|---|---|---|---|---|");
    let mut lens = vec![];
    let mut l = 1024.min(max);
    while l <= max {
        lens.push(l);
        l *= 2;
    }
    let mut prefill_s = 0.0;
    let mut first: Option<(usize, u64)> = None;
    for &l in &lens {
        let t = Instant::now();
        live.sync(&prompt[..l], &mut |_, _| {}).expect("prefill");
        prefill_s += t.elapsed().as_secs_f64();
        let path = dir.join(format!("prefix-{l}.kvc"));
        let t = Instant::now();
        let bytes = save_file(&path, &live, b"bench", SaveReason::Unknown).expect("save");
        let save_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        load_file(&path, &mut restored).expect("restore");
        let restore_s = t.elapsed().as_secs_f64();
        assert_eq!(restored.logits(), live.logits());
        let per_token = match first {
            Some((l0, b0)) => format!("{:.0} B", (bytes - b0) as f64 / (l - l0) as f64),
            None => "—".into(),
        };
        first.get_or_insert((l, bytes));
        println!(
            "| {l} | {prefill_s:.2} s | {:.0} ms | {:.0} ms | {:.0}× | {:.1} MiB | {per_token} |",
            save_s * 1e3,
            restore_s * 1e3,
            prefill_s / restore_s,
            bytes as f64 / (1u64 << 20) as f64
        );
        let _ = std::fs::remove_file(&path);
    }
}
