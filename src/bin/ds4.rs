//! `ds4`: one-shot generation, token and logprob dumps, model info (CLI.md §1).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use argh::FromArgs;
use ds4::backend::BackendOptions;
use ds4::chat::{self, ThinkMode};
use ds4::constrain::{GrammarEngine, OutputGrammar};
use ds4::generate::{
    generate, Constrained, Observer, Piece, Sampled, Step, ThinkSplit, TokenPicker,
};
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
        /// model: official rounding steps (default); plain: without them
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
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

const NO_MODEL: &str = "no model: ./ds4flash.gguf not found and no -m given.\n\
    Get the real model (q2, 81 GB) with: tools/download_model.sh q2\n\
    or try the engine on a random tiny model with: ds4 --demo -p \"hello\"";

fn model_path(a: &Args) -> Result<PathBuf, String> {
    if a.demo {
        return ds4::app::demo::demo_model();
    }
    match &a.model {
        Some(p) => Ok(p.clone()),
        None if Path::new("ds4flash.gguf").exists() => Ok(PathBuf::from("ds4flash.gguf")),
        None => Err(NO_MODEL.to_string()),
    }
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

fn dump_tokens(tok: &Tokenizer, prompt: &str) {
    let ids = tok.encode_chat(prompt);
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    println!("[{}]", list.join(", "));
    for id in ids {
        println!("{id:>6}  {}", tok.token_str(id).unwrap_or(""));
    }
}

fn run(a: Args) -> Result<(), String> {
    let mut bo = BackendOptions::from_env();
    bo.ssd_streaming = a.streaming_flags().options()?;
    // Checked before the model loads: a bad schema costs no load time.
    let schema = a.json_schema.as_deref().map(read_json_schema).transpose()?;
    if a.list_devices {
        print!("{}", ds4::backend::wgpu::gpu::devices_report());
        match ds4::backend::cuda_device_lines() {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => println!("cuda: none ({e})"),
        }
        return Ok(());
    }
    if let Some(dir) = &a.dump_shaders {
        let written = ds4::backend::wgpu::shaders::dump(dir)
            .map_err(|e| format!("--dump-shaders {}: {e}", dir.display()))?;
        eprintln!(
            "ds4: wrote {} WGSL modules to {}",
            written.len(),
            dir.display()
        );
        return Ok(());
    }
    if a.info || a.inspect {
        let kind = a.backend_flags().resolve()?;
        return ds4::app::report::info(&model_path(&a)?, Some((kind, &bo)));
    }
    let prompt = read_prompt(&a)?;
    let path = model_path(&a)?;
    if a.dump_tokens {
        let prompt = prompt.ok_or("--dump-tokens needs -p or --prompt-file")?;
        let file =
            ds4::gguf::GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let tok = Tokenizer::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
        dump_tokens(&tok, &prompt);
        return Ok(());
    }
    // No prompt: the interactive REPL.
    if prompt.as_deref() == Some("") {
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
    let mode = think_mode(&a)?;
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
    let threads = ds4::app::threads::init_global_pool(a.threads);

    let t0 = Instant::now();
    let model = AnyModel::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
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
    // V4.1: the level the prompt writes (`None` on V4).
    let v41_level = (model.arch() == Arch::V41).then(|| {
        a.think_level
            .unwrap_or_else(|| mode.v41_level(chat::v41::DEFAULT_LEVEL))
    });
    if a.warm_weights && model.arch() == Arch::V41 {
        eprintln!(
            "ds4: --warm-weights: V4.1 files are not warmed (their Engram tables are read by row)"
        );
    }
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
    let eff = mode.effective(a.ctx);
    if mode == ThinkMode::Max && eff != mode && v41_level.is_none() {
        eprintln!(
            "ds4: warning: Think Max needs --ctx ≥ {}; using thinking mode high",
            chat::THINK_MAX_MIN_CTX
        );
    }
    let system = a
        .system
        .clone()
        .unwrap_or_else(|| chat::DEFAULT_SYSTEM.to_string());
    let opts = SessionOptions {
        ctx: a.ctx,
        prefill_chunk: a.prefill_chunk.max(1),
        numerics,
        backend,
        backend_options: bo.clone(),
        dump: dumps.clone(),
    };
    let mut sess = Session::open_any(&model, opts).map_err(|e| e.to_string())?;
    eprintln!("ds4: {}", sess.backend_notice());
    if let Some(line) = sess.expert_cache().and_then(|c| c.startup_line()) {
        eprintln!("ds4: {line}");
    }
    eprintln!(
        "ds4: context buffers {} for {} tokens",
        ds4::app::report::human(sess.state_bytes() as u64),
        a.ctx
    );
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
        Some(g) => Some((GrammarEngine::new(&tok).map_err(|e| e.to_string())?, g)),
    };
    let mut gen = Generator {
        tok: &tok,
        picker: Sampled {
            cfg,
            rng: Rng::new(seed),
        },
        tty: std::io::stdout().is_terminal(),
        grammar,
    };
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
    let Some(prompt) = prompt else {
        let make_session = |ctx: usize| {
            let opts = SessionOptions {
                ctx,
                prefill_chunk: a.prefill_chunk.max(1),
                numerics,
                backend,
                backend_options: bo.clone(),
                dump: Vec::new(),
            };
            Session::open_any(&model, opts).map_err(|e| e.to_string())
        };
        return repl(
            sess,
            &make_session,
            &mut gen,
            &system,
            mode,
            v41_level,
            a.tokens.map(|n| n as usize),
        );
    };

    let ptoks = match v41_level {
        Some(level) => chat::v41::one_shot_prompt(&tok, &system, &prompt, level),
        None => chat::one_shot_prompt(&tok, &system, &prompt, eff),
    };
    let thinks = v41_level.map_or(eff.thinks(), |l| l > 0);
    if ptoks.len() >= a.ctx {
        return Err(format!(
            "the prompt has {} tokens but the context is {} (use a larger --ctx)",
            ptoks.len(),
            a.ctx
        ));
    }
    let t1 = Instant::now();
    prefill(&mut sess, &ptoks)?;
    let prefill_s = t1.elapsed().as_secs_f64();
    for d in &dumps {
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
            &tok,
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

/// Brings the session to `tokens`, with a progress bar on stderr.
fn prefill(sess: &mut Session, tokens: &[u32]) -> Result<ds4::session::SyncStats, String> {
    let bar = indicatif::ProgressBar::new(tokens.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "processing {len} input tokens: {pos}/{len} {wide_bar} {percent}% {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let r = sess.sync(tokens, &mut |done, _| bar.set_position(done as u64));
    bar.finish_and_clear();
    r.map_err(|e| e.to_string())
}

/// Samples and prints tokens: reasoning in grey on a terminal, the
/// `<think>`/`</think>` markers hidden, UTF-8 split across tokens buffered.
struct Generator<'t> {
    tok: &'t Tokenizer,
    picker: Sampled,
    tty: bool,
    /// `--json-schema`: every answer is constrained to the schema.
    grammar: Option<(GrammarEngine, OutputGrammar)>,
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

/// Prints the pieces of the library's generation loop as they come.
struct Printer<'o> {
    out: std::io::StdoutLock<'o>,
    split: ThinkSplit,
    tty: bool,
    grey: bool,
    last_byte: u8,
}

impl Printer<'_> {
    fn print(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            let (text, reasoning) = match &p {
                Piece::Reasoning(s) => (s, true),
                Piece::Text(s) => (s, false),
            };
            if !reasoning && self.grey {
                self.end_reasoning();
            }
            let _ = self.out.write_all(text.as_bytes());
            if let Some(&b) = text.as_bytes().last() {
                self.last_byte = b;
            }
        }
        // The reasoning phase ended even if no text followed yet.
        if self.grey && !self.split.thinking() {
            self.end_reasoning();
        }
        let _ = self.out.flush();
    }

    fn end_reasoning(&mut self) {
        self.grey = false;
        if self.tty {
            let _ = write!(self.out, "\x1b[0m");
        }
        if self.last_byte != b'\n' {
            let _ = writeln!(self.out);
        }
        self.last_byte = b'\n';
    }
}

impl Observer for Printer<'_> {
    fn cancelled(&mut self) -> bool {
        STOP.load(Ordering::SeqCst)
    }
    fn token(&mut self, _id: u32, bytes: &[u8]) -> Step {
        let pieces = self.split.push(bytes);
        self.print(pieces);
        Step::Continue
    }
}

impl Generator<'_> {
    /// Generates up to `max_new` tokens; returns them (EOS excluded).
    /// Stops early on Ctrl+C or a full context.
    fn run(
        &mut self,
        sess: &mut Session,
        max_new: usize,
        thinking: bool,
    ) -> Result<Vec<u32>, String> {
        let mut p = Printer {
            out: std::io::stdout().lock(),
            split: ThinkSplit::new(thinking),
            tty: self.tty,
            grey: thinking,
            last_byte: b'\n',
        };
        if thinking && self.tty {
            let _ = write!(p.out, "\x1b[90m");
        }
        let mut cut = false;
        let r = match &self.grammar {
            None => generate(sess, self.tok, max_new, &mut self.picker, &mut p),
            Some((engine, g)) => {
                let c = engine.constraint(g).map_err(|e| e.to_string())?;
                let sp = self.tok.specials();
                let gates = if thinking {
                    vec![sp.think_close]
                } else {
                    Vec::new()
                };
                let mut cp = Constrained::new(&mut self.picker, c, gates, true, sp.eos);
                let r = generate(sess, self.tok, max_new, &mut cp, &mut p);
                cut = cp.unfinished();
                if let Some(e) = &cp.error {
                    eprintln!("ds4: grammar engine: {e}");
                }
                r
            }
        };
        let tail = p.split.finish();
        p.print(tail);
        if p.grey && self.tty {
            let _ = write!(p.out, "\x1b[0m");
        }
        if p.last_byte != b'\n' {
            let _ = writeln!(p.out);
        }
        drop(p);
        if cut {
            eprintln!("ds4: the answer was cut before it completed the JSON schema");
        }
        r.map(|o| o.tokens).map_err(|e| e.to_string())
    }
}

const REPL_HELP: &str =
    "commands: /help, /think, /think-max, /nothink, /ctx N, /read FILE, /save FILE, /load FILE,\n\
    /quit (or /exit); /save and /load keep the conversation's KV state in a KVC file (the\n\
    server's disk-cache format)\n\
    anything else is sent as a user message; Ctrl+C stops an answer, Ctrl+D leaves";

/// The interactive REPL (CLI.md §1.4): one transcript, one KV session; each
/// turn only evaluates what the session does not hold yet.
fn repl(
    mut session: Session,
    make_session: &dyn Fn(usize) -> Result<Session, String>,
    gen: &mut Generator<'_>,
    system: &str,
    mut mode: ThinkMode,
    v41_level: Option<u8>,
    max_tokens: Option<usize>,
) -> Result<(), String> {
    use std::io::BufRead;
    let sess = &mut session;
    let tok = gen.tok;
    let eos = tok.specials().eos;
    // V4.1 has no Think Max context rule: its levels are written as given.
    let effective = |mode: ThinkMode, ctx: usize| match v41_level {
        Some(_) => mode,
        None => mode.effective(ctx),
    };
    let start = |mode: ThinkMode, ctx: usize| match v41_level {
        Some(l) => chat::v41::transcript_start(tok, system, mode.v41_level(l)),
        None => chat::transcript_start(tok, system, mode.effective(ctx)),
    };
    let mut head = start(mode, sess.ctx());
    let mut turns: Vec<u32> = Vec::new();
    eprintln!("{REPL_HELP}");
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            print!("ds4> ");
            let _ = std::io::stdout().flush();
        }
        STOP.store(false, Ordering::SeqCst);
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let text = match line
            .split_once(' ')
            .map_or((line, ""), |(c, r)| (c, r.trim()))
        {
            ("/quit" | "/exit", _) => break,
            ("/help", _) => {
                eprintln!("{REPL_HELP}");
                continue;
            }
            (cmd @ ("/think" | "/nothink" | "/think-max"), rest) => {
                if !rest.is_empty() {
                    eprintln!("ds4: {cmd} takes no argument (try /help)");
                    continue;
                }
                mode = match cmd {
                    "/think" => ThinkMode::High,
                    "/nothink" => ThinkMode::None,
                    _ => ThinkMode::Max,
                };
                // Only the transcript start changes (Think Max prefix); the
                // next sync notices the KV no longer matches (PROMPT.md §10).
                head = start(mode, sess.ctx());
                let eff = effective(mode, sess.ctx());
                match (mode, eff) {
                    (ThinkMode::Max, ThinkMode::High) => println!(
                        "Thinking mode: high (ctx below {}).",
                        chat::THINK_MAX_MIN_CTX
                    ),
                    (_, ThinkMode::Max) => println!("Thinking mode: max."),
                    (_, ThinkMode::High) => println!("Thinking mode: high."),
                    (_, ThinkMode::None) => println!("Thinking mode: none."),
                }
                continue;
            }
            ("/ctx", n) => {
                match n.parse::<usize>() {
                    Ok(n) if n >= 2 => match make_session(n) {
                        Ok(s) => {
                            // A new KV of the new size: the conversation restarts.
                            *sess = s;
                            turns.clear();
                            head = start(mode, sess.ctx());
                            eprintln!("ds4: context is now {n} tokens (conversation cleared)");
                        }
                        Err(e) => eprintln!("ds4: /ctx {n}: {e}"),
                    },
                    _ => eprintln!("ds4: /ctx: expected a number of tokens ≥ 2, got {n:?}"),
                }
                continue;
            }
            ("/save", f) if !f.is_empty() => {
                // The same KVC file and session payload as the server's disk
                // cache (docs/KVCACHE.md), keyed by the rendered transcript.
                // The reply's closing EOS is not evaluated yet: sync first so
                // the file holds the whole transcript and /load can go on.
                let mut transcript = head.clone();
                transcript.extend(&turns);
                if let Err(e) = prefill(sess, &transcript) {
                    eprintln!("ds4: /save {f}: {e}");
                    continue;
                }
                let text = tok.decode(sess.tokens());
                match ds4::kvcache::save_file(
                    Path::new(f),
                    sess,
                    &text,
                    ds4::kvcache::SaveReason::Unknown,
                ) {
                    Ok(bytes) => eprintln!(
                        "ds4: saved {} tokens to {f} ({})",
                        sess.tokens().len(),
                        ds4::app::report::human(bytes)
                    ),
                    Err(e) => eprintln!("ds4: /save {f}: {e}"),
                }
                continue;
            }
            ("/load", f) if !f.is_empty() => {
                match ds4::kvcache::load_file(Path::new(f), sess) {
                    Ok(_) => {
                        // The file must hold this chat's transcript start
                        // (same system prompt and thinking mode) to go on.
                        let toks = sess.tokens();
                        if toks.starts_with(&head) {
                            turns = toks[head.len()..].to_vec();
                            eprintln!("ds4: loaded {} tokens from {f}", toks.len());
                        } else {
                            // Not this chat's: the current conversation goes
                            // on (the next turn prefills it again).
                            sess.reset();
                            eprintln!(
                                "ds4: /load {f}: saved with another system prompt or thinking mode; not loaded"
                            );
                        }
                    }
                    Err(e) => {
                        // The session is untouched or empty; either way the
                        // next turn syncs the current conversation again.
                        eprintln!("ds4: /load: {e}");
                    }
                }
                continue;
            }
            (cmd @ ("/save" | "/load"), _) => {
                eprintln!("ds4: {cmd}: expected a file name");
                continue;
            }
            ("/read", f) => match std::fs::read(f).map(String::from_utf8) {
                Ok(Ok(t)) => t,
                Ok(Err(_)) => {
                    eprintln!("ds4: {f}: not valid UTF-8");
                    continue;
                }
                Err(e) => {
                    eprintln!("ds4: {f}: {e}");
                    continue;
                }
            },
            (c, _) if c.starts_with('/') => {
                eprintln!("ds4: unknown command: {c} (try /help)");
                continue;
            }
            _ => line.to_string(),
        };
        let eff = effective(mode, sess.ctx());
        let turn = chat::user_turn(tok, &text, eff);
        let mut transcript = head.clone();
        transcript.extend(&turns);
        transcript.extend(&turn);
        if transcript.len() + 1 >= sess.ctx() {
            eprintln!(
                "ds4: the conversation no longer fits the context of {} tokens",
                sess.ctx()
            );
            continue;
        }
        let t = Instant::now();
        let stats = match prefill(sess, &transcript) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ds4: {e}");
                continue;
            }
        };
        eprintln!(
            "ds4: prefill {} new tokens ({} reused) at {:.1} t/s",
            stats.evaluated,
            stats.reused,
            stats.evaluated as f64 / t.elapsed().as_secs_f64().max(1e-9)
        );
        let room = sess.ctx() - transcript.len() - 1;
        let generated = gen.run(sess, max_tokens.unwrap_or(room).min(room), eff.thinks())?;
        if generated.is_empty() && STOP.load(Ordering::SeqCst) {
            // Interrupted before any token: the turn is dropped.
            sess.reset();
            continue;
        }
        turns.extend(&turn);
        turns.extend(&generated);
        turns.push(eos);
    }
    Ok(())
}

fn main() -> ExitCode {
    match ds4::app::cli::parse_args::<Args>("ds4") {
        Ok(a) => ds4::app::cli::exit_with("ds4", run(a)),
        Err(code) => code,
    }
}
