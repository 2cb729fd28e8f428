//! HTTP overhead of ds4-server (`cargo bench --bench server`): time to first
//! token and decode tokens/s through a streaming chat completion vs the same
//! greedy generation through the library loop the CLI uses, on the same
//! model and prompt; then 8 concurrent streaming clients (all served, FIFO
//! order kept, no errors).
//!
//! Environment: DS4_BENCH_MODEL (a GGUF; default a generated tiny q8 model),
//! DS4_BENCH_TOKENS (default 128), DS4_BENCH_RUNS (default 3).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use ds4::chat::{self, ThinkMode};
use ds4::generate::{generate, Observer, Sampled, Step};
use ds4::model::ModelFile;
use ds4::sampler::{Rng, SamplerConfig};
use ds4::server::job;
use ds4::server::metrics::Metrics;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::server::worker::{self, WorkerConfig};
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};
use ds4::Tokenizer;

const CTX: usize = 4096;
const PROMPT: &str = "Explain mmap in two sentences.";

#[path = "support/mod.rs"]
mod support;
use support::env_usize;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DS4_BENCH_MODEL") {
        return PathBuf::from(p);
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-models");
    std::fs::create_dir_all(&dir).expect("target/bench-models");
    let path = dir.join("tiny-q8.gguf");
    if !path.exists() {
        let vocab = Vocab::load_default().expect("vocabulary");
        write_model(&TestModelSpec::tiny(), Variant::Q8, &vocab, &path).expect("tiny model");
    }
    path
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct FirstToken {
    t0: Instant,
    first: Option<f64>,
}

impl Observer for FirstToken {
    fn token(&mut self, _id: u32, _bytes: &[u8]) -> Step {
        self.first.get_or_insert(self.t0.elapsed().as_secs_f64());
        Step::Continue
    }
}

/// (time to first token, decode tokens/s) through the library loop, on one
/// long-lived session as the server has (its buffers are already touched).
fn direct(sess: &mut Session, tok: &Tokenizer, n: usize) -> (f64, f64) {
    sess.reset();
    let prompt = chat::one_shot_prompt(tok, "", PROMPT, ThinkMode::None);
    let t0 = Instant::now();
    sess.sync(&prompt, &mut |_, _| {}).expect("prefill");
    let mut obs = FirstToken { t0, first: None };
    let mut picker = Sampled {
        cfg: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        rng: Rng::new(1),
    };
    let out = generate(sess, tok, n, &mut picker, &mut obs).expect("generate");
    let total = t0.elapsed().as_secs_f64();
    let first = obs.first.unwrap_or(total);
    (
        first,
        (out.tokens.len() as f64 - 1.0) / (total - first).max(1e-9),
    )
}

/// One streaming chat request: (time to first content byte, tokens/s, body).
fn http(addr: &str, n: usize, content: &str) -> (f64, f64, String) {
    let body =
        serde_json::json!({"model":"deepseek-chat","messages":[{"role":"user","content":content}],
        "max_tokens":n,"temperature":0,"stream":true,"stream_options":{"include_usage":true}})
        .to_string();
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let mut first = None;
    loop {
        let k = s.read(&mut buf).expect("read");
        if k == 0 {
            break;
        }
        all.extend_from_slice(&buf[..k]);
        if first.is_none() && String::from_utf8_lossy(&all).contains("\"content\"") {
            first = Some(t0.elapsed().as_secs_f64());
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let text = String::from_utf8(all).expect("UTF-8");
    let tokens = text
        .split("\"completion_tokens\":")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let first = first.unwrap_or(total);
    (first, (tokens - 1.0) / (total - first).max(1e-9), text)
}

fn main() {
    let n = env_usize("DS4_BENCH_TOKENS", 128);
    let runs = env_usize("DS4_BENCH_RUNS", 3);
    let path = model_path();
    let model = Arc::new(ModelFile::open(&path).expect("model"));
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).expect("tokenizer"));

    let mut dsess = Session::new(
        model.clone(),
        SessionOptions {
            ctx: CTX,
            ..SessionOptions::default()
        },
    )
    .expect("session");
    // One untimed run first: page in the weights and the buffers.
    direct(&mut dsess, &tok, n);
    let d: Vec<(f64, f64)> = (0..runs).map(|_| direct(&mut dsess, &tok, n)).collect();
    drop(dsess);

    let sess = Session::new(
        model.clone(),
        SessionOptions {
            ctx: CTX,
            ..SessionOptions::default()
        },
    )
    .expect("session");
    let metrics = Arc::new(Metrics::default());
    let queue = worker::start(
        sess,
        tok.clone(),
        WorkerConfig {
            queued_scripts: Vec::new(),
            trace: None,
            default_tokens: n,
            exact_replay: true,
            tool_memory_max_ids: 1000,
            debug_panic_on_prompt: None,
        },
        metrics.clone(),
        64,
        Box::new(job::NoCache),
        None,
    );
    let state = Arc::new(State {
        queue,
        metrics,
        opts: HttpOptions {
            ctx: CTX,
            default_tokens: n,
            api_key: None,
            max_body_bytes: 1 << 20,
            allow_script: false,
            ..HttpOptions::default()
        },
        counter: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let addr = rt.block_on(async {
        let (addr, server) = warp::serve(routes::routes(state)).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        addr
    });
    let addr = addr.to_string();
    // The same prompt as the direct run (deepseek-chat = no thinking; the
    // server renders no system text, the direct run passes "").
    http(&addr, n, PROMPT);
    let h: Vec<(f64, f64)> = (0..runs)
        .map(|_| {
            let (a, b, _) = http(&addr, n, PROMPT);
            (a, b)
        })
        .collect();

    let (dt, ds) = (
        median(d.iter().map(|x| x.0).collect()),
        median(d.iter().map(|x| x.1).collect()),
    );
    let (ht, hs) = (
        median(h.iter().map(|x| x.0).collect()),
        median(h.iter().map(|x| x.1).collect()),
    );
    println!(
        "model: {} ({} tokens generated, median of {runs})",
        path.display(),
        n
    );
    println!("| path | time to first token | decode |");
    println!("|---|---|---|");
    println!(
        "| library loop (as `ds4 -p`) | {:.1} ms | {:.1} tokens/s |",
        dt * 1e3,
        ds
    );
    println!(
        "| HTTP streaming chat | {:.1} ms | {:.1} tokens/s |",
        ht * 1e3,
        hs
    );
    println!(
        "HTTP overhead: first token +{:.1} ms ({:+.1} %), decode {:+.1} %",
        (ht - dt) * 1e3,
        (ht / dt - 1.0) * 100.0,
        (hs / ds - 1.0) * 100.0
    );

    // 8 concurrent streaming clients, started 20 ms apart so arrival order
    // is known: each must finish, in that order.
    let t0 = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let addr = addr.clone();
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::thread::spawn(move || {
                let (_, _, body) = http(&addr, 32, &format!("client {i}: {PROMPT}"));
                (i, t0.elapsed().as_secs_f64(), body)
            })
        })
        .collect();
    let mut done: Vec<(usize, f64, String)> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    let ok = done
        .iter()
        .filter(|(_, _, b)| b.starts_with("HTTP/1.1 200") && b.contains("data: [DONE]\n\n"))
        .count();
    done.sort_by(|a, b| a.1.total_cmp(&b.1));
    let order: Vec<usize> = done.iter().map(|d| d.0).collect();
    println!(
        "8 concurrent streaming clients: {ok}/8 complete, finish order {order:?}, all done in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}
