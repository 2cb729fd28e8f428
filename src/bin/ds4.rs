//! `ds4`: one-shot generation, token and logprob dumps, model info (CLI.md §1).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use argh::FromArgs;
use ds4::chat::{self, ThinkMode};
use ds4::graph::ValueName;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::sampler::{self, Rng, SamplerConfig};
use ds4::session::{BackendKind, Session, SessionOptions};
use ds4::tokenizer::{StreamDecoder, Tokenizer};

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
    /// greedy continuation with top-k logprobs written to FILE as JSON
    #[argh(option)]
    dump_logprobs: Option<PathBuf>,
    /// alternatives per step for --dump-logprobs (default 20, max 128)
    #[argh(option, default = "20")]
    logprobs_top_k: usize,
    /// model: official rounding steps (default); plain: without them
    #[argh(option, default = "String::from(\"model\")")]
    numerics: String,
    /// backend: auto (default: a real GPU through wgpu, else cpu), cpu, wgpu (aliases metal, vulkan), cuda
    #[argh(option)]
    backend: Option<String>,
    /// same as --backend wgpu (Vulkan where there is no Metal)
    #[argh(switch)]
    vulkan: bool,
    /// print every wgpu adapter (backend, type, limits, features) and exit; DS4_WGPU_ADAPTER picks one by index or name
    #[argh(switch)]
    list_devices: bool,
    /// write every WGSL module, as handed to wgpu, to DIR as .wgsl files and exit
    #[argh(option)]
    dump_shaders: Option<PathBuf>,
    /// same as --backend cpu
    #[argh(switch)]
    cpu: bool,
    /// same as --backend wgpu (Metal on macOS)
    #[argh(switch)]
    metal: bool,
    /// same as --backend cuda
    #[argh(switch)]
    cuda: bool,
    /// read every weight page once before starting (shows progress)
    #[argh(switch)]
    warm_weights: bool,
    /// CPU threads (default: all cores)
    #[argh(option, short = 't')]
    threads: Option<usize>,
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

static STOP: AtomicBool = AtomicBool::new(false);

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

const NO_MODEL: &str = "no model: ./ds4flash.gguf not found and no -m given.\n\
    Get the real model (q2, 81 GB) with: tools/download_model.sh q2\n\
    or try the engine on a random tiny model with: ds4 --demo -p \"hello\"";

fn model_path(a: &Args) -> Result<PathBuf, String> {
    if a.demo {
        return demo_model();
    }
    match &a.model {
        Some(p) => Ok(p.clone()),
        None if Path::new("ds4flash.gguf").exists() => Ok(PathBuf::from("ds4flash.gguf")),
        None => Err(NO_MODEL.to_string()),
    }
}

/// The demo model: generated once into the user cache (random weights).
fn demo_model() -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join("ds4");
    let path = dir.join("demo-tiny-q8.gguf");
    if !path.exists() {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        eprintln!(
            "ds4: generating the demo model (random weights) at {}",
            path.display()
        );
        let vocab = ds4::testmodel::Vocab::load_default()?;
        let tmp = dir.join(format!("demo-tiny-q8.{}.tmp", std::process::id()));
        let mut spec = ds4::testmodel::TestModelSpec::tiny();
        spec.name = "ds4 demo model (RANDOM WEIGHTS, output is noise)".into();
        ds4::testmodel::write_model(&spec, ds4::testmodel::Variant::Q8, &vocab, &tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!("ds4: DEMO MODE — tiny model with random weights; the text it writes is noise");
    Ok(path)
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

fn backend_kind(a: &Args) -> Result<BackendKind, String> {
    let flags = [a.cpu, a.metal, a.vulkan, a.cuda].iter().filter(|&&x| x).count()
        + a.backend.is_some() as usize;
    if flags > 1 {
        return Err("choose one backend (--backend, --cpu, --metal, --vulkan, --cuda)".into());
    }
    if a.cpu {
        return Ok(BackendKind::Cpu);
    }
    if a.metal || a.vulkan {
        return Ok(BackendKind::Wgpu);
    }
    if a.cuda {
        return Ok(BackendKind::Cuda);
    }
    match &a.backend {
        Some(b) => BackendKind::parse(b).map_err(|e| e.to_string()),
        None => Ok(BackendKind::Auto),
    }
}

fn think_mode(a: &Args) -> Result<ThinkMode, String> {
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

/// JSON string escaping of CLI.md §1.6.
fn json_text(bytes: &[u8]) -> String {
    let mut s = String::new();
    let valid = std::str::from_utf8(bytes).is_ok();
    let text: Vec<char> = if valid {
        String::from_utf8_lossy(bytes).chars().collect()
    } else {
        bytes.iter().map(|&b| b as char).collect()
    };
    for c in text {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c if !valid && (c as u32) >= 0x80 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

/// `%.9g`
fn g9(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let e = x.abs().log10().floor() as i32;
    if !(-5..9).contains(&e) {
        let s = format!("{:.8e}", x);
        let (m, ex) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        let ex: i32 = ex.parse().unwrap_or(0);
        format!("{m}e{}{:02}", if ex < 0 { '-' } else { '+' }, ex.abs())
    } else {
        let decimals = (8 - e).max(0) as usize;
        let s = format!("{:.*}", decimals, x);
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

fn token_json(tok: &Tokenizer, id: u32) -> String {
    let bytes = tok.token_bytes(id).unwrap_or(&[]);
    let list: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
    format!(
        "{{\"id\":{id},\"text\":\"{}\",\"bytes\":[{}]}}",
        json_text(bytes),
        list.join(",")
    )
}

fn dump_logprobs(
    sess: &mut Session,
    tok: &Tokenizer,
    prompt_len: usize,
    steps: usize,
    k: usize,
    path: &Path,
) -> Result<(), String> {
    let mut out = format!(
        "{{\n  \"source\":\"ds4\",\n  \"prompt_tokens\":{prompt_len},\n  \"ctx\":{},\n  \"top_k\":{k},\n  \"steps\":[\n",
        sess.ctx()
    );
    let eos = tok.specials().eos;
    for step in 0..steps {
        let logits = sess.logits();
        let m = logits
            .iter()
            .cloned()
            .filter(|v| v.is_finite())
            .fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + logits
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| (v as f64 - m).exp())
            .sum::<f64>()
            .ln();
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let sel = idx[0] as u32;
        let tops: Vec<String> = idx[..k.min(idx.len())]
            .iter()
            .map(|&i| {
                format!(
                    "{{\"token\":{},\"logit\":{},\"logprob\":{}}}",
                    token_json(tok, i as u32),
                    g9(logits[i] as f64),
                    g9(logits[i] as f64 - lse)
                )
            })
            .collect();
        if step > 0 {
            out.push_str(",\n");
        }
        out.push_str(&format!(
            "    {{\"step\":{step},\"selected\":{},\"top_logprobs\":[{}]}}",
            token_json(tok, sel),
            tops.join(",")
        ));
        if sel == eos || step + 1 == steps {
            break;
        }
        sess.eval(sel).map_err(|e| e.to_string())?;
    }
    out.push_str("\n  ]\n}\n");
    std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(a: Args) -> Result<(), String> {
    if a.list_devices {
        print!("{}", ds4::backend::wgpu::gpu::devices_report());
        return Ok(());
    }
    if let Some(dir) = &a.dump_shaders {
        let written = ds4::backend::wgpu::shaders::dump(dir)
            .map_err(|e| format!("--dump-shaders {}: {e}", dir.display()))?;
        eprintln!("ds4: wrote {} WGSL modules to {}", written.len(), dir.display());
        return Ok(());
    }
    if a.info || a.inspect {
        return info(&model_path(&a)?);
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
    let backend = backend_kind(&a)?;
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
    if let Some(t) = a.threads {
        // Only the first call configures the global pool; ignore a second.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }

    let t0 = Instant::now();
    let model = Arc::new(ModelFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?);
    let tok = Tokenizer::from_gguf(&model.file).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "ds4: loaded {} ({}, {} layers) in {:.0} ms",
        path.display(),
        human(model.file.file_len()),
        model.config.n_layer,
        t0.elapsed().as_secs_f64() * 1e3
    );
    if a.warm_weights {
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
    if mode == ThinkMode::Max && eff != mode {
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
        dump: dumps.clone(),
    };
    let mut sess = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
    eprintln!("ds4: {}", sess.backend_notice());
    eprintln!(
        "ds4: context buffers {} for {} tokens",
        human(sess.state_bytes() as u64),
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
    let mut gen = Generator {
        tok: &tok,
        cfg,
        rng: Rng::new(seed),
        tty: std::io::stdout().is_terminal(),
    };
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
    let Some(prompt) = prompt else {
        return repl(
            &mut sess,
            &mut gen,
            &system,
            mode,
            a.tokens.map(|n| n as usize),
        );
    };

    let ptoks = chat::one_shot_prompt(&tok, &system, &prompt, eff);
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
    let max_new = (a.tokens.unwrap_or(50_000) as usize)
        .min(a.ctx - ptoks.len() - 1)
        .max(1);
    if let Some(f) = &a.dump_logprobs {
        return dump_logprobs(&mut sess, &tok, ptoks.len(), max_new, a.logprobs_top_k, f);
    }
    let t2 = Instant::now();
    let (generated, _) = gen.run(&mut sess, max_new, eff.thinks())?;
    let gen_s = t2.elapsed().as_secs_f64();
    eprintln!(
        "ds4: prefill: {:.2} t/s, generation: {:.2} t/s",
        ptoks.len() as f64 / prefill_s.max(1e-9),
        generated.len() as f64 / gen_s.max(1e-9)
    );
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
    cfg: SamplerConfig,
    rng: Rng,
    tty: bool,
}

impl Generator<'_> {
    /// Generates up to `max_new` tokens; returns them (EOS excluded) and
    /// whether EOS ended the answer. Stops early on Ctrl+C or a full context.
    fn run(
        &mut self,
        sess: &mut Session,
        max_new: usize,
        thinking: bool,
    ) -> Result<(Vec<u32>, bool), String> {
        let sp = *self.tok.specials();
        let mut thinking = thinking;
        let mut dec = StreamDecoder::new();
        let mut out = std::io::stdout().lock();
        let mut last_byte = b'\n';
        let mut generated = Vec::new();
        let mut eos = false;
        if thinking && self.tty {
            let _ = write!(out, "\x1b[90m");
        }
        while generated.len() < max_new && !STOP.load(Ordering::SeqCst) {
            let next = sampler::sample(sess.logits(), &self.cfg, &mut self.rng) as u32;
            if next == sp.eos {
                eos = true;
                break;
            }
            if next == sp.think_close && thinking {
                thinking = false;
                let tail = dec.finish();
                let _ = out.write_all(tail.as_bytes());
                if self.tty {
                    let _ = write!(out, "\x1b[0m");
                }
                if tail.as_bytes().last().copied().unwrap_or(last_byte) != b'\n' {
                    let _ = writeln!(out);
                }
                last_byte = b'\n';
            } else if next != sp.think_open {
                let text = dec.push(self.tok.token_bytes(next).unwrap_or(&[]));
                if let Some(&b) = text.as_bytes().last() {
                    last_byte = b;
                }
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            generated.push(next);
            if sess.tokens().len() + 1 >= sess.ctx() {
                break;
            }
            sess.eval(next).map_err(|e| e.to_string())?;
        }
        let tail = dec.finish();
        let _ = out.write_all(tail.as_bytes());
        if thinking && self.tty {
            let _ = write!(out, "\x1b[0m");
        }
        if tail.as_bytes().last().copied().unwrap_or(last_byte) != b'\n' {
            let _ = writeln!(out);
        }
        Ok((generated, eos))
    }
}

const REPL_HELP: &str =
    "commands: /help, /think, /think-max, /nothink, /ctx N, /read FILE, /quit (or /exit)\n\
    anything else is sent as a user message; Ctrl+C stops an answer, Ctrl+D leaves";

/// The interactive REPL (CLI.md §1.4): one transcript, one KV session; each
/// turn only evaluates what the session does not hold yet.
fn repl(
    sess: &mut Session,
    gen: &mut Generator<'_>,
    system: &str,
    mut mode: ThinkMode,
    max_tokens: Option<usize>,
) -> Result<(), String> {
    use std::io::BufRead;
    let tok = gen.tok;
    let eos = tok.specials().eos;
    let start =
        |mode: ThinkMode, ctx: usize| chat::transcript_start(tok, system, mode.effective(ctx));
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
            ("/think", _) | ("/nothink", _) | ("/think-max", _) => {
                mode = match line {
                    "/think" => ThinkMode::High,
                    "/nothink" => ThinkMode::None,
                    _ => ThinkMode::Max,
                };
                head = start(mode, sess.ctx());
                let eff = mode.effective(sess.ctx());
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
            ("/ctx", n) => match n.parse::<usize>() {
                Ok(n) if n >= 2 => {
                    eprintln!("ds4: context {n} takes effect on the next run (restart ds4 with --ctx {n})");
                    continue;
                }
                _ => {
                    return Err(format!(
                        "/ctx: expected a positive number of tokens, got {n:?}"
                    ))
                }
            },
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
        let eff = mode.effective(sess.ctx());
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
        let (generated, _) = gen.run(sess, max_tokens.unwrap_or(room).min(room), eff.thinks())?;
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

/// Name, type, shape and bytes of every tensor in the directory.
fn print_tensor_table(f: &ds4::gguf::GgufFile) {
    println!(
        "{:<44} {:<8} {:<24} {:>14}",
        "name", "type", "shape", "bytes"
    );
    for t in f.tensor_infos() {
        let ty =
            t.ty.map_or_else(|| format!("?{}", t.type_id), |t| t.name().to_string());
        println!(
            "{:<44} {:<8} {:<24} {:>14}",
            t.name,
            ty,
            format!("{:?}", t.ne),
            t.n_bytes
        );
    }
}

/// `--info` on an MTP draft file: its tensor directory (its shapes are
/// validated against a main model when both are loaded).
fn info_mtp(path: &Path) -> Result<(), String> {
    let f = ds4::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "file: {} ({}, GGUF v{}) — MTP draft model (speculative decoding; not used by this version yet)",
        path.display(),
        human(f.file_len()),
        f.version()
    );
    print_tensor_table(&f);
    Ok(())
}

fn info(path: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    let m = match ModelFile::open(path) {
        Ok(m) => m,
        Err(ds4::model::ModelError::WrongKind(_))
            if ds4::gguf::GgufFile::open(path)
                .is_ok_and(|f| f.tensor_info("mtp.0.attn_norm.weight").is_some()) =>
        {
            return info_mtp(path)
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let load = t0.elapsed();
    let c = &m.config;
    println!(
        "file: {} ({}, GGUF v{}, alignment {})",
        path.display(),
        human(m.file.file_len()),
        m.file.version(),
        m.file.alignment()
    );
    println!(
        "loaded and validated in {:.1} ms (no tensor data read)",
        load.as_secs_f64() * 1e3
    );
    println!("\n== metadata ==");
    for (k, v) in m.file.metadata() {
        println!("{k:<48} {}", v.summary());
    }
    println!("\n== configuration ==");
    println!("name                 {}", c.name);
    println!("layers               {}", c.n_layer);
    println!("embedding            {}", c.n_embd);
    println!("vocab                {}", c.n_vocab);
    println!(
        "heads                {} × {} (kv heads {}, rotary dims {})",
        c.n_head, c.head_dim, c.n_head_kv, c.n_rot
    );
    println!("q low rank           {}", c.q_lora_rank);
    println!(
        "output groups        {} × rank {}",
        c.o_groups, c.o_lora_rank
    );
    println!("sliding window       {}", c.sliding_window);
    let kinds: Vec<String> = m
        .weights
        .layers
        .iter()
        .map(|l| match l.kind {
            ds4::model::AttentionKind::Window => "W".to_string(),
            ds4::model::AttentionKind::Csa { ratio } => format!("C{ratio}"),
            ds4::model::AttentionKind::Hca { ratio } => format!("H{ratio}"),
        })
        .collect();
    println!(
        "layer kinds          {} (W window, C csa, H hca; number = ratio)",
        kinds.join(" ")
    );
    println!(
        "indexer              {} heads × {}, top-k {}",
        c.indexer_heads, c.indexer_head_dim, c.indexer_top_k
    );
    println!(
        "hyper-connections    {} streams, {} Sinkhorn iterations, eps {:e}",
        c.hc_count, c.hc_sinkhorn_iters, c.hc_eps
    );
    println!("rms eps              {:e}", c.rms_eps);
    println!(
        "rope                 base {} (window layers), {} (compressed layers)",
        c.rope_base, c.compress_rope_base
    );
    match c.yarn {
        Some(y) => println!(
            "yarn                 factor {}, original context {}, beta fast {} slow {}",
            y.factor, y.original_context, y.beta_fast, y.beta_slow
        ),
        None => println!("yarn                 off"),
    }
    println!(
        "experts              {} routed, {} used, ff {}, {} shared, {} hash layers",
        c.n_expert, c.n_expert_used, c.expert_ff, c.n_expert_shared, c.n_hash_layers
    );
    println!(
        "routing              weights scale {}, normalised {}",
        c.expert_weights_scale, c.expert_weights_norm
    );
    println!(
        "swiglu clamp         {:?}",
        &c.swiglu_clamp[..c.swiglu_clamp.len().min(8)]
    );
    if let Some(ctx) = c.context_length {
        println!("trained context      {ctx}");
    }
    println!("\n== tensors ==");
    print_tensor_table(&m.file);
    let total = m.weights.total_bytes();
    let active = m.weights.active_bytes_per_token(c);
    println!(
        "\ntensors: {} in file, {} bound",
        m.file.tensor_infos().len(),
        m.weights.all().len()
    );
    println!("\n== type mix (bound tensors) ==");
    for share in m.weights.type_mix() {
        println!(
            "{:<8} {:>5} tensors {:>16} bytes ({:>10}, {:5.1} %)",
            share.ty.name(),
            share.tensors,
            share.bytes,
            human(share.bytes),
            100.0 * share.bytes as f64 / total.max(1) as f64
        );
    }
    for ([g, u, d], n) in m.weights.routed_expert_types() {
        println!("routed experts: gate {g}, up {u}, down {d} ({n} layers)");
    }
    println!("total weight bytes:            {total} ({})", human(total));
    println!(
        "active weight bytes per token: {active} ({})",
        human(active)
    );
    Ok(())
}

fn main() -> ExitCode {
    match ds4::cli::parse_args::<Args>("ds4") {
        Ok(a) => ds4::cli::exit_with("ds4", run(a)),
        Err(code) => code,
    }
}
