//! `ds4`: one-shot generation, token and logprob dumps, model info (CLI.md §1).
//! The flags and the steps of a run; the printing generator and the REPL
//! are `ds4::app::terminal` and `ds4::app::repl`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use argh::FromArgs;
use ds4::app::terminal::{prefill, Generator};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::chat::{self, ThinkMode};
use ds4::constrain::{GrammarEngine, OutputGrammar};
use ds4::generate::Sampled;
use ds4::graph::ValueName;
use ds4::model::forward::Numerics;
use ds4::model::{AnyModel, Arch};
use ds4::sampler::{Rng, SamplerConfig};
use ds4::session::{Session, SessionOptions};
use ds4::tokenizer::Tokenizer;

ds4::cli_args! {
    /// ds4 — DeepSeek V4 Flash inference engine. Without -p it starts an interactive chat.
    #[derive(FromArgs)]
    #[argh(note = "Examples:
  {command_name} -m ds4flash.gguf -p \"Explain mmap in two sentences.\"
  {command_name} --demo -p hello            random tiny model, no download
  {command_name} -m MODEL --info            metadata, configuration, tensor table
  {command_name} -m MODEL --dump-tokens -p TEXT
  {command_name} -m MODEL --imatrix-dataset calib.txt --imatrix-out MODEL.imatrix
Get the real model with tools/download_model.sh q2")]
    struct Args {
        /// model GGUF (default ./ds4flash.gguf)
        #[argh(option, short = 'm')]
        model: Option<PathBuf>,
        /// run on a generated tiny model with random weights (no download needed)
        #[argh(switch)]
        demo: bool,
        /// prompt text
        #[argh(option, short = 'p')]
        prompt: Option<String>,
        /// read the prompt from FILE (must be UTF-8)
        #[argh(option)]
        prompt_file: Option<PathBuf>,
        /// system text (also -sys; default "You are a helpful assistant", "" disables)
        #[argh(option)]
        system: Option<String>,
        /// maximum tokens to generate (default 50000, clamped to the context)
        #[argh(option, short = 'n')]
        tokens: Option<i64>,
        /// sampling temperature, 0 = greedy (default 1)
        #[argh(option, default = "1.0")]
        temp: f32,
        /// nucleus sampling mass (default 1)
        #[argh(option, default = "1.0")]
        top_p: f32,
        /// keep only the K most likely tokens, 0 = no cap (default 0)
        #[argh(option, default = "0")]
        top_k: i32,
        /// drop tokens below this fraction of the top probability (default 0.05)
        #[argh(option, default = "0.05")]
        min_p: f32,
        /// RNG seed (default: time based)
        #[argh(option)]
        seed: Option<u64>,
        /// session context in tokens (default 32768)
        #[argh(option, short = 'c', default = "32768")]
        ctx: usize,
        /// thinking mode high (the default)
        #[argh(switch)]
        think: bool,
        /// thinking mode max (needs --ctx ≥ 393216, else high)
        #[argh(switch)]
        think_max: bool,
        /// no thinking
        #[argh(switch)]
        nothink: bool,
        /// thinking effort 0..100: 0 = no thinking; on a V4.1 model the level
        /// of the "Reasoning Effort" line (default 75, max 100); on V4 0 acts as
        /// --nothink, 100 as --think-max, any other as --think
        #[argh(option)]
        think_level: Option<u8>,
        /// greedy continuation with top-k logprobs written to FILE as JSON
        #[argh(option)]
        dump_logprobs: Option<PathBuf>,
        /// constrain the answer to JSON matching the JSON schema in FILE (docs/STRUCTURED_OUTPUT.md)
        #[argh(option)]
        json_schema: Option<PathBuf>,
        /// alternatives per step for --dump-logprobs (default 20, max 128)
        #[argh(option, default = "20")]
        logprobs_top_k: usize,
        /// model: the official FP8/FP4 rounding steps (default); plain: f32 math without them
        #[argh(option, default = "String::from(\"model\")")]
        numerics: String,
        ..BackendFlags,
        /// print every wgpu adapter (backend, type, limits, features) and exit; DS4_WGPU_ADAPTER picks one by index or name
        #[argh(switch)]
        list_devices: bool,
        /// write every WGSL module, as handed to wgpu, to DIR as .wgsl files and exit
        #[argh(option)]
        dump_shaders: Option<PathBuf>,
        ..StreamingFlags,
        ..SpecFlags,
        /// read every weight page once before starting (shows progress)
        #[argh(switch)]
        warm_weights: bool,
        ..Threads,
        /// tokens per prefill step (default 2048)
        #[argh(option, default = "2048")]
        prefill_chunk: usize,
        /// print a named value (NAME@LAYER) after the prompt, e.g. attn_out@3
        #[argh(option)]
        dump: Vec<String>,
        /// print the tokenization of the prompt (chat markers recognised) and exit
        #[argh(switch)]
        dump_tokens: bool,
        /// print metadata, configuration and the tensor table, then exit
        #[argh(switch)]
        info: bool,
        /// same as --info
        #[argh(switch)]
        inspect: bool,
        /// collect an importance matrix over the text in FILE on --backend (needs --imatrix-out; docs/TOOLS.md)
        #[argh(option)]
        imatrix_dataset: Option<PathBuf>,
        /// write the collected imatrix to FILE (llama.cpp's imatrix GGUF format)
        #[argh(option)]
        imatrix_out: Option<PathBuf>,
        /// tokens per imatrix chunk, each scored from an empty context (default 512)
        #[argh(option, default = "ds4::app::imatrix::DEFAULT_CHUNK")]
        imatrix_chunk: usize,
        /// imatrix: at most N chunks of the dataset (default: all)
        #[argh(option)]
        imatrix_chunks: Option<usize>,
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

fn model_path(a: &Args) -> Result<PathBuf, String> {
    ds4::app::demo::model_path(a.model.as_deref(), a.demo)
}

fn read_prompt(a: &Args) -> Result<Option<String>, String> {
    match (&a.prompt, &a.prompt_file) {
        (Some(_), Some(_)) => Err("give either -p or --prompt-file, not both".into()),
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
            String::from_utf8(bytes).map(Some).map_err(|e| {
                format!(
                    "{}: not valid UTF-8 (byte {})",
                    f.display(),
                    e.utf8_error().valid_up_to()
                )
            })
        }
        (None, None) => Ok(None),
    }
}

fn think_mode(a: &Args) -> Result<ThinkMode, String> {
    if let Some(l) = a.think_level {
        if a.think || a.think_max || a.nothink {
            return Err("give --think-level or one of --think, --think-max, --nothink".into());
        }
        if l > chat::v41::MAX_LEVEL {
            return Err(format!("--think-level must be in 0..=100, got {l}"));
        }
        return Ok(ThinkMode::of_level(l));
    }
    match (a.think, a.think_max, a.nothink) {
        (_, false, false) => Ok(ThinkMode::High),
        (false, true, false) => Ok(ThinkMode::Max),
        (false, false, true) => Ok(ThinkMode::None),
        _ => Err("choose one of --think, --think-max, --nothink".into()),
    }
}

/// `--dump-tokens`: the prompt's token ids, then one id and its text a line.
fn dump_tokens(path: &Path, prompt: &str) -> Result<(), String> {
    let file = ds4::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    let ids = tok.encode_chat(prompt);
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    println!("[{}]", list.join(", "));
    for id in ids {
        println!("{id:>6}  {}", tok.token_str(id).unwrap_or(""));
    }
    Ok(())
}

fn run(a: Args) -> Result<(), String> {
    let mut bo = BackendOptions::from_env();
    bo.ssd_streaming = a.streaming_flags().options()?;
    // Checked before the model loads: a bad schema costs no load time.
    let schema = a.json_schema.as_deref().map(read_json_schema).transpose()?;
    if a.list_devices {
        list_devices();
        return Ok(());
    }
    if let Some(dir) = &a.dump_shaders {
        return dump_shaders(dir);
    }
    if a.info || a.inspect {
        let kind = a.backend_flags().resolve()?;
        return ds4::app::report::info(&model_path(&a)?, Some((kind, &bo)));
    }
    if a.imatrix_dataset.is_some() || a.imatrix_out.is_some() {
        return imatrix(&a, bo);
    }
    let prompt = read_prompt(&a)?;
    let path = model_path(&a)?;
    if a.dump_tokens {
        let prompt = prompt.ok_or("--dump-tokens needs -p or --prompt-file")?;
        return dump_tokens(&path, &prompt);
    }
    let c = check(&a, prompt.as_deref())?;
    let spec = a.spec_flags().resolve()?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let (model, tok) = load(&a, &path, &spec, threads)?;
    // V4.1: the level the prompt writes (`None` on V4).
    let v41_level = (model.arch() == Arch::V41).then(|| {
        a.think_level
            .unwrap_or_else(|| c.mode.v41_level(chat::v41::DEFAULT_LEVEL))
    });
    warm(&a, &model);
    let eff = c.mode.effective(a.ctx);
    if c.mode == ThinkMode::Max && eff != c.mode && v41_level.is_none() {
        eprintln!(
            "ds4: warning: Think Max needs --ctx ≥ {}; using thinking mode high",
            chat::THINK_MAX_MIN_CTX
        );
    }
    let system = a
        .system
        .clone()
        .unwrap_or_else(|| chat::DEFAULT_SYSTEM.to_string());
    let opts = |ctx: usize, dump: Vec<ValueName>| SessionOptions {
        ctx,
        prefill_chunk: a.prefill_chunk.max(1),
        numerics: c.numerics,
        backend: c.backend,
        backend_options: bo.clone(),
        dump,
        drafter: ds4::app::spec::session_drafter(&spec),
        ..Default::default()
    };
    let sess = open_session(&model, opts(a.ctx, c.dumps.clone()), a.ctx)?;
    let mut gen =
        generator(&a, &tok, schema)?.with_speculator(ds4::app::spec::speculator(&spec, &model)?);
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
    let Some(prompt) = prompt else {
        let make_session = |ctx: usize| {
            Session::open_any(&model, opts(ctx, Vec::new())).map_err(|e| e.to_string())
        };
        return ds4::app::repl::repl(
            sess,
            &make_session,
            &mut gen,
            &system,
            c.mode,
            v41_level,
            a.tokens.map(|n| n as usize),
        );
    };
    let ptoks = match v41_level {
        Some(level) => chat::v41::one_shot_prompt(&tok, &system, &prompt, level),
        None => chat::one_shot_prompt(&tok, &system, &prompt, eff),
    };
    let thinks = v41_level.map_or(eff.thinks(), |l| l > 0);
    one_shot(&a, sess, &mut gen, &ptoks, thinks, &c.dumps)
}

/// `--imatrix-dataset FILE --imatrix-out FILE`: the importance matrix of
/// the dataset's chunks, with a progress bar (chunks, perplexity, time
/// left); the file appears only when complete.
fn imatrix(a: &Args, bo: BackendOptions) -> Result<(), String> {
    use ds4::app::imatrix;
    let (Some(dataset), Some(out)) = (&a.imatrix_dataset, &a.imatrix_out) else {
        return Err("--imatrix-dataset and --imatrix-out go together".into());
    };
    let numerics = Numerics::parse(&a.numerics)
        .ok_or_else(|| format!("--numerics: expected model or plain, got {:?}", a.numerics))?;
    let backend = a.backend_flags().resolve()?;
    let bytes = std::fs::read(dataset)
        .map_err(|e| format!("--imatrix-dataset {}: {e}", dataset.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    if a.imatrix_chunk < 2 || a.imatrix_chunks == Some(0) {
        return Err("--imatrix-chunk must be at least 2 and --imatrix-chunks at least 1".into());
    }
    imatrix::check_out(out)?;
    let path = model_path(a)?;
    let spec = a.spec_flags().resolve()?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let (model, tok) = load(a, &path, &spec, threads)?;
    let (n_tokens, chunks) = imatrix::chunks(&tok, &text, a.imatrix_chunk, a.imatrix_chunks)
        .map_err(|e| format!("--imatrix-dataset {}: {e}", dataset.display()))?;
    eprintln!(
        "ds4: imatrix: {n_tokens} tokens, {} chunks of {}",
        chunks.len(),
        a.imatrix_chunk
    );
    let base = SessionOptions {
        numerics,
        backend,
        backend_options: bo,
        ..Default::default()
    };
    let bar = indicatif::ProgressBar::new(chunks.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "imatrix: chunk {pos}/{len} {wide_bar} {elapsed} elapsed, {eta} left {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut last = None;
    let got = imatrix::collect(
        &model,
        base,
        &dataset.display().to_string(),
        &chunks,
        &mut |c| {
            bar.set_position(c.done as u64);
            bar.set_message(format!("ppl {:.4}", c.ppl));
            let line = format!(
                "ds4: imatrix: chunk {}/{}: perplexity {:.4} ({:.1} s)",
                c.done, c.total, c.ppl, c.seconds
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            last = Some(c);
        },
    );
    bar.finish_and_clear();
    let got = got?;
    got.imatrix
        .write(out)
        .map_err(|e| format!("--imatrix-out {}: {e}", out.display()))?;
    if !got.skipped.is_empty() {
        eprintln!(
            "ds4: imatrix: not collected (input has no unique name): {}",
            got.skipped.join(", ")
        );
    }
    eprintln!(
        "ds4: imatrix: wrote {} ({} tensors, {} chunks of {}{})",
        out.display(),
        got.imatrix.entries.len(),
        got.chunks,
        a.imatrix_chunk,
        last.map_or(String::new(), |c| format!(", last perplexity {:.4}", c.ppl))
    );
    Ok(())
}

/// `--list-devices`: every wgpu adapter, then the CUDA devices.
fn list_devices() {
    print!("{}", ds4::app::report::devices());
}

/// `--dump-shaders DIR`.
fn dump_shaders(dir: &Path) -> Result<(), String> {
    let written = ds4::backend::wgpu::shaders::dump(dir)
        .map_err(|e| format!("--dump-shaders {}: {e}", dir.display()))?;
    eprintln!(
        "ds4: wrote {} WGSL modules to {}",
        written.len(),
        dir.display()
    );
    Ok(())
}

/// The flags a run needs, checked before the model loads.
struct Checked {
    numerics: Numerics,
    backend: BackendKind,
    mode: ThinkMode,
    dumps: Vec<ValueName>,
}

/// Flag values that are wrong on their face, refused before the model loads.
fn check(a: &Args, prompt: Option<&str>) -> Result<Checked, String> {
    // No prompt: the interactive REPL.
    if prompt == Some("") {
        return Err("empty prompt".into());
    }
    if let Some(n) = a.tokens {
        if n <= 0 {
            return Err(format!("-n must be a positive number of tokens, got {n}"));
        }
    }
    let numerics = Numerics::parse(&a.numerics)
        .ok_or_else(|| format!("--numerics: expected model or plain, got {:?}", a.numerics))?;
    let backend = a.backend_flags().resolve()?;
    let mode = think_mode(a)?;
    if a.ctx < 2 {
        return Err("--ctx must be at least 2".into());
    }
    if !(0.0..=100.0).contains(&a.temp)
        || !(0.0..=1.0).contains(&a.top_p)
        || !(0.0..=1.0).contains(&a.min_p)
    {
        return Err("--temp must be in [0,100], --top-p and --min-p in [0,1]".into());
    }
    if a.logprobs_top_k == 0 || a.logprobs_top_k > 128 {
        return Err("--logprobs-top-k must be in 1..=128".into());
    }
    let dumps: Vec<ValueName> = a
        .dump
        .iter()
        .map(|d| {
            ValueName::parse(d).ok_or_else(|| format!("--dump: expected NAME@LAYER, got {d:?}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(Checked {
        numerics,
        backend,
        mode,
        dumps,
    })
}

/// The model and its tokenizer, with the load line on stderr.
fn load(
    a: &Args,
    path: &Path,
    spec: &ds4::app::flags::SpecChoice,
    threads: usize,
) -> Result<(AnyModel, Tokenizer), String> {
    let t0 = Instant::now();
    let model = ds4::app::spec::open_model(path, spec)?;
    let tok = Tokenizer::from_gguf(model.file()).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "ds4: loaded {} ({}, {} layers{}) in {:.0} ms; {threads} CPU threads",
        path.display(),
        ds4::app::report::human(model.file().file_len()),
        model.n_layer(),
        if model.arch() == Arch::V41 {
            ", DeepSeek V4.1"
        } else {
            ""
        },
        t0.elapsed().as_secs_f64() * 1e3
    );
    if a.warm_weights && model.arch() == Arch::V41 {
        eprintln!(
            "ds4: --warm-weights: V4.1 files are not warmed (their Engram tables are read by row)"
        );
    }
    Ok((model, tok))
}

/// `--warm-weights` on a V4 file: every weight page read once, with a
/// progress bar.
fn warm(a: &Args, model: &AnyModel) {
    if let (true, Some(model)) = (a.warm_weights, model.v4()) {
        let bar = indicatif::ProgressBar::new(model.weights.total_bytes());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "warming weights {bytes}/{total_bytes} {wide_bar} {percent}%",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        model.warm(&mut |done, _| bar.set_position(done));
        bar.finish_and_clear();
    }
}

/// The session, with the backend, streaming and context lines on stderr.
fn open_session(model: &AnyModel, opts: SessionOptions, ctx: usize) -> Result<Session, String> {
    let sess = Session::open_any(model, opts).map_err(|e| e.to_string())?;
    eprintln!("ds4: {}", sess.backend_notice());
    if let Some(line) = sess.expert_cache().and_then(|c| c.startup_line()) {
        eprintln!("ds4: {line}");
    }
    eprintln!(
        "ds4: context buffers {} for {} tokens",
        ds4::app::report::human(sess.state_bytes() as u64),
        ctx
    );
    Ok(sess)
}

/// The printing generator: the sampler flags, the seed (time based when
/// not given) and the `--json-schema` grammar.
fn generator<'t>(
    a: &Args,
    tok: &'t Tokenizer,
    schema: Option<OutputGrammar>,
) -> Result<Generator<'t>, String> {
    let cfg = SamplerConfig {
        temperature: a.temp,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
    };
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        t ^ ((std::process::id() as u64) << 32)
    });
    let grammar = match schema {
        None => None,
        Some(g) => Some((GrammarEngine::new(tok).map_err(|e| e.to_string())?, g)),
    };
    let picker = Sampled {
        cfg,
        rng: Rng::new(seed),
    };
    let tty = std::io::stdout().is_terminal();
    Ok(Generator::new(tok, picker, tty, grammar, &STOP))
}

/// `-p`: prefill the prompt, print the `--dump` values, then write the
/// `--dump-logprobs` file or generate, with the speeds on stderr.
fn one_shot(
    a: &Args,
    mut sess: Session,
    gen: &mut Generator<'_>,
    ptoks: &[u32],
    thinks: bool,
    dumps: &[ValueName],
) -> Result<(), String> {
    if ptoks.len() >= a.ctx {
        return Err(format!(
            "the prompt has {} tokens but the context is {} (use a larger --ctx)",
            ptoks.len(),
            a.ctx
        ));
    }
    let t1 = Instant::now();
    prefill(&mut sess, ptoks)?;
    let prefill_s = t1.elapsed().as_secs_f64();
    for d in dumps {
        let v = sess.dump(d).map_err(|e| e.to_string())?;
        let shown: Vec<String> = v.iter().take(16).map(|x| format!("{x:.6}")).collect();
        eprintln!(
            "{d}: {} values [{}{}]",
            v.len(),
            shown.join(", "),
            if v.len() > 16 { ", …" } else { "" }
        );
    }
    let default_tokens = if a.demo {
        ds4::app::demo::DEMO_DEFAULT_TOKENS as i64
    } else {
        50_000
    };
    let max_new = (a.tokens.unwrap_or(default_tokens) as usize)
        .min(a.ctx - ptoks.len() - 1)
        .max(1);
    if let Some(f) = &a.dump_logprobs {
        return ds4::app::logprobs::dump_logprobs(
            &mut sess,
            gen.tokenizer(),
            ptoks.len(),
            max_new,
            a.logprobs_top_k,
            f,
        );
    }
    let t2 = Instant::now();
    let generated = gen.run(&mut sess, max_new, thinks)?;
    let gen_s = t2.elapsed().as_secs_f64();
    eprintln!(
        "ds4: prefill: {:.2} t/s, generation: {:.2} t/s",
        ptoks.len() as f64 / prefill_s.max(1e-9),
        generated.len() as f64 / gen_s.max(1e-9)
    );
    if let Some(s) = gen.speculator() {
        eprintln!("ds4: {}", ds4::app::spec::line(s.name(), &s.stats()));
    }
    if let Some(c) = sess.expert_cache() {
        eprintln!("ds4: {}", c.stats().line());
    }
    if let Some(st) = sess.engram_stats() {
        eprintln!("ds4: {}", ds4::app::report::engram_line(&st));
    }
    if STOP.load(Ordering::SeqCst) {
        eprintln!("ds4: interrupted");
    }
    Ok(())
}

/// Reads `--json-schema FILE`; a schema the engine cannot use is an error
/// naming the part.
fn read_json_schema(path: &std::path::Path) -> Result<OutputGrammar, String> {
    let text = std::fs::read(path).map_err(|e| format!("--json-schema {}: {e}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| format!("--json-schema {}: not JSON: {e}", path.display()))?;
    let g = OutputGrammar::JsonSchema(schema);
    ds4::constrain::check(&g)
        .map_err(|e| format!("--json-schema {}: unsupported schema: {e}", path.display()))?;
    Ok(g)
}

fn main() -> ExitCode {
    match ds4::app::cli::parse_args::<Args>("ds4") {
        Ok(a) => ds4::app::cli::exit_with("ds4", run(a)),
        Err(code) => code,
    }
}
