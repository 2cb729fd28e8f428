//! The conversion: every output tensor decoded from the checkpoint and
//! encoded in its recipe type, in parallel, straight to its place in the
//! output file.
//!
//! Memory stays bounded whatever the checkpoint: the shards are mapped (the
//! pages of a tensor are handed back once it is written), and the work is cut
//! into jobs of at most a few MiB of rows, so at any time only `threads`
//! jobs' buffers exist. Jobs are taken in file order from one counter, so the
//! shards are read front to back. The output is written under a temporary
//! name in the same folder (`OUT.partial-PID`), its full size reserved up
//! front (a disk that cannot hold it fails at once), and renamed to `OUT`
//! only when every byte is written and synced; on any failure or interrupt
//! the temporary file is removed, so nothing is ever left under `OUT`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::decode::Source;
use super::imatrix::Imatrix;
use super::layout::{self, Family, HfConfig, HfRef, OutTensor, Plan};
use super::recipe::Recipe;
use super::safetensors::Checkpoint;
use super::ConvertError;
use crate::quant::{self, GgmlType};
use crate::testmodel::{Class, Vocab};

/// What to convert and how.
pub struct ConvertOptions {
    pub checkpoint: PathBuf,
    pub out: PathBuf,
    pub recipe: Recipe,
    pub imatrix: Option<Imatrix>,
    /// Worker threads (0: all cores).
    pub threads: usize,
    /// `general.name` of the output.
    pub name: Option<String>,
    pub progress: bool,
    /// Set from outside (Ctrl-C) to stop early; the partial file is removed.
    pub cancel: Arc<AtomicBool>,
}

/// What a conversion did.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub family: Family,
    pub tensors: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub seconds: f64,
    /// Output tensor count per type.
    pub types: Vec<(GgmlType, usize)>,
}

/// Where one output tensor's rows come from: one source per piece (one
/// piece, or one per expert).
struct Resolved<'a> {
    t: OutTensor,
    ty: GgmlType,
    pieces: Vec<Source<'a>>,
    rows_per_piece: usize,
    offset: u64,
    /// Jobs left per piece (pages released at zero).
    left: Vec<AtomicUsize>,
}

struct Job {
    tensor: usize,
    piece: usize,
    r0: usize,
    n: usize,
}

/// The checkpoint's `tokenizer.json` as ds4's vocabulary.
fn read_vocab(dir: &Path) -> Result<Vocab, ConvertError> {
    let p = dir.join("tokenizer.json");
    let bytes = std::fs::read(&p).map_err(|e| ConvertError::Checkpoint {
        file: p.display().to_string(),
        msg: format!("cannot read: {e}"),
    })?;
    Vocab::from_tokenizer_json(&bytes).map_err(|e| ConvertError::Checkpoint {
        file: p.display().to_string(),
        msg: e,
    })
}

/// Builds the plan for the checkpoint in `opts`.
pub fn plan(ck: &Checkpoint, name: &str) -> Result<Plan, ConvertError> {
    let cfg = HfConfig::read(&ck.dir)?;
    let vocab = read_vocab(&ck.dir)?;
    match cfg.family()? {
        Family::V4 => layout::plan_v4(&cfg, &vocab, name),
        Family::V41 => Err(ConvertError::Usage(format!(
            "{}: DeepSeek V4.1 checkpoints are not converted yet (docs/TOOLS.md)",
            cfg.path
        ))),
    }
}

/// Resolves every output tensor's sources and type.
fn resolve<'a>(
    ck: &'a Checkpoint,
    tensors: Vec<OutTensor>,
    recipe: &Recipe,
) -> Result<Vec<Resolved<'a>>, ConvertError> {
    recipe.check_rules_used(&tensors)?;
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let (pieces, rows_per_piece) = match &t.src {
            HfRef::One(name) => {
                let shape: Vec<u64> = t.ne.iter().rev().copied().collect();
                let s = Source::resolve(ck, name, &shape)?;
                let rows = s.rows;
                (vec![s], rows)
            }
            HfRef::Experts(pattern, n) => {
                let shape = [t.ne[1], t.ne[0]];
                let v = (0..*n)
                    .map(|x| Source::resolve(ck, &pattern.replace("{}", &x.to_string()), &shape))
                    .collect::<Result<Vec<_>, _>>()?;
                (v, t.ne[1] as usize)
            }
        };
        let first = &pieces[0];
        let ty = recipe.type_for(&t, first.weight.entry.dtype, first.is_fp4())?;
        if t.class == Class::Table && !matches!(first.enc, super::decode::Encoding::Int) {
            return Err(ConvertError::Tensor {
                file: first.weight.file(),
                tensor: first.weight.name.into(),
                msg: format!("dtype {} is not an integer table", first.weight.entry.dtype.name()),
            });
        }
        let left = (0..pieces.len()).map(|_| AtomicUsize::new(0)).collect();
        out.push(Resolved {
            t,
            ty,
            pieces,
            rows_per_piece,
            offset: 0,
            left,
        });
    }
    Ok(out)
}

/// Rows per job: about 4 MiB of f32 input, at least one row.
fn rows_per_job(cols: usize) -> usize {
    ((1usize << 20) / cols.max(1)).max(1)
}

/// Runs one job: decode, encode, write at its offset.
fn run_job(
    r: &Resolved,
    job: &Job,
    file: &File,
    imatrix: Option<&Imatrix>,
    buf: &mut Vec<f32>,
    out: &mut Vec<u8>,
) -> Result<u64, ConvertError> {
    let src = &r.pieces[job.piece];
    let cols = src.cols;
    let row_bytes = r.ty.row_bytes(cols as u64).expect("checked by the recipe") as usize;
    out.clear();
    out.resize(row_bytes * job.n, 0);
    let expert = matches!(r.t.src, HfRef::Experts(..)).then_some(job.piece);
    let importance = match imatrix {
        Some(m) => m.importance(&r.t.name, expert, cols)?,
        None => None,
    };
    match r.ty {
        GgmlType::I32 => {
            let v = src.rows_i32(job.r0, job.n)?;
            for (o, x) in out.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::Mxfp4 if src.is_fp4() => {
            src.rows_mxfp4(job.r0, job.n, out).expect("fp4 source")?;
        }
        ty => {
            buf.clear();
            buf.resize(cols * job.n, 0.0);
            src.rows_f32(job.r0, buf)?;
            for (x, o) in buf.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
                quant::quantize_row(ty, x, o, importance).map_err(|e| ConvertError::Tensor {
                    file: src.weight.file(),
                    tensor: r.t.name.clone(),
                    msg: e.to_string(),
                })?;
            }
        }
    }
    let row_index = (job.piece * r.rows_per_piece + job.r0) as u64;
    let at = r.offset + row_index * row_bytes as u64;
    file.write_all_at(out, at).map_err(|e| ConvertError::Tensor {
        file: "output".into(),
        tensor: r.t.name.clone(),
        msg: format!("write of {} bytes at offset {at} failed: {e}", out.len()),
    })?;
    Ok(out.len() as u64)
}

/// The temporary name `OUT` is written under.
pub fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_os_string();
    s.push(format!(".partial-{}", std::process::id()));
    PathBuf::from(s)
}

/// Reserves `len` bytes for `file` so a disk that cannot hold the output
/// fails before any work; file systems without the call are written as
/// they come.
fn reserve(file: &File, len: u64, path: &Path) -> Result<(), ConvertError> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain system call on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 | libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(ConvertError::Output {
            file: path.display().to_string(),
            msg: format!(
                "cannot reserve {len} bytes ({:.2} GiB) for the output: {}",
                len as f64 / (1u64 << 30) as f64,
                std::io::Error::from_raw_os_error(e)
            ),
        }),
    }
}

/// Creates the temporary file, writes the header, reserves the size.
pub fn create_partial(path: &Path, header: &[u8], len: u64) -> Result<File, ConvertError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| ConvertError::Output {
            file: path.display().to_string(),
            msg: format!("cannot create: {e}"),
        })?;
    reserve(&file, len, path)?;
    file.write_all_at(header, 0).map_err(|e| ConvertError::Output {
        file: path.display().to_string(),
        msg: format!("cannot write the header: {e}"),
    })?;
    file.set_len(len).map_err(|e| ConvertError::Output {
        file: path.display().to_string(),
        msg: format!("cannot size the file: {e}"),
    })?;
    Ok(file)
}

/// Syncs and renames the finished file.
pub fn finish(file: File, partial: &Path, out: &Path) -> Result<(), ConvertError> {
    let bad = |msg: String| ConvertError::Output {
        file: partial.display().to_string(),
        msg,
    };
    file.sync_all().map_err(|e| bad(format!("cannot sync: {e}")))?;
    drop(file);
    std::fs::rename(partial, out).map_err(|e| bad(format!("cannot rename to {}: {e}", out.display())))
}

/// A progress bar over output bytes with tensors done and time left.
pub fn progress_bar(total: u64, tensors: usize, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(format!("0/{tensors} tensors"));
    pb
}

/// Converts a checkpoint (see the module doc).
pub fn convert(opts: &ConvertOptions) -> Result<ConvertReport, ConvertError> {
    let t0 = Instant::now();
    let ck = Checkpoint::open(&opts.checkpoint)?;
    let name = opts.name.clone().unwrap_or_else(|| {
        opts.checkpoint
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "DeepSeek V4".into())
    });
    let Plan {
        family,
        mut writer,
        tensors,
    } = plan(&ck, &name)?;
    let mut resolved = resolve(&ck, tensors, &opts.recipe)?;
    if let Some(m) = &opts.imatrix {
        m.check_against(resolved.iter().map(|r| (r.t.name.as_str(), r.t.ne.as_slice())))?;
        m.add_keys(&mut writer);
    }
    for r in &resolved {
        writer
            .add_tensor_hole(&r.t.name, &r.t.ne, r.ty)
            .map_err(|e| ConvertError::Internal(e.to_string()))?;
    }
    let lay = writer.layout();
    let mut jobs = Vec::new();
    for (i, r) in resolved.iter_mut().enumerate() {
        r.offset = lay.offsets[i];
        let cols = r.pieces[0].cols;
        let step = rows_per_job(cols);
        for p in 0..r.pieces.len() {
            let mut r0 = 0;
            let mut n_jobs = 0;
            while r0 < r.rows_per_piece {
                let n = step.min(r.rows_per_piece - r0);
                jobs.push(Job {
                    tensor: i,
                    piece: p,
                    r0,
                    n,
                });
                r0 += n;
                n_jobs += 1;
            }
            r.left[p].store(n_jobs, Ordering::Relaxed);
        }
    }
    let partial = partial_path(&opts.out);
    let file = create_partial(&partial, &lay.header, lay.file_len)?;
    let result = run_jobs(opts, &resolved, &jobs, &file, lay.file_len);
    let result = result.and_then(|()| finish(file, &partial, &opts.out));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(match e {
            ConvertError::Tensor { file, tensor, msg } if file == "output" => ConvertError::Tensor {
                file: partial.display().to_string(),
                tensor,
                msg,
            },
            e => e,
        });
    }
    let mut types: Vec<(GgmlType, usize)> = Vec::new();
    for r in &resolved {
        match types.iter_mut().find(|(t, _)| *t == r.ty) {
            Some((_, n)) => *n += 1,
            None => types.push((r.ty, 1)),
        }
    }
    Ok(ConvertReport {
        family,
        tensors: resolved.len(),
        bytes_in: ck.total_bytes(),
        bytes_out: lay.file_len,
        seconds: t0.elapsed().as_secs_f64(),
        types,
    })
}

fn run_jobs(
    opts: &ConvertOptions,
    resolved: &[Resolved],
    jobs: &[Job],
    file: &File,
    total: u64,
) -> Result<(), ConvertError> {
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let pb = progress_bar(total, resolved.len(), opts.progress);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<ConvertError>> = Mutex::new(None);
    let tensors_left: Vec<AtomicUsize> = resolved
        .iter()
        .map(|r| AtomicUsize::new(r.pieces.len()))
        .collect();
    let tensors_done = AtomicUsize::new(0);
    let written = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()).max(1) {
            s.spawn(|| {
                let (mut buf, mut out) = (Vec::new(), Vec::new());
                loop {
                    if failed.load(Ordering::Relaxed) {
                        return;
                    }
                    if opts.cancel.load(Ordering::Relaxed) {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().unwrap().get_or_insert(ConvertError::Interrupted);
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { return };
                    let r = &resolved[job.tensor];
                    match run_job(r, job, file, opts.imatrix.as_ref(), &mut buf, &mut out) {
                        Ok(n) => {
                            written.fetch_add(n, Ordering::Relaxed);
                            pb.inc(n);
                            if r.left[job.piece].fetch_sub(1, Ordering::AcqRel) == 1 {
                                r.pieces[job.piece].release();
                                if tensors_left[job.tensor].fetch_sub(1, Ordering::AcqRel) == 1 {
                                    let d = tensors_done.fetch_add(1, Ordering::Relaxed) + 1;
                                    pb.set_message(format!("{d}/{} tensors", resolved.len()));
                                }
                            }
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().unwrap().get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    pb.finish_and_clear();
    match first_error.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
