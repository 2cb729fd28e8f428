//! `ds4-server`: the OpenAI/Anthropic-compatible HTTP server (SERVER.md).
//! Flags, model and session set-up, then warp on a tokio runtime; the
//! engine runs on the worker thread of `ds4::server::worker`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use argh::FromArgs;
use ds4::backend::BackendOptions;
use ds4::kvcache::KvCacheConfig;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::server::kvdisk::DiskHook;
use ds4::server::metrics::Metrics;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::server::worker::{self, KvCacheHook, WorkerConfig};
use ds4::session::{Session, SessionOptions};
use ds4::tokenizer::Tokenizer;

/// ds4-server — OpenAI chat/completions/Responses and Anthropic messages for DeepSeek V4 Flash.
#[derive(FromArgs)]
#[argh(note = "Examples:
  {command_name} -m ds4flash.gguf
  {command_name} --demo --port 8000       random tiny model, no download
Clients: docs/CLIENTS.md (Claude Code, Codex CLI, opencode)")]
struct Args {
    /// model GGUF (default ./ds4flash.gguf)
    #[argh(option, short = 'm')]
    model: Option<PathBuf>,
    /// serve a generated tiny model with random weights (no download needed)
    #[argh(switch)]
    demo: bool,
    /// bind address, an IPv4 literal or localhost (default 127.0.0.1)
    #[argh(option, default = "String::from(\"127.0.0.1\")")]
    host: String,
    /// bind port (default 8000; 0 picks a free one)
    #[argh(option, default = "8000")]
    port: u16,
    /// context (KV) size in tokens (default 32768)
    #[argh(option, short = 'c', default = "32768")]
    ctx: usize,
    /// max output tokens when a request gives none (default 393216)
    #[argh(option, short = 'n', default = "393216")]
    tokens: usize,
    /// CPU threads (default: physical cores)
    #[argh(option, short = 't')]
    threads: Option<usize>,
    /// add CORS headers to every response
    #[argh(switch)]
    cors: bool,
    /// write a human-readable record of every request to FILE
    #[argh(option)]
    trace: Option<PathBuf>,
    /// require this key (Authorization: Bearer KEY or x-api-key: KEY)
    #[argh(option)]
    api_key: Option<String>,
    /// largest request body in bytes (default 67108864)
    #[argh(option, default = "64 << 20")]
    max_body_bytes: usize,
    /// requests that may wait for the engine before 503 (default 64)
    #[argh(option, default = "64")]
    queue: usize,
    /// do not remember sampled DSML per tool id (always canonical)
    #[argh(switch)]
    disable_exact_dsml_tool_replay: bool,
    /// max tool ids kept in the replay memory (default 100000)
    #[argh(option, default = "100000")]
    tool_memory_max_ids: usize,
    /// model: official rounding steps (default); plain: without them
    #[argh(option, default = "String::from(\"model\")")]
    numerics: String,
    /// backend: auto (default: a real GPU, else CUDA, else the fast cpu),
    /// cpu, cpu-ref, wgpu, cuda
    #[argh(option)]
    backend: Option<String>,
    /// same as --backend cpu
    #[argh(switch)]
    cpu: bool,
    /// same as --backend wgpu (Metal on macOS)
    #[argh(switch)]
    metal: bool,
    /// same as --backend wgpu (Vulkan)
    #[argh(switch)]
    vulkan: bool,
    /// same as --backend cuda
    #[argh(switch)]
    cuda: bool,
    /// disk KV cache folder (off unless given; KVCACHE.md)
    #[argh(option)]
    kv_disk_dir: Option<PathBuf>,
    /// disk KV cache budget in MiB (default 4096)
    #[argh(option, default = "4096")]
    kv_disk_space_mb: u64,
    /// shortest prefix worth a checkpoint, in tokens (default 512)
    #[argh(option, default = "512")]
    kv_cache_min_tokens: usize,
    /// longest prompt that gets a cold save; 0 disables (default 30000)
    #[argh(option, default = "30000")]
    kv_cache_cold_max_tokens: usize,
    /// tokens between continued saves; 0 disables (default 10000)
    #[argh(option, default = "10000")]
    kv_cache_continued_interval_tokens: usize,
    /// tokens trimmed off a cold checkpoint's end (default 32)
    #[argh(option, default = "32")]
    kv_cache_boundary_trim_tokens: usize,
    /// checkpoint lengths rounded down to a multiple of this; 0 = none (default 2048)
    #[argh(option, default = "2048")]
    kv_cache_boundary_align_tokens: usize,
    /// skip checkpoints written with other routed-expert quant bits
    #[argh(switch)]
    kv_cache_reject_different_quant: bool,
}

/// Hidden test switch: requests may carry `ds4_test_script` (the sampler
/// then emits that text). Never set it on a server users talk to.
const SCRIPT_ENV: &str = "DS4_SERVER_TEST_SCRIPTS";

/// Hidden test switch (with `DS4_SERVER_TEST_SCRIPTS`): a file of outputs
/// separated by lines `-----`, used in order by requests without a script.
const SCRIPT_FILE_ENV: &str = "DS4_SERVER_TEST_SCRIPT_FILE";

/// Hidden test switch: disk-cache writes fail with ENOSPC after this many
/// bytes each (a full disk without privileges; `DiskCache::set_write_limit`).
const KV_WRITE_LIMIT_ENV: &str = "DS4_KV_TEST_WRITE_LIMIT";

fn kv_config(a: &Args) -> KvCacheConfig {
    KvCacheConfig {
        kv_disk_dir: a.kv_disk_dir.clone(),
        kv_disk_space_mb: a.kv_disk_space_mb,
        kv_cache_min_tokens: a.kv_cache_min_tokens,
        kv_cache_cold_max_tokens: a.kv_cache_cold_max_tokens,
        kv_cache_continued_interval_tokens: a.kv_cache_continued_interval_tokens,
        kv_cache_boundary_trim_tokens: a.kv_cache_boundary_trim_tokens,
        kv_cache_boundary_align_tokens: a.kv_cache_boundary_align_tokens,
        kv_cache_reject_different_quant: a.kv_cache_reject_different_quant,
        tool_memory_max_ids: a.tool_memory_max_ids,
    }
}

fn kv_write_limit() -> Result<Option<u64>, String> {
    match std::env::var(KV_WRITE_LIMIT_ENV) {
        Err(_) => Ok(None),
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{KV_WRITE_LIMIT_ENV}: expected a byte count, got {v:?}")),
    }
}

fn queued_scripts() -> Result<Vec<String>, String> {
    let (Some(_), Some(f)) = (
        std::env::var_os(SCRIPT_ENV),
        std::env::var_os(SCRIPT_FILE_ENV),
    ) else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.to_string_lossy()))?;
    Ok(text
        .split("\n-----\n")
        .map(|s| s.trim_end_matches('\n').to_string())
        .collect())
}

fn host_addr(host: &str) -> Result<IpAddr, String> {
    if host == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.parse::<Ipv4Addr>()
        .map(IpAddr::V4)
        .map_err(|_| format!("--host must be an IPv4 address or localhost, got {host:?}"))
}

fn model_path(a: &Args) -> Result<PathBuf, String> {
    if a.demo {
        return ds4::demo::demo_model();
    }
    match &a.model {
        Some(p) => Ok(p.clone()),
        None if Path::new("ds4flash.gguf").exists() => Ok(PathBuf::from("ds4flash.gguf")),
        None => Err("no model: ./ds4flash.gguf not found and no -m given (try --demo)".into()),
    }
}

/// Flag values that are wrong on their face: exit status 2 (SERVER.md §2).
fn check(a: &Args) -> Result<(), String> {
    host_addr(&a.host)?;
    kv_config(a).validate()?;
    kv_write_limit()?;
    if a.ctx < 2 || a.tokens == 0 || a.queue == 0 || a.tool_memory_max_ids == 0 {
        return Err("--ctx must be ≥ 2; --tokens, --queue and --tool-memory-max-ids > 0".into());
    }
    Ok(())
}

/// One ds4 engine per machine (SERVER.md §1): an exclusive `flock` on
/// `ds4.lock` in the temporary directory (env `DS4_LOCK_FILE` overrides),
/// holding our pid. The returned file keeps the lock until the process ends.
fn take_lock() -> Result<std::fs::File, String> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let path = std::env::var_os("DS4_LOCK_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ds4.lock"));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "another ds4 process holds {} (set DS4_LOCK_FILE to run a second one)",
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

fn run(a: Args) -> Result<(), String> {
    let addr = SocketAddr::new(host_addr(&a.host)?, a.port);
    let kv_cfg = kv_config(&a);
    let kv_write_limit = kv_write_limit()?;
    let backend = ds4::backend::select::BackendFlags {
        backend: a.backend.clone(),
        cpu: a.cpu,
        metal: a.metal,
        vulkan: a.vulkan,
        cuda: a.cuda,
    }
    .resolve()?;
    let numerics = Numerics::parse(&a.numerics)
        .ok_or_else(|| format!("--numerics: expected model or plain, got {:?}", a.numerics))?;
    let threads = ds4::threads::init_global_pool(a.threads);
    let path = model_path(&a)?;
    let model = Arc::new(ModelFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?);
    let tok = Arc::new(
        Tokenizer::from_gguf(&model.file).map_err(|e| format!("{}: {e}", path.display()))?,
    );
    let sess = Session::new(
        model.clone(),
        SessionOptions {
            ctx: a.ctx,
            numerics,
            backend,
            backend_options: BackendOptions::from_env(),
            ..SessionOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    eprintln!(
        "ds4-server: {} loaded; context buffers {} for {} tokens; {threads} CPU threads",
        path.display(),
        ds4::report::human(sess.state_bytes() as u64),
        a.ctx
    );
    let metrics = Arc::new(Metrics::default());
    let cache: Box<dyn KvCacheHook> =
        match DiskHook::open(&kv_cfg, &model, &metrics, kv_write_limit)? {
            Some(h) => {
                eprintln!(
                    "ds4-server: disk KV cache in {} ({} MiB)",
                    kv_cfg
                        .kv_disk_dir
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display(),
                    kv_cfg.kv_disk_space_mb
                );
                Box::new(h)
            }
            None => Box::new(worker::NoCache),
        };
    let queue = worker::start(
        sess,
        tok,
        WorkerConfig {
            queued_scripts: queued_scripts()?,
            trace: a.trace.clone(),
            default_tokens: a.tokens,
            exact_replay: !a.disable_exact_dsml_tool_replay,
            tool_memory_max_ids: a.tool_memory_max_ids,
        },
        metrics.clone(),
        a.queue,
        cache,
    );
    let state = Arc::new(State {
        queue: queue.clone(),
        metrics,
        opts: HttpOptions {
            ctx: a.ctx,
            default_tokens: a.tokens,
            cors: a.cors,
            api_key: a.api_key.clone(),
            max_body_bytes: a.max_body_bytes,
            allow_script: std::env::var_os(SCRIPT_ENV).is_some(),
        },
        counter: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    rt.block_on(async move {
        // Handlers are installed here, before the banner, so a signal that
        // arrives right after start-up still shuts down cleanly.
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("signal: {e}"))?;
        let mut term = signal(SignalKind::terminate()).map_err(|e| format!("signal: {e}"))?;
        let (bound, server) = warp::serve(routes::routes(state))
            .try_bind_with_graceful_shutdown(addr, async move {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                // A second signal does not wait for the drain.
                tokio::spawn(async move {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    std::process::exit(130);
                });
            })
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        print_banner(bound, a.api_key.is_some());
        server.await;
        Ok::<(), String>(())
    })?;
    // Listener closed: queued jobs finish, then the cache may save.
    eprintln!("ds4-server: shutting down");
    queue.shutdown();
    Ok(())
}

/// The URL and ready-to-paste client settings (docs/CLIENTS.md).
fn print_banner(addr: SocketAddr, keyed: bool) {
    let url = format!("http://{addr}");
    let key = if keyed { "<your --api-key>" } else { "ds4" };
    println!("ds4-server: listening on {url}");
    println!("  Claude Code: ANTHROPIC_BASE_URL={url} ANTHROPIC_AUTH_TOKEN={key} ANTHROPIC_MODEL=deepseek-v4-flash claude");
    println!(
        "  Codex CLI:   OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={key} codex -m deepseek-v4-flash"
    );
    println!("  opencode:    provider baseURL {url}/v1, model deepseek-v4-flash (docs/CLIENTS.md)");
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

fn main() -> ExitCode {
    match ds4::cli::parse_args::<Args>("ds4-server") {
        Ok(a) => {
            if let Err(e) = check(&a) {
                eprintln!("ds4-server: {e}");
                return ExitCode::from(2);
            }
            let _lock = match take_lock() {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("ds4-server: {e}");
                    return ExitCode::from(2);
                }
            };
            ds4::cli::exit_with("ds4-server", run(a))
        }
        Err(code) => code,
    }
}
