//! `ds4-quantize`: tools around ds4's GGUF files (docs/TOOLS.md).
//!
//! ```text
//! ds4-quantize --compare A.gguf B.gguf
//! ds4-quantize --splice BASE.gguf OTHER.gguf --take PATTERN [--take …] -o OUT.gguf
//! ds4-quantize --hf CHECKPOINT_DIR --recipe q8|mxfp4|q2|q4|f32 -o OUT.gguf [--name NAME]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use argh::FromArgs;
use ds4::convert::{compare, write};
use ds4::testmodel::Variant;

/// ds4-quantize — convert an official V4 checkpoint to ds4's GGUF; compare and splice GGUF files of the same model.
#[derive(FromArgs)]
#[argh(note = "Examples:
  {command_name} --hf DeepSeek-V4-Flash --recipe q2 -o ds4flash-q2.gguf
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
    /// convert the official V4 checkpoint in this folder (config.json, safetensors shards) to -o
    #[argh(option)]
    hf: Option<PathBuf>,
    /// with --hf: the published mix to write: q8, mxfp4, q2, q4 or f32
    #[argh(option)]
    recipe: Option<String>,
    /// with --hf: general.name of the output (default "DeepSeek V4 Flash")
    #[argh(option)]
    name: Option<String>,
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
    if let Some(dir) = &a.hf {
        let recipe = a
            .recipe
            .as_deref()
            .ok_or("--hf needs --recipe q8|mxfp4|q2|q4|f32")?;
        let variant = Variant::parse(recipe)
            .ok_or_else(|| format!("--recipe {recipe:?}: expected q8, mxfp4, q2, q4 or f32"))?;
        let out = a.out.ok_or("--hf needs -o OUT.gguf")?;
        let name = a.name.as_deref().unwrap_or("DeepSeek V4 Flash");
        let cancel = cancel_flag();
        let done = write::convert(dir, &out, variant, name, !a.quiet, &cancel)
            .map_err(|e| e.to_string())?;
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
    Err("give --hf DIR --recipe R -o OUT, --compare A B or --splice BASE OTHER --take P -o OUT (--help for usage; docs/TOOLS.md)".into())
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
