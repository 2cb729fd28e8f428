//! `ds4-quantize`: tools around ds4's GGUF files (docs/TOOLS.md).
//!
//! ```text
//! ds4-quantize --compare A.gguf B.gguf
//! ds4-quantize --splice BASE.gguf OTHER.gguf --take PATTERN [--take …] -o OUT.gguf
//! ds4-quantize --hf CHECKPOINT_DIR --recipe q8|mxfp4|q2|q4|f32|FILE -o OUT.gguf [--mtp | --dspark-only] [--name NAME] [--imatrix FILE]
//! ds4-quantize --imatrix-stats FILE
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use argh::FromArgs;
use ds4::convert::imatrix::Imatrix;
use ds4::convert::layout::Part;
use ds4::convert::recipe::Recipe;
use ds4::convert::{compare, write};

/// ds4-quantize — convert an official V4 or V4.1 checkpoint to ds4's GGUF; compare and splice GGUF files of the same model.
#[derive(FromArgs)]
#[argh(note = "Examples:
  {command_name} --hf DeepSeek-V4-Flash --recipe q2 -o ds4flash-q2.gguf
  {command_name} --hf DeepSeek-V4-Flash --recipe q2 --imatrix imatrix.gguf -o ds4flash-q2-imatrix.gguf
  {command_name} --hf DeepSeek-V4-Flash --recipe my-mix.recipe -o ds4flash-mine.gguf
  {command_name} --hf DeepSeek-V4-Flash --mtp --recipe q4 -o ds4flash-mtp.gguf
  {command_name} --hf DeepSeek-V4-Flash-DSpark --dspark-only --recipe q8 -o ds4flash-dspark.gguf
  python3 tools/checkpoint/engram_tables.py DeepSeek-V4.1-Flash   # V4.1: the Engram token map, once
  {command_name} --hf DeepSeek-V4.1-Flash --recipe q2 -o ds41flash-q2.gguf
  {command_name} --imatrix-stats imatrix.gguf
  {command_name} --compare a.gguf b.gguf
  {command_name} --splice q2.gguf q4.gguf --take 'blk.*.ffn_down_exps.weight' -o mixed.gguf
Details: docs/TOOLS.md")]
struct Args {
    /// print per-tensor RMSE and max error between the two GGUFs given
    #[argh(switch)]
    compare: bool,
    /// copy BASE, taking the tensors matching --take from OTHER (same model)
    #[argh(switch)]
    splice: bool,
    /// convert the official V4 or V4.1 checkpoint in this folder (config.json, safetensors shards; V4.1 also engram_tables.json) to -o
    #[argh(option)]
    hf: Option<PathBuf>,
    /// with --hf: the published mix to write (q8, mxfp4, q2, q4, f32) or a recipe file (lines `PATTERN TYPE`, `base MIX`; docs/TOOLS.md)
    #[argh(option)]
    recipe: Option<String>,
    /// with --hf: write the MTP block's file (mtp.0.*, for --mtp-model) instead of the main model
    #[argh(switch)]
    mtp: bool,
    /// with --hf: write DeepSeek's DSpark drafter's file (its mtp.N.* stages, for --dspark --mtp-model) instead of the main model
    #[argh(switch)]
    dspark_only: bool,
    /// with --hf: general.name of the output (default "DeepSeek V4 Flash", V4.1: "DeepSeek V4.1 Flash")
    #[argh(option)]
    name: Option<String>,
    /// with --hf: an importance matrix (llama.cpp's GGUF imatrix, or its legacy .dat) for the IQ2_XXS / Q2_K / Q4_K tensors
    #[argh(option)]
    imatrix: Option<PathBuf>,
    /// print the entries of an imatrix file (columns, matrices, counts, importance)
    #[argh(option)]
    imatrix_stats: Option<PathBuf>,
    /// with --splice: a tensor name pattern (`*` matches anything); repeatable
    #[argh(option)]
    take: Vec<String>,
    /// output GGUF (written under a temporary name, renamed when complete)
    #[argh(option, short = 'o')]
    out: Option<PathBuf>,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
    /// files for --compare / --splice
    #[argh(positional)]
    files: Vec<PathBuf>,
}

/// Ctrl-C sets the flag the tools poll between pieces of work.
fn cancel_flag() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
    cancel
}

fn run(a: Args) -> Result<(), String> {
    if let Some(file) = &a.imatrix_stats {
        let im = Imatrix::read(file).map_err(|e| e.to_string())?;
        for line in im.stats() {
            println!("{line}");
        }
        return Ok(());
    }
    if a.imatrix.is_some() && a.hf.is_none() {
        return Err("--imatrix goes with --hf DIR --recipe R -o OUT".into());
    }
    if let Some(dir) = &a.hf {
        let recipe = a
            .recipe
            .as_deref()
            .ok_or("--hf needs --recipe q8|mxfp4|q2|q4|f32|FILE")?;
        let mix = Recipe::from_arg(recipe).map_err(|e| e.to_string())?;
        let out = a.out.ok_or("--hf needs -o OUT.gguf")?;
        let imatrix = match &a.imatrix {
            Some(p) => Some(Imatrix::read(p).map_err(|e| e.to_string())?),
            None => None,
        };
        let im = imatrix.as_ref().zip(a.imatrix.as_deref());
        let cancel = cancel_flag();
        let opts = write::ConvertOptions {
            recipe: &mix,
            name: a.name.as_deref(),
            part: match (a.mtp, a.dspark_only) {
                (true, true) => return Err("give one of --mtp and --dspark-only".into()),
                (true, false) => Part::Mtp,
                (false, true) => Part::Dspark,
                (false, false) => Part::Main,
            },
            imatrix: im,
            progress: !a.quiet,
        };
        let done = write::convert(dir, &out, &opts, &cancel).map_err(|e| e.to_string())?;
        eprintln!(
            "ds4-quantize: wrote {} ({} tensors, {} bytes, recipe {recipe})",
            out.display(),
            done.tensors,
            done.bytes
        );
        return Ok(());
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
        let cancel = cancel_flag();
        let n = compare::splice(base, other, &a.take, &out, !a.quiet, &cancel)
            .map_err(|e| e.to_string())?;
        eprintln!(
            "ds4-quantize: wrote {} ({n} tensors from {})",
            out.display(),
            other.display()
        );
        return Ok(());
    }
    Err("give --hf DIR --recipe R -o OUT, --compare A B, --splice BASE OTHER --take P -o OUT or --imatrix-stats FILE (--help for usage; docs/TOOLS.md)".into())
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
