//! `ds4-server`: the OpenAI/Anthropic-compatible HTTP server (SERVER.md).
//! Flags, model and session set-up, then warp on a tokio runtime
//! (`ds4::app::serve`); the engine runs on the worker thread of
//! `ds4::server::worker`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use argh::FromArgs;
use ds4::backend::{BackendKind, BackendOptions};
use ds4::chat::Dialect;
use ds4::kvcache::KvCacheConfig;
use ds4::model::forward::Numerics;
use ds4::model::{AnyModel, Arch};
use ds4::server::guard::CorsOrigins;
use ds4::server::job::{self, KvCacheHook};
use ds4::server::kvdisk::{self, DiskHook};
use ds4::server::listen::{self, ServerLimits};
use ds4::server::metrics::Metrics;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::server::slotdisk::SlotDisk;
use ds4::server::slots::{self, SlotConfig};
use ds4::server::worker::{self, WorkerConfig};
use ds4::session::{Batch, Session, SessionOptions};
use ds4::tokenizer::Tokenizer;

ds4::cli_args! {
    /// ds4-server — OpenAI chat/completions/Responses and Anthropic messages for DeepSeek V4 Flash.
    #[derive(FromArgs)]
    #[argh(note = "Examples:
  {command_name} -m ds4flash.gguf
  {command_name} --demo --port 8000       random tiny model, no download
  DS4_API_KEY=... {command_name} --host 0.0.0.0   serve the network, with a key
Without a key only local clients are answered: Host localhost, 127.0.0.1 or
[::1], and JSON POSTs; browser pages only from --cors origins.
Clients: docs/CLIENTS.md (Claude Code, Codex CLI, opencode)
Security, keys and every limit: docs/SECURITY.md")]
    struct Args {
        /// model GGUF (default ./ds4flash.gguf)
        #[argh(option, short = 'm')]
        model: Option<PathBuf>,
        /// V4.1 models: the thinking level 0..100 written for requests that
        /// think without naming an effort (default 75; 0 = requests that say
        /// nothing about thinking do not think)
        #[argh(option)]
        think_level: Option<u8>,
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
        ..Threads,
        /// let web pages from ORIGIN (e.g. http://localhost:3000) call the
        /// server, with CORS headers; repeatable; '*' (any page) needs a key
        #[argh(option)]
        cors: Vec<String>,
        /// write a human-readable record of every request to FILE
        #[argh(option)]
        trace: Option<PathBuf>,
        /// require this key (Authorization: Bearer KEY or x-api-key: KEY);
        /// shown to other local users in the process list: prefer
        /// --api-key-file, or the environment variable DS4_API_KEY (used when
        /// neither flag is given)
        #[argh(option)]
        api_key: Option<String>,
        /// read the key from the first line of FILE
        #[argh(option)]
        api_key_file: Option<PathBuf>,
        /// largest request body in bytes (default 67108864)
        #[argh(option, default = "64 << 20")]
        max_body_bytes: usize,
        /// seconds a client may take to send a request's headers (default 10)
        #[argh(option, default = "10.0")]
        header_timeout: f64,
        /// seconds a request body may stall without a byte (default 10)
        #[argh(option, default = "10.0")]
        body_timeout: f64,
        /// seconds an open connection may sit idle between requests, or a
        /// response wait for the client to read (default 60)
        #[argh(option, default = "60.0")]
        idle_timeout: f64,
        /// open connections at once; one more gets 503 (default: from the
        /// open-file limit, at most 256)
        #[argh(option)]
        max_connections: Option<usize>,
        /// serve N sessions at once: N KV slots, each engine step carries one
        /// row per decoding session (default 1: one request at a time; V4.1
        /// files: the slots take their turns within each step)
        #[argh(option)]
        batched_session: Option<usize>,
        /// same as --batched-session (llama-server's name)
        #[argh(option)]
        parallel: Option<usize>,
        /// with --batched-session > 1: prompt tokens a prefilling session adds
        /// per step, between the others' decode steps (default 128)
        #[argh(option, default = "ds4::server::slots::DEFAULT_PREFILL_QUANTUM")]
        mixed_prefill_quantum: usize,
        /// requests that may wait for the engine before 503 (default 64)
        #[argh(option, default = "64")]
        queue: usize,
        /// do not remember sampled DSML per tool id (always canonical)
        #[argh(switch)]
        disable_exact_dsml_tool_replay: bool,
        /// max tool ids kept in the replay memory (default 100000)
        #[argh(option, default = "100000")]
        tool_memory_max_ids: usize,
        /// model: the official FP8/FP4 rounding steps (default); plain: f32 math without them
        #[argh(option, default = "String::from(\"model\")")]
        numerics: String,
        ..BackendFlags,
        ..StreamingFlags,
        ..SpecFlags,
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
        /// load only checkpoints carrying our CRC-32 mark (not ds4's files)
        #[argh(switch)]
        kv_cache_require_checksum: bool,
        /// test hook: a job whose prompt contains this text panics
        #[argh(option, hidden_help)]
        debug_panic_on_prompt: Option<String>,
        /// test hook (--batched-session > 1): the engine steps carrying a
        /// prefill piece of a job whose prompt contains this text fail
        #[argh(option, hidden_help)]
        debug_fail_prefill_on_prompt: Option<String>,
    }
}

/// `--batched-session N` / `--parallel N`: the number of KV slots.
fn slot_count(a: &Args) -> Result<usize, String> {
    let n = match (a.batched_session, a.parallel) {
        (Some(x), Some(y)) if x != y => {
            return Err(format!(
                "--batched-session {x} and --parallel {y} disagree (they are the same flag)"
            ))
        }
        (Some(x), _) | (None, Some(x)) => x,
        (None, None) => 1,
    };
    if !(1..=256).contains(&n) {
        return Err(format!("--batched-session must be in 1..=256, got {n}"));
    }
    if a.mixed_prefill_quantum == 0 {
        return Err("--mixed-prefill-quantum must be > 0".into());
    }
    Ok(n)
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

/// The API key, when neither `--api-key` nor `--api-key-file` is given
/// (read once, in `main`; a key there stays out of the process list).
const API_KEY_ENV: &str = "DS4_API_KEY";

/// Far above any descriptor limit; keeps the semaphore's count in range.
const MAX_CONNECTIONS: usize = 1 << 20;

/// The HTTP layer's flags, resolved and checked once.
struct HttpFlags {
    api_key: Option<String>,
    /// Where the key came from, for the banner.
    key_source: &'static str,
    cors: CorsOrigins,
    limits: ServerLimits,
    body_idle: Duration,
}

/// A timeout flag: seconds, more than 0 and at most a day.
fn seconds(flag: &str, v: f64) -> Result<Duration, String> {
    if !(v.is_finite() && v > 0.0 && v <= 86400.0) {
        return Err(format!("--{flag}: expected seconds in (0, 86400], got {v}"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A key file other users may read is no better than `--api-key`: say so.
fn warn_if_shared(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(p) {
        if m.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "ds4-server: warning: {} can be read by other users (chmod 600 it)",
                p.display()
            );
        }
    }
}

fn http_flags(a: &Args, env_key: Option<String>) -> Result<HttpFlags, String> {
    let (api_key, key_source) = match (&a.api_key, &a.api_key_file) {
        (Some(_), Some(_)) => return Err("give --api-key or --api-key-file, not both".into()),
        (Some(k), None) => (Some(k.clone()), "--api-key"),
        (None, Some(p)) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("--api-key-file {}: {e}", p.display()))?;
            let key = text.lines().next().unwrap_or("").to_string();
            warn_if_shared(p);
            (Some(key), "--api-key-file")
        }
        (None, None) => (env_key.filter(|k| !k.is_empty()), API_KEY_ENV),
    };
    // Clients' keys are compared trimmed (routes), so the server's is too.
    let api_key = api_key.map(|k| k.trim().to_string());
    if api_key.as_deref().is_some_and(str::is_empty) {
        return Err(format!("the API key from {key_source} is empty"));
    }
    if a.max_connections
        .is_some_and(|n| n == 0 || n > MAX_CONNECTIONS)
    {
        return Err(format!(
            "--max-connections must be in 1..={MAX_CONNECTIONS}"
        ));
    }
    Ok(HttpFlags {
        cors: CorsOrigins::parse(&a.cors, api_key.is_some())?,
        api_key,
        key_source,
        limits: ServerLimits {
            header_read: seconds("header-timeout", a.header_timeout)?,
            keep_alive_idle: seconds("idle-timeout", a.idle_timeout)?,
            max_connections: a
                .max_connections
                .unwrap_or_else(listen::default_max_connections),
        },
        body_idle: seconds("body-timeout", a.body_timeout)?,
    })
}

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
        kv_cache_require_checksum: a.kv_cache_require_checksum,
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
    ds4::app::demo::model_path(a.model.as_deref(), a.demo)
}

/// Flag values that are wrong on their face: exit status 2 (SERVER.md §2).
fn check(a: &Args) -> Result<(), String> {
    host_addr(&a.host)?;
    kv_config(a).validate()?;
    kv_write_limit()?;
    let slots = slot_count(a)?;
    if a.spec_flags().resolve()?.on() && slots > 1 {
        // The batched step steps each slot's rows and keeps them all; a
        // verify step keeps a prefix of its rows and takes the rest back,
        // which only the single-session engine does.
        return Err(format!(
            "speculative decoding runs with one KV slot: --batched-session {slots} fills each \
             step with other slots' rows instead (use --batched-session 1, or drop \
             --spec/--mtp/--dspark)"
        ));
    }
    if a.think_level.is_some_and(|l| l > 100) {
        return Err("--think-level must be in 0..=100".into());
    }
    if a.ctx < 2 || a.tokens == 0 || a.queue == 0 || a.tool_memory_max_ids == 0 {
        return Err("--ctx must be ≥ 2; --tokens, --queue and --tool-memory-max-ids > 0".into());
    }
    Ok(())
}

/// One session (`--batched-session 1`, the serial worker) or N slots.
enum Engine {
    Serial(Session),
    Slots(Batch),
}

fn run(a: Args, hf: HttpFlags) -> Result<(), String> {
    let addr = SocketAddr::new(host_addr(&a.host)?, a.port);
    let kv_cfg = kv_config(&a);
    let kv_write_limit = kv_write_limit()?;
    let backend = a.backend_flags().resolve()?;
    let numerics = Numerics::parse(&a.numerics)
        .ok_or_else(|| format!("--numerics: expected model or plain, got {:?}", a.numerics))?;
    let mut backend_options = BackendOptions::from_env();
    backend_options.ssd_streaming = a.streaming_flags().options()?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let path = model_path(&a)?;
    let spec_choice = a.spec_flags().resolve()?;
    let any = ds4::app::spec::open_model(&path, &spec_choice)?;
    let tok =
        Arc::new(Tokenizer::from_gguf(any.file()).map_err(|e| format!("{}: {e}", path.display()))?);
    let dialect = dialect(&a, any.arch())?;
    let opts = SessionOptions {
        ctx: a.ctx,
        numerics,
        backend,
        backend_options,
        drafter: ds4::app::spec::session_drafter(&spec_choice),
        ..SessionOptions::default()
    };
    let slots = slot_count(&a)?;
    let scratch_opts = SessionOptions {
        backend: BackendKind::CpuRef,
        backend_options: BackendOptions::default(),
        drafter: ds4::session::DraftModel::None,
        ..opts.clone()
    };
    let engine = open_engine(&a, &any, opts, slots, &path, threads)?;
    let spec = ds4::app::spec::speculator(&spec_choice, &any)?;
    if let Some(s) = &spec {
        ds4::log_line!(
            "ds4-server: speculative decoding: {} drafter, drafts of up to {} tokens{}",
            s.name(),
            spec_choice.max_draft,
            if spec_choice.fixed {
                " (fixed)"
            } else {
                " (adaptive)"
            }
        );
    }
    let metrics = Arc::new(Metrics::default());
    let cache = kvdisk::open_cache(&kv_cfg, any.routed_quant_bits(), &metrics, kv_write_limit)?;
    if cache.is_some() {
        ds4::log_line!(
            "ds4-server: disk KV cache in {} ({} MiB)",
            kv_cfg
                .kv_disk_dir
                .as_deref()
                .unwrap_or(Path::new(""))
                .display(),
            kv_cfg.kv_disk_space_mb
        );
    }
    let cfg = WorkerConfig {
        queued_scripts: queued_scripts()?,
        trace: a.trace.clone(),
        default_tokens: a.tokens,
        exact_replay: !a.disable_exact_dsml_tool_replay,
        tool_memory_max_ids: a.tool_memory_max_ids,
        debug_panic_on_prompt: a.debug_panic_on_prompt.clone(),
    };
    let queue = match engine {
        Engine::Serial(sess) => {
            let hook: Box<dyn KvCacheHook> = match cache {
                Some(c) => Box::new(DiskHook::new(c)),
                None => Box::new(job::NoCache),
            };
            worker::start(sess, tok.clone(), cfg, metrics.clone(), a.queue, hook, spec)
        }
        Engine::Slots(batch) => {
            // The disk cache reads and writes through a session: one CPU
            // scratch session beside the slots (slotdisk.rs).
            let disk = match cache {
                Some(c) => Some(SlotDisk::new(
                    c,
                    Session::open_any(&any, scratch_opts).map_err(|e| e.to_string())?,
                    slots,
                )),
                None => None,
            };
            let slot_cfg = SlotConfig {
                prefill_quantum: a.mixed_prefill_quantum,
                debug_fail_prefill_on_prompt: a.debug_fail_prefill_on_prompt.clone(),
            };
            slots::start(
                batch,
                tok.clone(),
                cfg,
                slot_cfg,
                metrics.clone(),
                a.queue,
                disk,
            )
        }
    };
    let state = Arc::new(State {
        queue: queue.clone(),
        metrics,
        opts: http_options(&a, &hf, tok, dialect),
        counter: AtomicU64::new(0),
    });
    let key_source = hf.api_key.is_some().then_some(hf.key_source);
    ds4::app::serve::serve(addr, state, hf.limits, key_source)?;
    // Listener closed: queued jobs finish, then the cache may save.
    ds4::log_line!("ds4-server: shutting down");
    queue.shutdown();
    Ok(())
}

/// The chat dialect of the model's family; `--think-level` is V4.1's.
fn dialect(a: &Args, arch: Arch) -> Result<Dialect, String> {
    match arch {
        Arch::V4 if a.think_level.is_some() => {
            Err("--think-level is for V4.1 models; a V4 request picks its thinking mode with its own fields".into())
        }
        Arch::V4 => Ok(Dialect::V4),
        Arch::V41 => Ok(Dialect::V41 {
            default_level: a.think_level.unwrap_or(ds4::chat::v41::DEFAULT_LEVEL),
        }),
    }
}

/// The session, or the `slots` KV slots of a batch, with the load line.
fn open_engine(
    a: &Args,
    any: &AnyModel,
    opts: SessionOptions,
    slots: usize,
    path: &Path,
    threads: usize,
) -> Result<Engine, String> {
    if slots > 1 {
        let batch = Batch::open_any(any, opts, slots).map_err(|e| e.to_string())?;
        let per = batch.slot_state_bytes() as u64;
        ds4::log_line!(
            "ds4-server: {} loaded; {slots} KV slots × {} = {} for {} tokens each; prefill quantum {}; {threads} CPU threads",
            path.display(),
            ds4::app::report::human(per),
            ds4::app::report::human(per * slots as u64),
            a.ctx,
            a.mixed_prefill_quantum
        );
        return Ok(Engine::Slots(batch));
    }
    let sess = Session::open_any(any, opts).map_err(|e| e.to_string())?;
    if let Some(line) = sess.expert_cache().and_then(|c| c.startup_line()) {
        ds4::log_line!("ds4-server: {line}");
    }
    ds4::log_line!(
        "ds4-server: {} loaded; context buffers {} for {} tokens; {threads} CPU threads",
        path.display(),
        ds4::app::report::human(sess.state_bytes() as u64),
        a.ctx
    );
    Ok(Engine::Serial(sess))
}

/// What the HTTP handlers check and render with.
fn http_options(a: &Args, hf: &HttpFlags, tok: Arc<Tokenizer>, dialect: Dialect) -> HttpOptions {
    let longest_token = (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.token_bytes(id).map(<[u8]>::len))
        .max()
        .unwrap_or(1);
    HttpOptions {
        ctx: a.ctx,
        default_tokens: a.tokens,
        cors: hf.cors.clone(),
        api_key: hf.api_key.clone(),
        max_body_bytes: a.max_body_bytes,
        body_idle: hf.body_idle,
        max_prompt_bytes: routes::prompt_byte_bound(a.ctx, longest_token),
        allow_script: std::env::var_os(SCRIPT_ENV).is_some(),
        tokenizer: Some(ds4::server::tokenize::SharedTokenizer(tok)),
        dialect,
    }
}

fn main() -> ExitCode {
    match ds4::app::cli::parse_args::<Args>("ds4-server") {
        Ok(a) => {
            // After parsing (which restores SIGPIPE's default for --help
            // piped into a pager): a server outlives its log readers.
            ds4::app::cli::ignore_closed_pipes();
            let hf = match check(&a).and_then(|()| http_flags(&a, std::env::var(API_KEY_ENV).ok()))
            {
                Ok(hf) => hf,
                Err(e) => {
                    ds4::log_line!("ds4-server: {e}");
                    return ExitCode::from(2);
                }
            };
            let lock_file = std::env::var_os("DS4_LOCK_FILE").map(PathBuf::from);
            let _lock = match ds4::app::lock::take_lock(lock_file) {
                Ok(f) => f,
                Err(e) => {
                    ds4::log_line!("ds4-server: {e}");
                    return ExitCode::from(2);
                }
            };
            ds4::app::cli::exit_with("ds4-server", run(a, hf))
        }
        Err(code) => code,
    }
}
