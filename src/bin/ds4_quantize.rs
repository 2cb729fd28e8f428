//! `ds4-quantize`: ds4's GGUFs from the official DeepSeek checkpoints, and
//! the tools around them (docs/TOOLS.md).
//!
//! ```text
//! ds4-quantize --hf DIR -o OUT.gguf [--recipe q2|q4|q8|mxfp4|f32|lossless|FILE] [--imatrix FILE]
//! ds4-quantize --compare A.gguf B.gguf
//! ds4-quantize --splice BASE.gguf OTHER.gguf --take PATTERN [--take …] -o OUT.gguf
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use argh::FromArgs;
use ds4::convert::imatrix::Imatrix;
use ds4::convert::recipe::Recipe;
use ds4::convert::{compare, convert, ConvertOptions};

/// ds4-quantize — convert DeepSeek V4 checkpoints (safetensors) to ds4's GGUF layouts.
#[derive(FromArgs)]
#[argh(note = "Examples:
  {command_name} --hf DeepSeek-V4-Flash -o ds4flash-q2.gguf --recipe q2 --imatrix ds4.imatrix
  {command_name} --hf DeepSeek-V4-Flash -o ds4flash-mxfp4.gguf --recipe mxfp4
  {command_name} --hf DeepSeek-V4-Flash -o custom.gguf --recipe my-mix.txt
  {command_name} --compare a.gguf b.gguf
  {command_name} --splice q2.gguf q4.gguf --take 'blk.*.ffn_down_exps.weight' -o mixed.gguf
Recipes, recipe files and the imatrix formats: docs/TOOLS.md")]
struct Args {
    /// checkpoint folder: config.json, tokenizer.json, *.safetensors (+ index)
    #[argh(option)]
    hf: Option<PathBuf>,
    /// output GGUF (written under a temporary name, renamed when complete)
    #[argh(option, short = 'o')]
    out: Option<PathBuf>,
    /// q2 (default), q4, q8, mxfp4, f32, lossless, or a recipe file
    #[argh(option, default = "String::from(\"q2\")")]
    recipe: String,
    /// importance matrix (llama.cpp imatrix GGUF or legacy .dat) weighting IQ2_XXS/Q2_K/Q4_K
    #[argh(option)]
    imatrix: Option<PathBuf>,
    /// worker threads (default: all cores)
    #[argh(option, default = "0")]
    threads: usize,
    /// general.name of the output (default: the checkpoint folder's name)
    #[argh(option)]
    name: Option<String>,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
    /// print per-tensor RMSE and max error between the two GGUFs given
    #[argh(switch)]
    compare: bool,
    /// copy BASE, taking the tensors matching --take from OTHER (same model)
    #[argh(switch)]
    splice: bool,
    /// with --splice: a tensor name pattern (`*` matches anything); repeatable
    #[argh(option)]
    take: Vec<String>,
    /// files for --compare / --splice
    #[argh(positional)]
    files: Vec<PathBuf>,
}

fn recipe(spec: &str) -> Result<Recipe, String> {
    let p = Path::new(spec);
    if p.is_file() {
        let text = std::fs::read_to_string(p).map_err(|e| format!("recipe {spec}: {e}"))?;
        Recipe::parse(&text, spec).map_err(|e| e.to_string())
    } else {
        Recipe::named(spec).map_err(|e| e.to_string())
    }
}

fn run(a: Args) -> Result<(), String> {
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
    }
    if a.compare {
        let [x, y] = a.files.as_slice() else {
            return Err("--compare takes two GGUF files".into());
        };
        return compare::print_compare(x, y).map_err(|e| e.to_string());
    }
    if a.splice {
        let [base, other] = a.files.as_slice() else {
            return Err("--splice takes BASE.gguf OTHER.gguf".into());
        };
        let out = a.out.ok_or("--splice needs -o OUT.gguf")?;
        if a.take.is_empty() {
            return Err("--splice needs at least one --take PATTERN".into());
        }
        let n = compare::splice(base, other, &a.take, &out, &cancel).map_err(|e| e.to_string())?;
        eprintln!("ds4-quantize: wrote {} ({n} tensors from {})", out.display(), other.display());
        return Ok(());
    }
    let hf = a.hf.ok_or("give --hf CHECKPOINT_DIR (or --compare / --splice); --help for usage")?;
    let out = a.out.ok_or("give -o OUT.gguf")?;
    let imatrix = match &a.imatrix {
        Some(p) => Some(Imatrix::read(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let opts = ConvertOptions {
        checkpoint: hf,
        out: out.clone(),
        recipe: recipe(&a.recipe)?,
        imatrix,
        threads: a.threads,
        name: a.name,
        progress: !a.quiet,
        cancel,
    };
    let r = convert(&opts).map_err(|e| e.to_string())?;
    let types: Vec<String> = r.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    eprintln!(
        "ds4-quantize: wrote {} ({:?}, {} tensors: {}), {:.2} GB read, {:.2} GB written in {:.1} s ({:.2} GB/s read)",
        out.display(),
        r.family,
        r.tensors,
        types.join(", "),
        r.bytes_in as f64 / 1e9,
        r.bytes_out as f64 / 1e9,
        r.seconds,
        r.bytes_in as f64 / 1e9 / r.seconds.max(1e-9)
    );
    Ok(())
}

fn main() -> ExitCode {
    // A file-size limit (ulimit -f) should fail a write, not kill us before
    // the partial file is removed.
    // SAFETY: setting a signal disposition at start-up, before any thread.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    match ds4::app::cli::parse_args::<Args>("ds4-quantize") {
        Ok(a) => ds4::app::cli::exit_with("ds4-quantize", run(a)),
        Err(code) => code,
    }
}
