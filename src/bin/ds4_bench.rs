//! `ds4-bench`: prefill and generation speed at increasing context frontiers
//! with one model load (CLI.md §2). Writes CSV.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use argh::FromArgs;
use ds4::backend::options::{CacheBudget, EvictionPolicy, ProfileFile, StreamingOptions};
use ds4::backend::BackendOptions;
use ds4::kvcache::{CacheKey, DiskCache, KvCacheConfig, LookupOutcome, SaveReason, StoreOutcome};
use ds4::model::v41::engram_reader::{drop_table_pages, EngramStats};
use ds4::model::ModelFile;
use ds4::model::{AnyModel, Arch};
use ds4::session::{Batch, Session, SessionOptions, SlotWork};
use ds4::tokenizer::Tokenizer;

ds4::cli_args! {
    /// Measure prefill and generation speed at context frontiers ctx-start,
    /// ctx-start+step, … ctx-max. Per frontier: prefill the new tokens (timed),
    /// generate gen-tokens greedily (timed), restore the frontier. With
    /// --kv-restore-dir also: store the frontier as a disk KV checkpoint and
    /// load it back through the server's lookup (timed, restore vs prefill).
    #[derive(FromArgs)]
    struct Args {
        /// raw text, tokenized as plain text (no BOS, no template)
        #[argh(option)]
        prompt_file: Option<PathBuf>,
        /// text rendered as one non-thinking chat turn
        #[argh(option)]
        chat_prompt_file: Option<PathBuf>,
        /// system text for --chat-prompt-file (also -sys)
        #[argh(option, default = "String::from(\"You are a helpful assistant.\")")]
        system: String,
        /// model GGUF (default ./ds4flash.gguf)
        #[argh(option, short = 'm', default = "PathBuf::from(\"ds4flash.gguf\")")]
        model: PathBuf,
        ..BackendFlags,
        ..StreamingFlags,
        ..Threads,
        /// first frontier (default 2048)
        #[argh(option, default = "2048")]
        ctx_start: usize,
        /// last frontier (default 32768)
        #[argh(option, default = "32768")]
        ctx_max: usize,
        /// session context (default ctx-max + gen-tokens + 1)
        #[argh(option)]
        ctx_alloc: Option<usize>,
        /// linear step between frontiers (default 2048)
        #[argh(option, default = "2048")]
        step_incr: usize,
        /// multiplicative step (default 1 = linear)
        #[argh(option, default = "1.0")]
        step_mul: f64,
        /// greedy tokens per frontier (default 128)
        #[argh(option, short = 'n', default = "128")]
        gen_tokens: usize,
        /// CSV destination (default stdout; with --bandwidth: only when given)
        #[argh(option)]
        csv: Option<PathBuf>,
        /// instead of a model run: host and device bandwidth (wgpu, or CUDA
        /// with --backend cuda), then each matvec kernel at the Flash shapes
        /// as GB/s and fraction of device read
        #[argh(switch)]
        bandwidth: bool,
        /// with --bandwidth: probe buffer size in MiB (default 256)
        #[argh(option, default = "256")]
        bw_mib: u64,
        /// with --bandwidth: timed trials per line, best kept (default 3)
        #[argh(option, default = "3")]
        bw_trials: usize,
        /// with --bandwidth: matvec kernel variants to compare, weight rows per
        /// workgroup, comma-separated (default: the backend's choice, 4 on
        /// GPUs, 16 on CPU emulation)
        #[argh(option)]
        bw_rows: Option<String>,
        /// with --bandwidth: also time whole decode steps of the model given
        /// with -m on the device (e.g. the 4-layer Flash-width bench model
        /// of bench/cpu_forward.rs), as active weight bytes ÷ time ÷ device read;
        /// on CUDA with the CUDA graph on and off
        #[argh(switch)]
        bw_decode: bool,
        /// with --bandwidth: at most this many output rows per matvec shape
        /// (quick checks on emulators; default: the full Flash shapes)
        #[argh(option)]
        bw_max_out: Option<u64>,
        /// with --bandwidth (wgpu): kernel variants to compare in one run, as
        /// DS4_WGPU_FEATURES values separated by `/` (default
        /// `all/f16,timestamps` when the adapter has subgroups: subgroup kernels,
        /// then the workgroup-memory fallback; else `all`)
        #[argh(option)]
        bw_features: Option<String>,
        /// with --bandwidth: only the matvec shapes whose name or type contains
        /// one of these comma-separated words (`none`: no matvec lines)
        #[argh(option)]
        bw_shapes: Option<String>,
        /// with --bw-decode: decode steps timed, best kept (default 8)
        #[argh(option, default = "8")]
        bw_decode_steps: usize,
        /// with --ssd-streaming and a budget list such as 10%,25%,50%,100%
        /// (percent of the routed-expert bytes): prompt tokens before the
        /// decode runs (default 16; synthetic ids, no prompt file needed)
        #[argh(option, default = "16")]
        ssd_prompt: usize,
        /// with a --ssd-streaming budget list: timed blocks of -n tokens per
        /// line, the fastest kept (this machine is shared; default 3)
        #[argh(option, default = "3")]
        ssd_repeat: usize,
        /// with --ssd-streaming: eviction policy, lru or lfu (default lru)
        #[argh(option, default = "String::from(\"lru\")")]
        ssd_policy: String,
        /// with --ssd-streaming: threads reading expert slices (default 8)
        #[argh(option, default = "8")]
        ssd_read_threads: usize,
        /// with --ssd-streaming: no read-ahead of the hash layers' experts
        #[argh(switch)]
        ssd_no_prefetch: bool,
        /// with a --ssd-streaming budget list: after the sweep, record a
        /// popularity profile at this budget (a percentage of the routed
        /// bytes), then time the first -n tokens of fresh preloaded sessions
        /// with and without it
        #[argh(option)]
        ssd_profile_check: Option<f64>,
        /// instead of context frontiers: serve this many sessions at once,
        /// comma-separated counts (e.g. 1,2,4,8,16): all arrive together with
        /// prompts of --session-prompt tokens, prefill in pieces of
        /// --mixed-prefill-quantum interleaved with the others' decode rows, then
        /// decode -n tokens each; prints aggregate and per-session decode
        /// tokens/s, time to first token and the modelled bytes read per step
        #[argh(option)]
        sessions: Option<String>,
        /// with --sessions: prompt tokens per session (default 64; taken from
        /// --prompt-file when given, else pseudo-random ids)
        #[argh(option, default = "64")]
        session_prompt: usize,
        /// with --sessions: prefill piece per session per step (default 128)
        #[argh(option, default = "128")]
        mixed_prefill_quantum: usize,
        /// restore-vs-prefill: per frontier, store a checkpoint in this folder
        /// and load it back with the server's disk-cache code (files removed after)
        #[argh(option)]
        kv_restore_dir: Option<PathBuf>,
        /// also measure the backend's read bandwidth and add weight bytes per
        /// token and decode as a percentage of the read roofline to each row
        /// (always on for DeepSeek V4.1 files)
        #[argh(switch)]
        roofline: bool,
        /// fault every resident weight page in before the first frontier (not
        /// V4.1's Engram tables), so the first prefill does not pay the page-in
        #[argh(switch)]
        warm_weights: bool,
        /// V4.1 files: the Engram hot-row cache in rows (default 65536)
        #[argh(option)]
        engram_cache_rows: Option<usize>,
        /// V4.1 files: drop the Engram tables' pages from the OS page cache
        /// before each timed prefill and decode, so rows the hot-row cache misses
        /// come from the disk (as at real size, where the tables dwarf RAM)
        #[argh(switch)]
        engram_cold: bool,
    }
}

impl Args {
    /// The streaming options these flags give, with the benchmark's
    /// policy and read-ahead threads.
    fn streaming_options(&self) -> Result<Option<StreamingOptions>, String> {
        let mut flags = self.streaming_flags();
        if self.budget_sweep().is_some() {
            // The list is the sweep's; each run sets its own budget.
            flags.cache_experts = None;
        }
        let Some(mut o) = flags.options()? else {
            return Ok(None);
        };
        o.policy =
            EvictionPolicy::parse(&self.ssd_policy).map_err(|e| format!("--ssd-policy: {e}"))?;
        o.read_threads = self.ssd_read_threads.max(1);
        o.prefetch = !self.ssd_no_prefetch;
        // The sweep's sessions neither read nor write a profile (each
        // would change the next one's preload); --ssd-profile-check
        // measures it on its own.
        o.profile = ProfileFile::Off;
        Ok(Some(o))
    }

    /// A budget sweep: `--ssd-streaming-cache-experts` as a comma list or
    /// with percentages.
    fn budget_sweep(&self) -> Option<&str> {
        let v = self.ssd_streaming_cache_experts.as_deref()?;
        (self.ssd_streaming && (v.contains('%') || v.contains(','))).then_some(v)
    }
}

/// `--bandwidth`: the table on stdout, the CSV to `--csv` when given. The
/// device is the wgpu adapter, or the CUDA device with `--backend cuda`.
fn run_bandwidth(a: &Args, bo: &BackendOptions) -> Result<(), String> {
    if a.bw_mib == 0 || a.bw_trials == 0 {
        return Err("--bw-mib and --bw-trials must be positive".into());
    }
    if a.bw_max_out == Some(0) {
        return Err("--bw-max-out must be positive".into());
    }
    let backend = a.backend_flags().resolve()?;
    let csv = if backend == ds4::backend::BackendKind::Cuda {
        bandwidth_cuda(a, bo)?
    } else {
        bandwidth_wgpu(a, bo)?
    };
    if let Some(p) = &a.csv {
        std::fs::write(p, csv.join("\n") + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// The Flash matvec shapes picked by `--bw-shapes`, with at most
/// `--bw-max-out` output rows each.
fn bandwidth_shapes(a: &Args) -> Vec<(&'static str, ds4::quant::GgmlType, u64, u64)> {
    let words: Option<Vec<String>> = a
        .bw_shapes
        .as_ref()
        .map(|list| list.split(',').map(|w| w.trim().to_lowercase()).collect());
    ds4::backend::bandwidth::FLASH_MATVECS
        .iter()
        .filter(|(name, ty, _, _)| match &words {
            None => true,
            Some(words) => {
                let (name, ty) = (name.to_lowercase(), ty.name().to_lowercase());
                words
                    .iter()
                    .any(|w| !w.is_empty() && (name.contains(w.as_str()) || ty == *w))
            }
        })
        .map(|&(name, ty, n_in, n_out)| {
            (name, ty, n_in, a.bw_max_out.map_or(n_out, |m| n_out.min(m)))
        })
        .collect()
}

fn bandwidth_wgpu(a: &Args, bo: &BackendOptions) -> Result<Vec<String>, String> {
    use ds4::backend::wgpu::{bandwidth, gpu, AdapterChoice, Gpu};
    // An explicit benchmark: CPU emulators (lavapipe) are allowed.
    let choice = AdapterChoice::new(bo, true);
    let first = Gpu::open_with(&choice, gpu::OPTIONAL_FEATURES).map_err(|e| e.to_string())?;
    let sets: Vec<String> = match &a.bw_features {
        Some(list) => list.split('/').map(|x| x.trim().to_string()).collect(),
        // Only subgroups differ between the two devices (timestamps kept, so
        // both variants are timed the same way).
        None if first.shader_variant().subgroups => vec!["all".into(), "f16,timestamps".into()],
        None => vec!["all".into()],
    };
    let mut gpus = Vec::new();
    for set in &sets {
        let allow = gpu::parse_features(set).map_err(|e| format!("--bw-features: {e}"))?;
        gpus.push((
            set.clone(),
            Gpu::open_with(&choice, allow).map_err(|e| e.to_string())?,
        ));
    }
    drop(first);
    let rows = match &a.bw_rows {
        Some(list) => list
            .split(',')
            .map(|r| {
                r.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("--bw-rows: {r:?} is not a number"))
            })
            .collect::<Result<Vec<u32>, String>>()?,
        None => vec![],
    };
    let refs: Vec<&Gpu> = gpus.iter().map(|(_, g)| g).collect();
    let device = refs[0].describe();
    let shapes = bandwidth_shapes(a);
    let mut read = None;
    let mut csv =
        ds4::backend::bandwidth::print_report(&device, a.bw_mib << 20, a.bw_trials, |each| {
            bandwidth::run(
                &refs,
                a.bw_mib << 20,
                a.bw_trials,
                &shapes,
                &rows,
                &mut |m| {
                    if m.kind == "device read" && read.is_none() {
                        read = Some(m.gb_per_s());
                    }
                    each(m)
                },
            )
            .map(|_| ())
        })
        .map_err(|e| e.to_string())?;
    if a.bw_decode {
        let model = open_model(a)?;
        for (set, g) in &gpus {
            // The session opens its own device with these features.
            let bo = BackendOptions {
                wgpu_features: Some(set.clone()),
                ..bo.clone()
            };
            let m = decode_step(
                a,
                &model,
                ds4::backend::BackendKind::Wgpu,
                &bo,
                "",
                g.shader_variant().name(),
            )?;
            println!("{}", ds4::backend::bandwidth::table_row(&m, read));
            csv.push(ds4::backend::bandwidth::csv_row(&g.describe(), &m, read));
        }
    }
    Ok(csv)
}

#[cfg(feature = "cuda")]
fn bandwidth_cuda(a: &Args, bo: &BackendOptions) -> Result<Vec<String>, String> {
    use ds4::backend::cuda::bandwidth::{self, Bench};
    let bench = Bench::open(bo).map_err(|e| e.to_string())?;
    let device = bench.describe();
    let shapes = bandwidth_shapes(a);
    let mut read = None;
    let mut csv =
        ds4::backend::bandwidth::print_report(&device, a.bw_mib << 20, a.bw_trials, |each| {
            bandwidth::run(&bench, a.bw_mib << 20, a.bw_trials, &shapes, &mut |m| {
                if m.kind == "device read" {
                    read = Some(m.gb_per_s());
                }
                each(m)
            })
        })
        .map_err(|e| e.to_string())?;
    // The decode sessions open the device themselves.
    drop(bench);
    if a.bw_decode {
        let model = open_model(a)?;
        // The CUDA graph on (the default) and off: the difference is the
        // launch overhead the graph removes.
        for (cuda_graph, label) in [(true, "graph on"), (false, "graph off")] {
            let bo = BackendOptions {
                cuda_graph,
                ..bo.clone()
            };
            let m = decode_step(a, &model, ds4::backend::BackendKind::Cuda, &bo, label, "")?;
            println!("{}", ds4::backend::bandwidth::table_row(&m, read));
            csv.push(ds4::backend::bandwidth::csv_row(&device, &m, read));
        }
    }
    Ok(csv)
}

#[cfg(not(feature = "cuda"))]
fn bandwidth_cuda(_a: &Args, _bo: &BackendOptions) -> Result<Vec<String>, String> {
    Err("backend cuda is not available: this ds4-bench was built without CUDA support (cargo build --features cuda)".into())
}

fn open_model(a: &Args) -> Result<Arc<ModelFile>, String> {
    Ok(Arc::new(
        ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?,
    ))
}

/// One whole decode step of `-m` on `backend`: the best of
/// `--bw-decode-steps` steps after an 8-token prefill, with the model's active
/// weight bytes per token as the bytes moved (KV reads at this short
/// context are negligible). `label` is added to the shape column, `kernels`
/// names the kernel variant.
fn decode_step(
    a: &Args,
    model: &Arc<ModelFile>,
    backend: ds4::backend::BackendKind,
    bo: &BackendOptions,
    label: &str,
    kernels: &str,
) -> Result<ds4::backend::bandwidth::Measure, String> {
    let active = model.weights.active_bytes_per_token(&model.config);
    let steps = a.bw_decode_steps.max(1);
    let opts = SessionOptions {
        ctx: 64 + steps,
        backend,
        backend_options: bo.clone(),
        ..Default::default()
    };
    let mut sess = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
    let vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..8u32).map(|i| (1000 + 97 * i) % vocab).collect();
    sess.sync(&prompt, &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let mut best = f64::INFINITY;
    for i in 0..steps {
        let t = Instant::now();
        sess.eval((2000 + 31 * i as u32) % vocab)
            .map_err(|e| e.to_string())?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let file = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(ds4::backend::bandwidth::Measure {
        kind: "decode step".into(),
        name: if label.is_empty() {
            file
        } else {
            format!("{file} {label}")
        },
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes: active,
        seconds: best,
        timer: "wall",
        rows: 0,
        kernels: kernels.into(),
    })
}

/// The server's disk cache (`DiskCache::store` / `lookup`), set so that
/// every frontier is stored whole and nothing is evicted or consumed.
fn restore_cache(dir: &std::path::Path, routed_bits: u8) -> Result<DiskCache, String> {
    let cfg = KvCacheConfig {
        kv_disk_dir: Some(dir.to_path_buf()),
        kv_disk_space_mb: 1 << 30,
        kv_cache_min_tokens: 1,
        kv_cache_cold_max_tokens: 0,
        ..KvCacheConfig::default()
    };
    DiskCache::open(&cfg, routed_bits)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no cache folder".to_string())
}

/// Stores the session (at a frontier) and loads it back into the same
/// session; returns (store s, restore s, file bytes). The logits after the
/// load must be the ones before it.
fn store_and_restore(
    cache: &DiskCache,
    sess: &mut Session,
    text: &[u8],
) -> Result<(f64, f64, u64), String> {
    let before = sess.logits().to_vec();
    let t = Instant::now();
    let (sha, bytes) = match cache.store(sess, text, CacheKey::Tokens, SaveReason::Unknown, &[]) {
        StoreOutcome::Stored { sha, bytes } => (sha, bytes),
        other => return Err(format!("kv store: {other:?}")),
    };
    let store_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let hit = match cache.lookup(sess, text) {
        LookupOutcome::Hit(h) => h,
        other => return Err(format!("kv restore: {other:?}")),
    };
    let restore_s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(cache.dir().join(format!("{sha}.kv")));
    if hit.tokens != sess.tokens().len() || sess.logits() != &before[..] {
        return Err("kv restore: the loaded state differs from the stored one".into());
    }
    Ok((store_s, restore_s, bytes))
}

/// The family of `path` from its header, `None` when it cannot be read
/// (the open that follows reports why).
fn peek_arch(path: &std::path::Path) -> Option<Arch> {
    let f = ds4::gguf::GgufFile::open(path).ok()?;
    Arch::of(&f).ok()
}

/// Options that do not apply to the file's family, refused before any work.
fn check_family(a: &Args, arch: Option<Arch>) -> Result<(), String> {
    let v41 = arch == Some(Arch::V41);
    if !v41 && (a.engram_cache_rows.is_some() || a.engram_cold) {
        return Err(
            "--engram-cache-rows and --engram-cold apply to DeepSeek V4.1 files only".into(),
        );
    }
    if !v41 {
        return Ok(());
    }
    let what = if a.sessions.is_some() {
        Some("--sessions (batched sessions run DeepSeek V4 only)")
    } else if a.streaming_flags().named() || a.ssd_profile_check.is_some() {
        Some("--ssd-streaming (routed-expert streaming is wired for DeepSeek V4 only)")
    } else if a.bandwidth && a.bw_decode {
        Some("--bw-decode (whole decode steps are timed for DeepSeek V4 only)")
    } else {
        None
    };
    match what {
        Some(w) => Err(format!(
            "{w}: {} is a DeepSeek V4.1 file (general.architecture deepseek41); V4.1 runs the frontier benchmark (--prompt-file/--chat-prompt-file, --ctx-*, -n, --backend, --kv-restore-dir, --engram-cache-rows, --engram-cold)",
            a.model.display()
        )),
        None if a.engram_cache_rows == Some(0) => {
            Err("--engram-cache-rows must be positive".into())
        }
        None => Ok(()),
    }
}

/// Weight bytes one decoded token reads, from the model's own accounting
/// (routed experts at top-k of n; never V4.1's Engram tables).
fn weight_bytes_per_token(m: &AnyModel) -> u64 {
    match m {
        AnyModel::V4(m) => m.weights.active_bytes_per_token(&m.config),
        AnyModel::V41(m) => m.weights.active_bytes_per_token(&m.config),
    }
}

/// What the Engram reader did between two readings: (bytes read per
/// token, hot-row hit rate in %).
fn engram_delta(before: Option<EngramStats>, after: Option<EngramStats>) -> (f64, f64) {
    match (before, after) {
        (Some(b), Some(a)) => {
            let tokens = a.tokens - b.tokens;
            let asked = a.rows_requested - b.rows_requested;
            (
                (a.bytes_read - b.bytes_read) as f64 / tokens.max(1) as f64,
                100.0 * (a.cache_hits - b.cache_hits) as f64 / asked.max(1) as f64,
            )
        }
        _ => (0.0, 0.0),
    }
}

fn run(a: Args) -> Result<(), String> {
    let mut bo = BackendOptions::from_env();
    check_family(&a, peek_arch(&a.model))?;
    if a.bandwidth {
        return run_bandwidth(&a, &bo);
    }
    if let Some(list) = a.budget_sweep() {
        return run_budget_sweep(&a, list, bo);
    }
    bo.ssd_streaming = a.streaming_options()?;
    let backend = a.backend_flags().resolve()?;
    if let Some(list) = &a.sessions {
        return run_sessions(&a, list, backend, bo);
    }
    if a.ctx_start == 0 || a.ctx_start > a.ctx_max {
        return Err("--ctx-start must be in 1..=ctx-max".into());
    }
    if a.step_mul < 1.0 || a.step_incr == 0 {
        return Err("--step-mul must be ≥ 1 and --step-incr > 0".into());
    }
    let ctx = a.ctx_alloc.unwrap_or(a.ctx_max + a.gen_tokens + 1);
    if ctx <= a.ctx_max + a.gen_tokens {
        return Err(format!(
            "--ctx-alloc must exceed ctx-max + gen-tokens ({})",
            a.ctx_max + a.gen_tokens
        ));
    }
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = AnyModel::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let v41 = model.arch() == Arch::V41;
    if a.warm_weights {
        let t = Instant::now();
        match &model {
            AnyModel::V4(m) => m.warm(&mut |_, _| {}),
            AnyModel::V41(m) => m.warm(),
        }
        eprintln!(
            "ds4-bench: weights warmed in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let tok =
        Tokenizer::from_gguf(model.file()).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let read = |p: &PathBuf| -> Result<String, String> {
        String::from_utf8(std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
            .map_err(|_| format!("{}: not UTF-8", p.display()))
    };
    let tokens: Vec<u32> = match (&a.prompt_file, &a.chat_prompt_file) {
        (Some(p), None) => tok.encode_plain(&read(p)?),
        // One non-thinking turn in the file's own template.
        (None, Some(p)) if v41 => ds4::chat::v41::one_shot_prompt(&tok, &a.system, &read(p)?, 0),
        (None, Some(p)) => {
            let mut t = ds4::chat::transcript_start(&tok, &a.system, ds4::chat::ThinkMode::None);
            t.extend(ds4::chat::user_turn(
                &tok,
                &read(p)?,
                ds4::chat::ThinkMode::None,
            ));
            t
        }
        _ => return Err("give exactly one of --prompt-file and --chat-prompt-file".into()),
    };
    if tokens.len() < a.ctx_max {
        return Err(format!(
            "the prompt has {} tokens, fewer than --ctx-max {}",
            tokens.len(),
            a.ctx_max
        ));
    }
    let opts = SessionOptions {
        ctx,
        backend,
        backend_options: bo.clone(),
        ..Default::default()
    };
    let mut sess = match &model {
        AnyModel::V41(m) => Session::new_v41(
            m.clone(),
            opts,
            a.engram_cache_rows
                .unwrap_or(ds4::session::DEFAULT_ENGRAM_CACHE_ROWS),
        ),
        m => Session::open_any(m, opts),
    }
    .map_err(|e| e.to_string())?;
    let streaming = sess.expert_cache();
    if let Some(line) = streaming.as_ref().and_then(|c| c.startup_line()) {
        eprintln!("ds4-bench: {line}");
    }
    eprintln!(
        "ds4-bench: {}; context buffers {:.1} MiB for {ctx} tokens; {threads} CPU threads",
        sess.backend_notice(),
        sess.state_bytes() as f64 / (1u64 << 20) as f64
    );
    let weights = weight_bytes_per_token(&model);
    // The roofline columns: on request for V4, always for V4.1 (whose
    // per-token bytes are the point of running it).
    let roofline = a.roofline || v41;
    let bandwidth = if roofline {
        let (device, bw) = ds4::app::report::read_bandwidth_for(sess_backend(&sess, backend), &bo)?;
        eprintln!(
            "ds4-bench: read bandwidth {:.2} GB/s ({device}); weights read per decoded token {} (the model's accounting: routed experts at {} of {})",
            bw / 1e9,
            ds4::app::report::human(weights),
            experts_used(&model),
            experts(&model),
        );
        bw
    } else {
        0.0
    };
    if let AnyModel::V41(m) = &model {
        let eg = &m.config.engram;
        eprintln!(
            "ds4-bench: DeepSeek V4.1: Engram tables {} on disk at layers {:?} (never mapped), rows of {} bytes read per step, at most {} bytes per token; hot-row cache {} rows{}",
            ds4::app::report::human(m.weights.engram_table_bytes()),
            eg.layer_ids,
            eg.row_bytes(),
            ds4::app::report::v41_engram_cold_bytes(&m.config),
            a.engram_cache_rows
                .unwrap_or(ds4::session::DEFAULT_ENGRAM_CACHE_ROWS),
            if a.engram_cold {
                "; table pages dropped from the page cache before each timed phase"
            } else {
                ""
            }
        );
    }
    let mut out: Box<dyn Write> = match &a.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    };
    let cache = match &a.kv_restore_dir {
        Some(d) => Some(restore_cache(d, sess.routed_quant_bits())?),
        None => None,
    };
    let mut extra = String::new();
    if cache.is_some() {
        extra += ",prefill_total_s,kv_store_s,kv_restore_s,kv_file_bytes";
    }
    if roofline {
        extra += ",weight_bytes_per_token";
        if v41 {
            extra += ",prefill_engram_bytes_per_token,prefill_engram_hit_pct,gen_engram_bytes_per_token,gen_engram_hit_pct";
        }
        extra += ",read_gbps,gen_roofline_pct";
    }
    writeln!(
        out,
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes{extra}"
    )
    .map_err(|e| e.to_string())?;
    let cold = |m: &AnyModel| -> Result<(), String> {
        match m {
            AnyModel::V41(m) if a.engram_cold => {
                drop_table_pages(m).map_err(|e| format!("{}: {e}", a.model.display()))
            }
            _ => Ok(()),
        }
    };
    let mut prefill_total_s = 0.0;
    let eos = tok.specials().eos as usize;
    let (mut f, mut prev) = (a.ctx_start, 0usize);
    loop {
        cold(&model)?;
        let e0 = sess.engram_stats();
        let t = Instant::now();
        sess.sync(&tokens[..f], &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let prefill_s = t.elapsed().as_secs_f64();
        let e1 = sess.engram_stats();
        prefill_total_s += prefill_s;
        let restore = match &cache {
            Some(c) => {
                let (st, rs, b) = store_and_restore(c, &mut sess, &tok.decode(&tokens[..f]))?;
                format!(",{prefill_total_s:.4},{st:.4},{rs:.4},{b}")
            }
            None => String::new(),
        };
        let snap = sess.save_snapshot().map_err(|e| e.to_string())?;
        cold(&model)?;
        let e2 = sess.engram_stats();
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            let logits = sess.logits();
            let next = (0..logits.len()).filter(|&i| i != eos).fold(0, |b, i| {
                if logits[i] > logits[b] || b == eos {
                    i
                } else {
                    b
                }
            });
            sess.eval(next as u32).map_err(|e| e.to_string())?;
        }
        let gen_s = t.elapsed().as_secs_f64();
        let e3 = sess.engram_stats();
        sess.load_snapshot(&snap).map_err(|e| e.to_string())?;
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let gen_tps = rate(a.gen_tokens, gen_s);
        let mut bytes = String::new();
        if roofline {
            let (pb, ph) = engram_delta(e0, e1);
            let (gb, gh) = engram_delta(e2, e3);
            bytes += &format!(",{weights}");
            if v41 {
                bytes += &format!(",{pb:.0},{ph:.1},{gb:.0},{gh:.1}");
            }
            // Weights from memory plus the Engram rows read from the file,
            // per decoded token, against the measured read bandwidth.
            let per_token = weights as f64 + gb;
            bytes += &format!(
                ",{:.2},{:.1}",
                bandwidth / 1e9,
                100.0 * per_token * gen_tps / bandwidth.max(1.0)
            );
        }
        writeln!(
            out,
            "{},{},{:.2},{},{:.2},{}{}{}",
            f,
            f - prev,
            rate(f - prev, prefill_s),
            a.gen_tokens,
            gen_tps,
            snap.len(),
            restore,
            bytes
        )
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())?;
        if f >= a.ctx_max {
            break;
        }
        prev = f;
        f = if a.step_mul == 1.0 {
            f + a.step_incr
        } else {
            ((f as f64 * a.step_mul).ceil() as usize).max(f + 1)
        };
        f = f.min(a.ctx_max);
    }
    if let Some(c) = streaming {
        eprintln!("ds4-bench: {}", c.stats().line());
    }
    if let Some(st) = sess.engram_stats() {
        eprintln!("ds4-bench: {}", ds4::app::report::engram_line(&st));
    }
    Ok(())
}

/// The backend whose memory the roofline measures: `auto` as resolved.
fn sess_backend(sess: &Session, asked: ds4::backend::BackendKind) -> ds4::backend::BackendKind {
    use ds4::backend::BackendKind;
    match (asked, sess.backend_name()) {
        (BackendKind::Auto, "wgpu") => BackendKind::Wgpu,
        (BackendKind::Auto, "cuda") => BackendKind::Cuda,
        (BackendKind::Auto, _) => BackendKind::Cpu,
        (k, _) => k,
    }
}

fn experts(m: &AnyModel) -> usize {
    match m {
        AnyModel::V4(m) => m.config.n_expert,
        AnyModel::V41(m) => m.config.n_expert,
    }
}

fn experts_used(m: &AnyModel) -> usize {
    match m {
        AnyModel::V4(m) => m.config.n_expert_used,
        AnyModel::V41(m) => m.config.n_expert_used,
    }
}

/// Greedy decode of `n` tokens; seconds taken.
fn decode(sess: &mut Session, n: usize) -> Result<f64, String> {
    let t = Instant::now();
    for _ in 0..n {
        let next = ds4::sampler::argmax(sess.logits()) as u32;
        sess.eval(next).map_err(|e| e.to_string())?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// `--ssd-streaming --ssd-streaming-cache-experts 10%,25%,50%,100%`: decode
/// speed, disk bytes per token and hit rate per budget, cold (empty cache)
/// then warm (the cache the cold run left), beside the fully resident
/// speed and the disk's measured bandwidth and the roofline it implies.
fn run_budget_sweep(a: &Args, list: &str, bo: BackendOptions) -> Result<(), String> {
    let backend = a.backend_flags().resolve()?;
    let base = a
        .streaming_options()?
        .ok_or("--ssd-streaming-cache-experts needs --ssd-streaming")?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model =
        Arc::new(ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?);
    let cfg = &model.config;
    let routed: u64 = model
        .weights
        .layers
        .iter()
        .map(|l| l.ffn_gate_exps.n_bytes + l.ffn_up_exps.n_bytes + l.ffn_down_exps.n_bytes)
        .sum();
    let n_gen = a.gen_tokens;
    let prompt: Vec<u32> = (0..a.ssd_prompt.max(1) as u32)
        .map(|i| (i * 7919) % (cfg.n_vocab as u32 - 10).min(120_000) + 10)
        .collect();
    let repeat = a.ssd_repeat.max(1);
    let ctx = prompt.len() + (repeat + 1) * n_gen + 8;

    eprintln!(
        "ds4-bench: measuring the disk under {} ...",
        a.model.display()
    );
    let disk = ds4::backend::experts::read::probe_disk(&a.model, 2 << 30, 2.0, 8)
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
    println!(
        "# disk: sequential {:.0} MB/s (8 MiB reads), random 4 KiB {:.0} MB/s = {:.0} IOPS ({} readers), {} reads",
        disk.sequential / 1e6,
        disk.random_4k / 1e6,
        disk.random_4k / 4096.0,
        disk.threads,
        if disk.direct { "direct" } else { "buffered (page cache counts)" }
    );
    println!(
        "# model: {} layers, {:.2} GiB routed of {:.2} GiB; {threads} CPU threads; {} prompt tokens, {n_gen} decoded; policy {}, {} reader threads, read-ahead {}",
        cfg.n_layer,
        routed as f64 / (1u64 << 30) as f64,
        model.file.file_len() as f64 / (1u64 << 30) as f64,
        prompt.len(),
        base.policy.name(),
        base.read_threads,
        if base.prefetch { "on" } else { "off" },
    );

    // Fully resident: the weights faulted in first, as --warm-weights does.
    model.warm(&mut |_, _| {});
    let session = |bo: BackendOptions| {
        Session::new(
            model.clone(),
            SessionOptions {
                ctx,
                backend,
                backend_options: bo,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())
    };
    let mut sess = session(BackendOptions {
        ssd_streaming: None,
        ..bo.clone()
    })?;
    sess.sync(&prompt, &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    // The fastest of `repeat` blocks of n tokens.
    let mut best = f64::INFINITY;
    for _ in 0..repeat {
        best = best.min(decode(&mut sess, n_gen)?);
    }
    drop(sess);
    let resident_tps = n_gen as f64 / best;
    println!("# resident: {resident_tps:.3} tokens/s (fastest of {repeat} blocks of {n_gen})");
    println!(
        "budget,slots,cache,decode_tps,of_resident_pct,read_mib_per_token,hit_pct,cache_hit_pct,prefetch_used_pct,predictor_pct,read_wait_ms_per_token,disk_roofline_tps,serial_bound_tps,of_bound_pct"
    );
    for item in list.split(',') {
        let item = item.trim();
        let budget = match item.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.trim().parse().map_err(|_| {
                    format!("--ssd-streaming-cache-experts: bad percentage {item:?}")
                })?;
                CacheBudget::Bytes((routed as f64 * p / 100.0).ceil() as u64)
            }
            None => CacheBudget::parse(item)?,
        };
        // Cold: an empty cache (reads are direct, so the page cache holds
        // nothing either), the n tokens after the prompt. Warm: the cache
        // preloaded as without --ssd-streaming-cold, then n tokens of
        // warm-up, then the n measured.
        for mode in ["cold", "warm"] {
            let o = StreamingOptions {
                budget,
                cold: mode == "cold",
                ..base.clone()
            };
            let mut sess = session(BackendOptions {
                ssd_streaming: Some(o),
                ..bo.clone()
            })?;
            let cache = sess.expert_cache().ok_or("no expert cache")?;
            let plan = cache.plan().ok_or("no plan")?.clone();
            if mode == "cold" {
                eprintln!(
                    "ds4-bench: {item}: {}",
                    cache.startup_line().unwrap_or_default()
                );
            }
            sess.sync(&prompt, &mut |_, _| {})
                .map_err(|e| e.to_string())?;
            if mode == "warm" {
                decode(&mut sess, n_gen)?;
            }
            // The fastest block, with its own counters; a cold block starts
            // from an empty cache each time.
            let mut best: Option<(f64, ds4::backend::experts::StreamStats)> = None;
            for _ in 0..repeat {
                if mode == "cold" {
                    cache.clear();
                }
                cache.reset_stats();
                let s = decode(&mut sess, n_gen)?;
                if best.is_none_or(|(b, _)| s < b) {
                    best = Some((s, cache.stats()));
                }
            }
            let (s, st) = best.expect("at least one block");
            let tps = n_gen as f64 / s;
            let per_tok = st.bytes_per_token();
            let disk_roof = if per_tok > 0.0 {
                disk.sequential / per_tok
            } else {
                f64::INFINITY
            };
            // Reads and compute one after the other: the bound without overlap.
            let serial = 1.0 / (1.0 / resident_tps + per_tok / disk.sequential);
            let bound = resident_tps.min(disk_roof);
            println!(
                "{item},{},{mode},{tps:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{serial:.3},{:.1}",
                plan.slots,
                100.0 * tps / resident_tps,
                per_tok / (1u64 << 20) as f64,
                100.0 * st.hit_rate(),
                100.0 * st.cache_hit_rate(),
                100.0 * st.prefetch_hit_rate(),
                100.0 * st.predictor_rate(),
                1e3 * st.read_wait_s / st.tokens.max(1) as f64,
                disk_roof,
                100.0 * tps / bound,
            );
            let _ = std::io::stdout().flush();
        }
    }
    if let Some(pct) = a.ssd_profile_check {
        profile_check(&session, &bo, &base, &prompt, routed, pct, n_gen, repeat, a)?;
    }
    Ok(())
}

/// `--ssd-profile-check PCT`: records a popularity profile (prompt, then
/// -n greedy tokens, at PCT % of the routed bytes, cold), then times the
/// first -n tokens after the prompt of fresh sessions preloaded with and
/// without it (the fastest of `repeat` each). The decode repeats the
/// recorded run's tokens, so this is the case the profile is for: traffic
/// like the traffic it was recorded on.
#[allow(clippy::too_many_arguments)]
fn profile_check(
    session: &dyn Fn(BackendOptions) -> Result<Session, String>,
    bo: &BackendOptions,
    base: &StreamingOptions,
    prompt: &[u32],
    routed: u64,
    pct: f64,
    n_gen: usize,
    repeat: usize,
    a: &Args,
) -> Result<(), String> {
    let budget = CacheBudget::Bytes((routed as f64 * pct / 100.0).ceil() as u64);
    let mut path = a.model.as_os_str().to_owned();
    path.push(".bench-profile");
    let path = PathBuf::from(path);
    let _ = std::fs::remove_file(&path);
    let opts = |cold: bool, profile: ProfileFile| BackendOptions {
        ssd_streaming: Some(StreamingOptions {
            budget,
            cold,
            profile,
            ..base.clone()
        }),
        ..bo.clone()
    };
    {
        let mut sess = session(opts(true, ProfileFile::At(path.clone())))?;
        sess.sync(prompt, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        decode(&mut sess, n_gen)?;
        let cache = sess.expert_cache().ok_or("no expert cache")?;
        cache.save_profile()?;
    }
    println!("# preload profile at {pct} %: first {n_gen} tokens after the prompt, fresh session");
    println!("preload,decode_tps,hit_pct,cache_hit_pct,read_mib_per_token");
    let result = (|| {
        for (label, profile) in [
            ("no profile", ProfileFile::Off),
            ("profile", ProfileFile::At(path.clone())),
        ] {
            let mut best: Option<(f64, ds4::backend::experts::StreamStats)> = None;
            for _ in 0..repeat {
                let mut sess = session(opts(false, profile.clone()))?;
                let cache = sess.expert_cache().ok_or("no expert cache")?;
                eprintln!("ds4-bench: {}", cache.startup_line().unwrap_or_default());
                sess.sync(prompt, &mut |_, _| {})
                    .map_err(|e| e.to_string())?;
                cache.reset_stats();
                let s = decode(&mut sess, n_gen)?;
                if best.is_none_or(|(b, _)| s < b) {
                    best = Some((s, cache.stats()));
                }
            }
            let (s, st) = best.expect("at least one run");
            println!(
                "{label},{:.3},{:.1},{:.1},{:.1}",
                n_gen as f64 / s,
                100.0 * st.hit_rate(),
                100.0 * st.cache_hit_rate(),
                st.bytes_per_token() / (1u64 << 20) as f64,
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// The bytes one batched step reads under the model of issue 18: every
/// weight except the routed experts and the embedding table once, plus the
/// routed experts' bytes times the distinct experts the step's rows hit, with
/// `rows` rows choosing `k` of `n` experts uniformly (expected distinct
/// count `n·(1 − (1 − k/n)^rows)` per layer).
fn step_bytes_model(model: &ModelFile, rows: usize) -> (f64, f64, f64) {
    let cfg = &model.config;
    let mut dense = 0f64;
    let mut per_expert = 0f64;
    for t in model.file.tensor_infos() {
        let (name, b) = (t.name.as_str(), t.n_bytes as f64);
        if name.contains("_exps") {
            per_expert += b / cfg.n_expert as f64;
        } else if name != "token_embd.weight" {
            dense += b;
        }
    }
    let (n, k) = (cfg.n_expert as f64, cfg.n_expert_used as f64);
    let hit = n * (1.0 - (1.0 - k / n).powi(rows as i32));
    // per_expert sums every layer's slab of one expert.
    (dense, per_expert * hit, hit)
}

/// `--sessions`: N sessions served together through [`Batch`], for each N
/// of the list. All sessions arrive at once; each step carries the next
/// prefill piece of every session still prefilling and one decode row of
/// every session already decoding (greedy tokens). Decode tokens/s counts
/// the steps in which every session decodes.
fn run_sessions(
    a: &Args,
    list: &str,
    backend: ds4::backend::BackendKind,
    bo: BackendOptions,
) -> Result<(), String> {
    let counts: Vec<usize> = list
        .split(',')
        .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("--sessions {list:?}: give positive counts like 1,2,4,8"))?;
    if a.session_prompt == 0 || a.mixed_prefill_quantum == 0 || a.gen_tokens == 0 {
        return Err("--session-prompt, --mixed-prefill-quantum and -n must be positive".into());
    }
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = open_model(a)?;
    // Every weight page faulted in first (as --warm-weights does), so the
    // first engine measured does not pay the file's page-in.
    model.warm(&mut |_, _| {});
    let vocab = model.config.n_vocab;
    let base: Vec<u32> = match &a.prompt_file {
        Some(p) => {
            let tok = Tokenizer::from_gguf(&model.file)
                .map_err(|e| format!("{}: {e}", a.model.display()))?;
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            tok.encode_plain(&text)
        }
        None => Vec::new(),
    };
    // Session i's prompt: the prompt file's tokens from offset 7·i (so the
    // prompts differ), or pseudo-random ids below the vocabulary.
    let prompt = |i: usize| -> Vec<u32> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
        (0..a.session_prompt)
            .map(|j| match base.get(7 * i + j) {
                Some(&t) => t,
                None => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % vocab.min(100_000) as u64) as u32
                }
            })
            .collect()
    };
    let ctx = a.session_prompt + a.gen_tokens + 8;
    let mut out: Box<dyn Write> = match &a.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    };
    writeln!(
        out,
        "engine,sessions,prompt_tokens,gen_tokens,ttft_mean_s,ttft_max_s,decode_agg_tps,decode_per_session_tps,decode_step_ms,model_bytes_per_step,model_distinct_experts,model_gbps"
    )
    .map_err(|e| e.to_string())?;
    // The single-session reference: one `Session` (its own kernel choice
    // per piece size), the first prompt, greedy decode.
    {
        let opts = SessionOptions {
            ctx,
            prefill_chunk: a.mixed_prefill_quantum,
            backend,
            backend_options: bo.clone(),
            ..Default::default()
        };
        let mut sess = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
        let t = Instant::now();
        sess.sync(&prompt(0), &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let ttft = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            let l = sess.logits();
            let next = (0..l.len()).fold(0, |m, j| if l[j] > l[m] { j } else { m });
            sess.eval(next as u32).map_err(|e| e.to_string())?;
        }
        let s = t.elapsed().as_secs_f64();
        let (dense, routed, hit) = step_bytes_model(&model, 1);
        let tps = a.gen_tokens as f64 / s;
        writeln!(
            out,
            "session,1,{},{},{ttft:.3},{ttft:.3},{tps:.2},{tps:.2},{:.1},{:.0},{hit:.1},{:.2}",
            a.session_prompt,
            a.gen_tokens,
            1e3 / tps,
            dense + routed,
            (dense + routed) * tps / 1e9
        )
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())?;
    }
    for &n in &counts {
        let opts = SessionOptions {
            ctx,
            prefill_chunk: a.mixed_prefill_quantum,
            backend,
            backend_options: bo.clone(),
            ..Default::default()
        };
        let mut b = Batch::new(model.clone(), opts, n).map_err(|e| e.to_string())?;
        eprintln!(
            "ds4-bench: {n} sessions, {}; {:.1} MiB of state per slot; {threads} CPU threads",
            b.backend_notice(),
            b.slot_state_bytes() as f64 / (1u64 << 20) as f64
        );
        let prompts: Vec<Vec<u32>> = (0..n).map(prompt).collect();
        let mut done = vec![0usize; n];
        let mut generated = vec![0usize; n];
        let mut ttft = vec![0f64; n];
        let mut next_tok = vec![0u32; n];
        let (mut dec_s, mut dec_steps) = (0f64, 0usize);
        let t0 = Instant::now();
        while generated.iter().any(|&g| g < a.gen_tokens) {
            let mut work = Vec::new();
            let mut all_decode = true;
            let single: Vec<[u32; 1]> = next_tok.iter().map(|&t| [t]).collect();
            for i in 0..n {
                if done[i] < prompts[i].len() {
                    all_decode = false;
                    let end = (done[i] + a.mixed_prefill_quantum).min(prompts[i].len());
                    work.push(SlotWork {
                        slot: i,
                        tokens: &prompts[i][done[i]..end],
                        all_logits: false,
                    });
                } else if generated[i] < a.gen_tokens {
                    work.push(SlotWork {
                        slot: i,
                        tokens: &single[i],
                        all_logits: false,
                    });
                }
            }
            all_decode &= work.len() == n;
            let t = Instant::now();
            b.step(&work).map_err(|e| e.to_string())?;
            let dt = t.elapsed().as_secs_f64();
            if all_decode {
                dec_s += dt;
                dec_steps += 1;
            }
            let lens: Vec<(usize, usize)> = work.iter().map(|w| (w.slot, w.tokens.len())).collect();
            for (i, len) in lens {
                if done[i] < prompts[i].len() {
                    done[i] += len;
                    if done[i] == prompts[i].len() {
                        ttft[i] = t0.elapsed().as_secs_f64();
                    }
                } else {
                    generated[i] += 1;
                }
                let l = b.logits(i);
                next_tok[i] = (0..l.len()).fold(0, |m, j| if l[j] > l[m] { j } else { m }) as u32;
            }
        }
        let agg = if dec_s > 0.0 {
            (dec_steps * n) as f64 / dec_s
        } else {
            0.0
        };
        let step_ms = if dec_steps > 0 {
            1e3 * dec_s / dec_steps as f64
        } else {
            0.0
        };
        let (dense, routed, hit) = step_bytes_model(&model, n);
        let bytes = dense + routed;
        let gbps = if step_ms > 0.0 {
            bytes / (step_ms / 1e3) / 1e9
        } else {
            0.0
        };
        writeln!(
            out,
            "batch,{n},{},{},{:.3},{:.3},{agg:.2},{:.2},{step_ms:.1},{bytes:.0},{hit:.1},{gbps:.2}",
            a.session_prompt,
            a.gen_tokens,
            ttft.iter().sum::<f64>() / n as f64,
            ttft.iter().cloned().fold(0.0, f64::max),
            agg / n as f64,
        )
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match ds4::app::cli::parse_args::<Args>("ds4-bench") {
        Ok(a) => ds4::app::cli::exit_with("ds4-bench", run(a)),
        Err(code) => code,
    }
}
