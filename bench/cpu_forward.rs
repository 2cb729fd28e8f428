//! CPU backend speed on a medium generated model (`cargo bench --bench cpu_forward`).
//!
//! Builds (once, cached under target/) a model with Flash's full widths —
//! 4096 embedding, 64 heads × 512, 256 experts of 2048 in ds4's q2 mix — but
//! only a few layers, so it fits in memory. Then measures the machine's read
//! bandwidth, prefill and decode speed, and reports decode as a fraction of
//! the bandwidth roofline: weight bytes read per token × tokens/s ÷ bandwidth.
//!
//! The fast CPU backend (`cpu`) and the reference (`cpu-ref`) run in the same
//! process, one after the other, on the same file.
//!
//! Environment: DS4_BENCH_LAYERS (default 4), DS4_BENCH_PREFILL (default 256
//! tokens), DS4_BENCH_DECODE (default 16 tokens), DS4_BENCH_MODEL (a GGUF to
//! use instead of the generated one, e.g. a tiny test model),
//! DS4_BENCH_BACKENDS (default `cpu,cpu-ref`), DS4_CPU_ISA (kernel path).

use std::path::PathBuf;
use std::sync::Arc;

use ds4::backend::BackendKind;
use ds4::backend::BackendOptions;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

#[path = "support/mod.rs"]
mod support;
use support::env_usize;

fn main() {
    let layers = env_usize("DS4_BENCH_LAYERS", 4);
    let n_prefill = env_usize("DS4_BENCH_PREFILL", 256);
    let n_decode = env_usize("DS4_BENCH_DECODE", 16);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-models");
    std::fs::create_dir_all(&dir).expect("target/bench-models");
    let path = match std::env::var("DS4_BENCH_MODEL") {
        Ok(p) => PathBuf::from(p),
        Err(_) => dir.join(format!("medium-q2-{layers}l.gguf")),
    };
    if !path.exists() {
        let spec = TestModelSpec::flash_bench(layers);
        eprintln!("generating {} ...", path.display());
        let tmp = path.with_extension("tmp");
        write_model(
            &spec,
            Variant::Q2,
            &Vocab::load_default().expect("vocab"),
            &tmp,
        )
        .expect("write model");
        std::fs::rename(&tmp, &path).expect("rename");
    }
    let model = Arc::new(ModelFile::open(&path).expect("open"));
    let cfg = &model.config;
    let weight_bytes = model.weights.active_bytes_per_token(cfg);
    let threads = rayon::current_num_threads();

    // Fault every weight page in first (as `--warm-weights` does), so the
    // timings measure the kernels, not first-touch page faults.
    eprintln!("warming the weights ...");
    model.warm(&mut |_, _| {});
    eprintln!("measuring read bandwidth ...");
    let bw = ds4::backend::bandwidth::read_bandwidth(1 << 30, 5);

    let backends = std::env::var("DS4_BENCH_BACKENDS").unwrap_or_else(|_| "cpu,cpu-ref".into());
    let prompt: Vec<u32> = (0..n_prefill as u32)
        .map(|i| (i * 7919) % (cfg.n_vocab as u32 - 10).min(120_000) + 10)
        .collect();
    let mut results = Vec::new();
    for name in backends.split(',') {
        let backend = BackendKind::parse(name).expect("DS4_BENCH_BACKENDS: cpu, cpu-ref, wgpu");
        let opts = SessionOptions {
            ctx: n_prefill + n_decode + 8,
            prefill_chunk: 2048,
            numerics: Numerics::Model,
            backend,
            backend_options: BackendOptions::from_env(),
            ..Default::default()
        };
        let mut sess = Session::new(model.clone(), opts).expect("session");
        eprintln!("{name}: {}", sess.backend_notice());
        let (prefill_s, decode_s) = support::time_greedy(&mut sess, &prompt, n_decode);
        results.push((name.to_string(), prefill_s, decode_s));
    }

    println!(
        "model          {} ({:.2} GiB, {} layers, q2 mix)",
        path.display(),
        model.file.file_len() as f64 / (1u64 << 30) as f64,
        cfg.n_layer
    );
    println!("threads        {threads}");
    println!("read bandwidth {:.2} GB/s (best of 5 over 1 GiB)", bw / 1e9);
    println!(
        "bytes/token    {:.1} MiB of weights read per decoded token",
        weight_bytes as f64 / (1u64 << 20) as f64
    );
    for (name, prefill_s, decode_s) in &results {
        let tps = n_decode as f64 / decode_s;
        println!(
            "{name:<8} prefill {n_prefill} tokens in {prefill_s:.2} s = {:.2} tokens/s; decode {n_decode} tokens in {decode_s:.2} s = {tps:.2} tokens/s; roofline {:.1}% ({:.2} GB/s of {:.2}; ceiling {:.2} tokens/s)",
            n_prefill as f64 / prefill_s,
            100.0 * weight_bytes as f64 * tps / bw,
            weight_bytes as f64 * tps / 1e9,
            bw / 1e9,
            bw / weight_bytes as f64
        );
    }
    if let [(a, pa, da), (b, pb, db), ..] = &results[..] {
        println!("{a} / {b}: prefill {:.2}x, decode {:.2}x", pb / pa, db / da);
    }
}
