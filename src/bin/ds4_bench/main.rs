//! `ds4-bench`: prefill and generation speed at increasing context frontiers
//! with one model load (CLI.md §2), and the other modes: `--bandwidth`, the
//! `--ssd-streaming` budget sweep, `--sessions`, `--spec-table`
//! (speculative decoding), and for a machine without cargo the backend
//! self-check `--check`, `--list-devices` and `--make-model`
//! (docs/GPU_ROUND.md). Writes CSV. This file holds the flags and picks the
//! mode; each mode has its own file.

mod bandwidth;
mod check;
mod frontiers;
mod sessions;
mod speculative;
mod sweep;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use argh::FromArgs;
use ds4::backend::options::{EvictionPolicy, ProfileFile, StreamingOptions};
use ds4::backend::BackendOptions;
use ds4::model::{Arch, ModelFile};

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
        ..SpecFlags,
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
        /// instead of context frontiers: the speculative-decoding table (verify
        /// cost by draft length, tokens/s at synthetic acceptance lengths 1.0,
        /// 1.8, 2.8, 3.5 fixed and adaptive, prompt lookup and its cost) over a
        /// prompt of --session-prompt ids (or --prompt-file) and -n tokens;
        /// --draft sets the longest draft (default 5)
        #[argh(switch)]
        spec_table: bool,
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
        /// instead of a benchmark: the self-check of a backend (cuda, wgpu or
        /// cpu): every op against its CPU twin, end-to-end logits against
        /// cpu-ref on generated tiny models, batched against serial steps,
        /// SSD streaming against resident experts; one PASS/FAIL line per
        /// check (and a CSV with --csv), exit 1 on any failure
        #[argh(option)]
        check: Option<String>,
        /// with --check: quick (short sequences, for CPU emulators) or full
        /// (default)
        #[argh(option, default = "String::from(\"full\")")]
        check_size: String,
        /// with --check: only these comma-separated groups (ops, e2e, batch,
        /// ssd)
        #[argh(option)]
        check_only: Option<String>,
        /// with --check: where the models are generated and kept (default: a
        /// temporary folder, removed after)
        #[argh(option)]
        check_dir: Option<PathBuf>,
        /// print the wgpu adapters and the CUDA devices, then exit
        #[argh(switch)]
        list_devices: bool,
        /// instead of a benchmark: write a generated model to -m (a new
        /// file): flash:N (the N-layer Flash-width bench model, q2 mix,
        /// random blocks; 8.85 GiB at 4) or tiny:VARIANT (f32, q8, q2, q4,
        /// mxfp4)
        #[argh(option)]
        make_model: Option<String>,
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

/// The `-m` file as a DeepSeek V4 model.
fn open_model(a: &Args) -> Result<Arc<ModelFile>, String> {
    Ok(Arc::new(
        ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?,
    ))
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

/// Picks the mode: `--list-devices`, `--make-model`, `--check`,
/// `--bandwidth`, a budget sweep, `--sessions`, else the context frontiers.
fn run(a: Args) -> Result<(), String> {
    let mut bo = BackendOptions::from_env();
    if a.list_devices {
        print!("{}", ds4::app::report::devices());
        return Ok(());
    }
    if let Some(kind) = &a.make_model {
        return check::make_model(&a, kind);
    }
    if let Some(backend) = &a.check {
        return check::run(&a, backend, bo);
    }
    check_family(&a, peek_arch(&a.model))?;
    if a.bandwidth {
        return bandwidth::run(&a, &bo);
    }
    if let Some(list) = a.budget_sweep() {
        return sweep::run(&a, list, bo);
    }
    bo.ssd_streaming = a.streaming_options()?;
    let backend = a.backend_flags().resolve()?;
    if let Some(list) = &a.sessions {
        return sessions::run(&a, list, backend, bo);
    }
    if a.spec_table {
        return speculative::run(&a, backend, bo);
    }
    if a.spec_flags().resolve()?.on() {
        return Err("--spec, --mtp and --dspark go with --spec-table in ds4-bench".into());
    }
    frontiers::run(&a, backend, bo)
}

/// Where the CSV goes: `--csv`, else stdout.
fn csv_out(a: &Args) -> Result<Box<dyn Write>, String> {
    Ok(match &a.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    })
}

fn main() -> ExitCode {
    match ds4::app::cli::parse_args::<Args>("ds4-bench") {
        Ok(a) => ds4::app::cli::exit_with("ds4-bench", run(a)),
        Err(code) => code,
    }
}
