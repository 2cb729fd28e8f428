//! `ds4-bench`: prefill and generation speed at increasing context frontiers
//! with one model load (CLI.md §2). Writes CSV.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use argh::FromArgs;
use ds4::model::ModelFile;
use ds4::session::{BackendKind, Session, SessionOptions};
use ds4::tokenizer::Tokenizer;

/// Measure prefill and generation speed at context frontiers ctx-start,
/// ctx-start+step, … ctx-max. Per frontier: prefill the new tokens (timed),
/// generate gen-tokens greedily (timed), restore the frontier.
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
    /// backend: cpu (fast), cpu-ref (reference), wgpu, cuda
    #[argh(option, default = "String::from(\"cpu\")")]
    backend: String,
    /// same as --backend cpu
    #[argh(switch)]
    cpu: bool,
    /// CPU threads
    #[argh(option, short = 't')]
    threads: Option<usize>,
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
    /// CSV destination (default stdout)
    #[argh(option)]
    csv: Option<PathBuf>,
}

fn run(a: Args) -> Result<(), String> {
    let backend = if a.cpu {
        BackendKind::Cpu
    } else {
        BackendKind::parse(&a.backend).map_err(|e| e.to_string())?
    };
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
    if let Some(t) = a.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    let model =
        Arc::new(ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?);
    let tok =
        Tokenizer::from_gguf(&model.file).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let read = |p: &PathBuf| -> Result<String, String> {
        String::from_utf8(std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
            .map_err(|_| format!("{}: not UTF-8", p.display()))
    };
    let tokens: Vec<u32> = match (&a.prompt_file, &a.chat_prompt_file) {
        (Some(p), None) => tok.encode_plain(&read(p)?),
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
        ..Default::default()
    };
    let mut sess = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
    eprintln!(
        "ds4-bench: context buffers {:.1} MiB for {ctx} tokens",
        sess.state_bytes() as f64 / (1u64 << 20) as f64
    );
    let mut out: Box<dyn Write> = match &a.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    };
    writeln!(
        out,
        "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"
    )
    .map_err(|e| e.to_string())?;
    let eos = tok.specials().eos as usize;
    let (mut f, mut prev) = (a.ctx_start, 0usize);
    loop {
        let t = Instant::now();
        sess.sync(&tokens[..f], &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let prefill_s = t.elapsed().as_secs_f64();
        let snap = sess.save_snapshot().map_err(|e| e.to_string())?;
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
        sess.load_snapshot(&snap).map_err(|e| e.to_string())?;
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        writeln!(
            out,
            "{},{},{:.2},{},{:.2},{}",
            f,
            f - prev,
            rate(f - prev, prefill_s),
            a.gen_tokens,
            rate(a.gen_tokens, gen_s),
            snap.len()
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
    Ok(())
}

fn main() -> ExitCode {
    match ds4::cli::parse_args::<Args>("ds4-bench") {
        Ok(a) => ds4::cli::exit_with("ds4-bench", run(a)),
        Err(code) => code,
    }
}
