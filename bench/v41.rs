//! V4.1 speed at Flash width beside V4 (`cargo bench --bench v41`; issue 19 item 7).
//!
//! Builds two few-layer models in /tmp (removed at the end unless
//! DS4_BENCH_KEEP is set): V4.1 at Flash width (5120 embedding, 64 heads of
//! 512, 384 experts of 2304 top-6 plus the shared one, ds4's q2 mix with
//! random blocks, Engram at two layers) and V4's bench model (4096, 256
//! experts of 2048 top-6, as `cpu_forward`) with the same layer count.
//! Each runs on the fast CPU backend (`cpu`), one after the other in this
//! process: V4 through a `Session`, V4.1 through its graph (no V4.1 session
//! yet), with the Engram rows read from the file by an `EngramReader`
//! (positioned reads and a hot-row cache, the tables never mapped), hashed
//! from the ids before each step as a session would.
//!
//! Reported: prefill and decode tokens/s, weight bytes read per decoded token
//! (routed experts at top-k/n), Engram bytes read per token and the cache hit
//! rate, and decode as a fraction of the measured read bandwidth. Decode runs
//! twice for V4.1: with the Engram table pages as the generator left them
//! (page cache) and after `POSIX_FADV_DONTNEED` on the tables (reads from
//! the disk).
//!
//! Environment: DS4_BENCH_LAYERS (default 2, at least 2), DS4_BENCH_PREFILL (default 64
//! tokens), DS4_BENCH_DECODE (default 16), DS4_BENCH_ENGRAM_VOCAB (where the
//! prime search starts, default 50000: tables of 1.2 M rows, 0.3 GiB each;
//! the release's 16,000,000 gives 384 M rows, 94 GiB each, beyond this
//! disk), DS4_BENCH_ENGRAM_CACHE (hot rows, default 4096), DS4_BENCH_DIR
//! (default /tmp/ds4-bench-v41).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ds4::backend::{self, BackendKind, BackendOptions};
use ds4::graph::StepParams;
use ds4::model::forward::Numerics;
use ds4::model::logits::Logits;
use ds4::model::v41::engram::{hash_rows, EngramHistory};
use ds4::model::v41::engram_reader::{drop_table_pages, EngramReader};
use ds4::model::v41::forward::{engram_input, record, V41ForwardOptions, V41KvLayout};
use ds4::model::v41::V41ModelFile;
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::v41::{write_v41_bench_model, V41Spec};
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

#[path = "support/mod.rs"]
mod support;
use support::env_usize;

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// A prompt with the repetition real text has: the first 16 tokens recur
/// at the start of every 32 (so Engram n-grams recur), the rest spread over
/// the vocab.
fn prompt(n: usize, n_vocab: usize) -> Vec<u32> {
    let v = (n_vocab as u32 - 10).min(120_000);
    (0..n as u32)
        .map(|i| {
            let j = if i % 32 < 16 { i % 32 } else { i };
            (j * 7919) % v + 10
        })
        .collect()
}

struct Figures {
    prefill_tps: f64,
    decode_tps: f64,
    weight_bytes: u64,
}

fn v4(dir: &Path, layers: usize, n_prefill: usize, n_decode: usize, bw: f64) -> Figures {
    let path = dir.join(format!("v4-medium-q2-{layers}l.gguf"));
    if !path.exists() {
        // The cpu_forward bench model (window layers, then CSA/HCA pairs),
        // with one window layer only when there are two layers, as V4.1's.
        let mut spec = TestModelSpec::flash();
        let windows = window_layers(layers);
        spec.core.compress_ratios = (0..layers)
            .map(|l| match l {
                l if l < windows => 0,
                l if (l - windows) % 2 == 0 => 4,
                _ => 128,
            })
            .collect();
        spec.n_hash_layers = spec.n_hash_layers.min(layers);
        spec.core.name = format!("V4 bench model ({layers} Flash-width layers, random blocks)");
        spec.core.init_gain = 0.5;
        eprintln!("generating {} ...", path.display());
        let t = Instant::now();
        write_model(
            &spec,
            Variant::Q2,
            &Vocab::load_default().expect("vocab"),
            &path,
        )
        .expect("write V4 model");
        eprintln!("  {:.0} s", t.elapsed().as_secs_f64());
    }
    let model = Arc::new(ModelFile::open(&path).expect("open V4 model"));
    let cfg = &model.config;
    let weight_bytes = model.weights.active_bytes_per_token(cfg);
    model.warm(&mut |_, _| {});
    let ids = prompt(n_prefill, cfg.n_vocab);
    let opts = SessionOptions {
        ctx: n_prefill + n_decode + 8,
        prefill_chunk: 2048,
        numerics: Numerics::Model,
        backend: BackendKind::Cpu,
        backend_options: BackendOptions::from_env(),
        ..Default::default()
    };
    let mut sess = Session::new(model.clone(), opts).expect("V4 session");
    let (prefill_s, decode_s) = support::time_greedy(&mut sess, &ids, n_decode);
    let f = Figures {
        prefill_tps: n_prefill as f64 / prefill_s,
        decode_tps: n_decode as f64 / decode_s,
        weight_bytes,
    };
    println!(
        "V4   {} ({:.2} GiB, {} layers: {} experts of {} top-{}, width {})",
        path.display(),
        model.file.file_len() as f64 / GIB,
        cfg.n_layer,
        cfg.n_expert,
        cfg.expert_ff,
        cfg.n_expert_used,
        cfg.n_embd
    );
    report("V4  ", &f, 0.0, bw);
    f
}

fn v41(dir: &Path, layers: usize, n_prefill: usize, n_decode: usize, bw: f64) -> Figures {
    let engram_vocab = env_usize("DS4_BENCH_ENGRAM_VOCAB", 50_000) as u64;
    let path = dir.join(format!("v41-flash-q2-{layers}l-e{engram_vocab}.gguf"));
    if !path.exists() {
        let spec = V41Spec::flash_bench(layers, engram_vocab);
        eprintln!("generating {} ...", path.display());
        let t = Instant::now();
        write_v41_bench_model(&spec, &Vocab::load_default().expect("vocab"), &path)
            .expect("write V4.1 model");
        eprintln!("  {:.0} s", t.elapsed().as_secs_f64());
    }
    let m = Arc::new(V41ModelFile::open(&path).expect("open V4.1 model"));
    let cfg = &m.config;
    let weight_bytes = m.weights.active_bytes_per_token(cfg);
    // Fault the resident weights in (as V4's `warm`); the tables stay out.
    m.warm();

    let kv = V41KvLayout::new(cfg, n_prefill + 2 * n_decode + 8);
    let graph = |step: usize| {
        // What `ds4` runs by default: the official rounding steps.
        let opts = V41ForwardOptions {
            numerics: Numerics::Model,
            logits: Logits::Last,
            keep: Vec::new(),
            engram_from_host: true,
        };
        Arc::new(record(cfg, &m.weights, &kv, step, &opts))
    };
    let (gp, gd) = (graph(n_prefill), graph(1));
    let mut b = backend::open(
        BackendKind::Cpu,
        m.clone(),
        kv.layout.clone(),
        &BackendOptions::from_env(),
    )
    .expect("cpu backend")
    .backend;
    let (hp, hd) = (
        b.load_graph(gp.clone()).expect("prefill graph"),
        b.load_graph(gd.clone()).expect("decode graph"),
    );
    let eg = &cfg.engram;
    let cache_rows = env_usize("DS4_BENCH_ENGRAM_CACHE", 4096);
    let mut reader =
        EngramReader::open(m.file.path(), eg, &m.weights, cache_rows).expect("Engram reader");
    let (cols, hdim, slots) = (eg.cols(), eg.head_dim, eg.layer_ids.len());
    let mut hist = EngramHistory::new(eg);
    // One step: hash the ids (known before the step), read their rows into
    // each Engram layer's input, run.
    let step = |b: &mut Box<dyn backend::Backend>,
                reader: &mut EngramReader,
                hist: &mut EngramHistory,
                g: &Arc<ds4::graph::Graph>,
                h,
                toks: &[u32],
                pos0: usize| {
        let n = toks.len();
        let rows = hash_rows(eg, hist, toks, None);
        reader.count_tokens(n);
        for (slot, &l) in eg.layer_ids.iter().enumerate() {
            let mine: Vec<u32> = (0..n)
                .flat_map(|t| {
                    rows[(t * slots + slot) * cols..(t * slots + slot + 1) * cols]
                        .iter()
                        .copied()
                })
                .collect();
            let mut buf = vec![0f32; n * cols * hdim];
            reader.read(slot, &mine, &mut buf).expect("Engram read");
            b.write_value(h, engram_input(g, l).expect("engram input"), &buf)
                .expect("write Engram rows");
        }
        b.run(h, toks, StepParams { pos0, n_tokens: n })
            .expect("V4.1 step");
        ds4::sampler::argmax(&b.read_value(h, g.logits).expect("logits")) as u32
    };
    let ids = prompt(n_prefill, cfg.n_vocab);
    let t = Instant::now();
    let mut next = step(&mut b, &mut reader, &mut hist, &gp, hp, &ids, 0);
    let prefill_s = t.elapsed().as_secs_f64();
    let pre = reader.stats();
    let mut decode = |b: &mut Box<dyn backend::Backend>,
                      reader: &mut EngramReader,
                      next: &mut u32,
                      pos0: usize| {
        let before = reader.stats();
        let t = Instant::now();
        for i in 0..n_decode {
            *next = step(b, reader, &mut hist, &gd, hd, &[*next], pos0 + i);
        }
        let s = t.elapsed().as_secs_f64();
        let after = reader.stats();
        let tok = (after.tokens - before.tokens) as f64;
        let bytes = (after.bytes_read - before.bytes_read) as f64 / tok;
        let hits = (after.cache_hits - before.cache_hits) as f64
            / (after.rows_requested - before.rows_requested) as f64;
        (n_decode as f64 / s, bytes, hits)
    };
    let (warm_tps, warm_bytes, warm_hits) = decode(&mut b, &mut reader, &mut next, n_prefill);
    drop_table_pages(&m).expect("drop the tables' pages");
    let (cold_tps, cold_bytes, cold_hits) =
        decode(&mut b, &mut reader, &mut next, n_prefill + n_decode);
    let f = Figures {
        prefill_tps: n_prefill as f64 / prefill_s,
        decode_tps: warm_tps,
        weight_bytes,
    };
    println!(
        "V4.1 {} ({:.2} GiB, {} layers: {} experts of {} top-{}, width {}, {} heads of {}; Engram at {:?}, {:?} rows, {:.2} GiB of tables)",
        path.display(),
        m.file.file_len() as f64 / GIB,
        cfg.n_layer,
        cfg.n_expert,
        cfg.expert_ff,
        cfg.n_expert_used,
        cfg.n_embd,
        cfg.n_head,
        cfg.head_dim,
        eg.layer_ids,
        eg.rows,
        m.weights.engram_table_bytes() as f64 / GIB
    );
    println!(
        "V4.1 Engram      prefill: {:.0} B read per token, hit rate {:.1} %; decode (page cache): {warm_bytes:.0} B/token, hit rate {:.1} %; decode after evicting the tables: {cold_bytes:.0} B/token, hit rate {:.1} %, {cold_tps:.2} tokens/s (cache {} rows, {:.1} MiB)",
        pre.bytes_read as f64 / pre.tokens as f64,
        100.0 * pre.hit_rate(),
        100.0 * warm_hits,
        100.0 * cold_hits,
        cache_rows,
        reader.cache_bytes() as f64 / MIB
    );
    report("V4.1", &f, warm_bytes, bw);
    f
}

/// Window-only layers before the first compressed one: Flash's two, or one
/// in a two-layer model.
fn window_layers(layers: usize) -> usize {
    if layers > 2 {
        2
    } else {
        1
    }
}

fn report(name: &str, f: &Figures, engram_bytes: f64, bw: f64) {
    let per_token = f.weight_bytes as f64 + engram_bytes;
    println!(
        "{name} prefill {:.2} tokens/s; decode {:.2} tokens/s; {:.1} MiB weights + {:.1} KiB Engram per decoded token; roofline {:.1}% of {:.2} GB/s (ceiling {:.2} tokens/s)",
        f.prefill_tps,
        f.decode_tps,
        f.weight_bytes as f64 / MIB,
        engram_bytes / 1024.0,
        100.0 * per_token * f.decode_tps / bw,
        bw / 1e9,
        bw / per_token
    );
}

fn main() {
    let layers = env_usize("DS4_BENCH_LAYERS", 2).max(2);
    let n_prefill = env_usize("DS4_BENCH_PREFILL", 64);
    let n_decode = env_usize("DS4_BENCH_DECODE", 16);
    let dir = PathBuf::from(
        std::env::var("DS4_BENCH_DIR").unwrap_or_else(|_| "/tmp/ds4-bench-v41".into()),
    );
    std::fs::create_dir_all(&dir).expect("bench dir");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!("measuring read bandwidth ...");
    let bw = ds4::backend::bandwidth::read_bandwidth(1 << 30, 5);
    println!(
        "threads {}; read bandwidth {:.2} GB/s (best of 5 over 1 GiB); load average at start {}",
        rayon::current_num_threads(),
        bw / 1e9,
        load.trim()
    );
    println!("prompt {n_prefill} tokens (its first 16 tokens recurring every 32), decode {n_decode} tokens, fast CPU backend");
    let a = v4(&dir, layers, n_prefill, n_decode, bw);
    if std::env::var_os("DS4_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_file(dir.join(format!("v4-medium-q2-{layers}l.gguf")));
    }
    let b = v41(&dir, layers, n_prefill, n_decode, bw);
    println!(
        "V4.1 / V4: prefill {:.2}x, decode {:.2}x, weight bytes per token {:.2}x",
        b.prefill_tps / a.prefill_tps,
        b.decode_tps / a.decode_tps,
        b.weight_bytes as f64 / a.weight_bytes as f64
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at end {}", load.trim());
    if std::env::var_os("DS4_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
