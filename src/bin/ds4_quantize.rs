//! `ds4-quantize`: tools around ds4's GGUF files (docs/TOOLS.md).
//!
//! ```text
//! ds4-quantize --compare A.gguf B.gguf
//! ds4-quantize --splice BASE.gguf OTHER.gguf --take PATTERN [--take …] -o OUT.gguf
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use argh::FromArgs;
use ds4::convert::compare;

/// ds4-quantize — compare and splice GGUF files of the same model.
#[derive(FromArgs)]
#[argh(note = "Examples:
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

fn run(a: Args) -> Result<(), String> {
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
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let c = cancel.clone();
            let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
        }
        let n = compare::splice(base, other, &a.take, &out, !a.quiet, &cancel)
            .map_err(|e| e.to_string())?;
        eprintln!(
            "ds4-quantize: wrote {} ({n} tensors from {})",
            out.display(),
            other.display()
        );
        return Ok(());
    }
    Err("give --compare A B or --splice BASE OTHER --take P -o OUT (--help for usage); conversion of checkpoints is not implemented yet (docs/TOOLS.md)".into())
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
