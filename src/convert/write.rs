//! A V4 checkpoint converted to ds4's `deepseek4` GGUF in one of ds4's
//! published mixes (`ds4-quantize --hf DIR --recipe R -o OUT.gguf`,
//! docs/TOOLS.md).
//!
//! The directory is the name map's ([`Layout`]), every source checked by
//! header first; the metadata is [`V4Config`]'s, then the tokenizer keys of
//! the checkpoint's `tokenizer.json` ([`TokenizerKeys`]); each tensor's type
//! is the one the test-model generator gives it in the [`Variant`] of the
//! recipe's name ([`testmodel::tensor_types`], the published files' types),
//! so a converted file and a generated one of the same variant have the same
//! directory. Tensors are converted one at a time in file order, each in
//! chunks of about [`CHUNK_VALUES`] decoded values, a wave of chunks in
//! parallel (rayon) and then written at their offsets: memory stays a few
//! waves of chunks whatever the checkpoint's size. The routed experts of the
//! `mxfp4` recipe are the checkpoint's FP4 codes repacked without loss
//! ([`Weight::rows_mxfp4`]); every other tensor is decoded to f32 and
//! quantized (`quant::quantize_row`); tables are I32. With an importance
//! matrix ([`Imatrix`], llama.cpp's format), every tensor quantized to a
//! type whose search uses one (IQ2_XXS, Q2_K, Q4_K) gets its entry's row,
//! per expert for the routed experts; the imatrix is checked against the
//! directory first (a tensor it names that the model lacks, or of another
//! shape, is an error) and llama-quantize's `quantize.imatrix.*` keys are
//! written.
//!
//! The output is written under a temporary name and renamed when complete
//! ([`super::output`]): any failure removes it, so nothing is ever left
//! under the final name.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::decode::{scale_name, to_i32, Weight};
use super::dspark::DsparkMeta;
use super::imatrix::{self, Imatrix};
use super::layout::{Layout, Part, Source};
use super::metadata::{model_type, EngramTables, ModelType, V41Meta, V4Config};
use super::output::{create_partial, finish, partial_path, progress_bar};
use super::recipe::Recipe;
use super::safetensors::{Checkpoint, CONFIG_FILE};
use super::tokenizer::TokenizerKeys;
use super::ConvertError;
use crate::gguf::GgufWriter;
use crate::model::Arch;
use crate::quant::{self, GgmlType};

/// Decoded values per chunk of work (4 MiB of f32).
pub const CHUNK_VALUES: usize = 1 << 20;

/// Converted chunks waiting for the writer thread, at most.
const WRITE_QUEUE: usize = 8;

/// `general.name` of a converted V4 file, as ds4's published files say.
pub const V4_NAME: &str = "DeepSeek V4 Flash";

/// `general.name` of a converted V4.1 file.
pub const V41_NAME: &str = "DeepSeek V4.1 Flash";

/// What a conversion wrote.
#[derive(Clone, Debug)]
pub struct Converted {
    pub tensors: usize,
    pub bytes: u64,
    /// With an imatrix: the tensors whose type uses one that it has no
    /// entry for (quantized without; a warning was printed for each).
    pub without_imatrix: Vec<String>,
}

/// One chunk of a tensor: rows `r0 .. r0 + n` of source `src`, written at
/// byte `at` of the tensor's data.
struct Chunk {
    src: usize,
    r0: usize,
    n: usize,
    at: u64,
}

/// What [`convert`] writes.
pub struct ConvertOptions<'a> {
    /// The tensor types.
    pub recipe: &'a Recipe,
    /// `general.name` (default [`V4_NAME`] or [`V41_NAME`]; the MTP file
    /// adds " MTP").
    pub name: Option<&'a str>,
    /// The main file, the MTP block's file or the DSpark drafter's.
    pub part: Part,
    /// Weighs the IQ2_XXS / Q2_K / Q4_K searches: its contents and the file
    /// it was read from.
    pub imatrix: Option<(&'a Imatrix, &'a Path)>,
    /// A progress bar on stderr.
    pub progress: bool,
}

/// Converts the checkpoint in `dir` to `out` as `opts` say; `cancel`
/// (Ctrl-C) stops between waves. On any error nothing is left under `out`.
pub fn convert(
    dir: &Path,
    out: &Path,
    opts: &ConvertOptions<'_>,
    cancel: &AtomicBool,
) -> Result<Converted, ConvertError> {
    let ck = Checkpoint::open(dir)?;
    let config = ck.dir().join(CONFIG_FILE);
    let (layout, mut w) = match model_type(ck.config(), &config)? {
        ModelType::V4 => v4_header(&ck, opts)?,
        ModelType::V41 => v41_header(&ck, opts)?,
    };
    layout.check(&ck)?;
    let types = opts.recipe.types(&layout)?;
    let (imatrix, without_imatrix) = check_imatrix(&layout, &types, opts.imatrix)?;

    if let Some((im, file)) = imatrix {
        for (k, v) in im.quantize_keys(&file.display().to_string()) {
            w.add_kv(&k, v);
        }
    }
    for (t, &ty) in layout.tensors.iter().zip(&types) {
        w.add_tensor_hole(&t.name, &t.ne, ty)
            .map_err(|e| out_err(out, &t.name, e.to_string()))?;
    }
    let lay = w.layout();
    let partial = partial_path(out);
    let f = create_partial(&partial, &lay.header, lay.file_len)?;
    let pb = progress_bar(lay.file_len, opts.progress);
    let n = layout.tensors.len();
    // A writer thread takes the converted chunks while the next wave is
    // computed (the page-cache copy of the output was about half of an
    // mxfp4 conversion's time when the two took turns); the channel's
    // bound keeps the memory at a few waves.
    let res = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, u64, usize)>(WRITE_QUEUE);
        let (f, partial, layout) = (&f, &partial, &layout);
        let writer = scope.spawn(move || {
            for (bytes, at, k) in rx {
                f.write_all_at(&bytes, at).map_err(|e| {
                    out_err(
                        partial,
                        &layout.tensors[k].name,
                        format!("write failed: {e}"),
                    )
                })?;
            }
            Ok::<(), ConvertError>(())
        });
        let computed = (|| {
            for (k, (t, &ty)) in layout.tensors.iter().zip(&types).enumerate() {
                pb.set_message(format!("{}/{n} {}", k + 1, t.name));
                // The next tensor's pages are read ahead while this one is
                // converted.
                // Not an Engram table (~100 GB in the release): it is read
                // chunk by chunk as it is copied, never asked for whole.
                let ahead = layout.tensors.get(k + 1);
                let ahead = ahead.filter(|t| !matches!(t.source, Source::EngramRows { .. }));
                if let Some(next) = ahead {
                    for (name, _) in next.sources() {
                        ck.prefetch(&name);
                        ck.prefetch(&scale_name(&name));
                    }
                }
                let entry = imatrix.and_then(|(im, _)| im.get(&t.name));
                let at = lay.offsets[k];
                // A closed channel means the writer stopped on an error,
                // which `join` returns below.
                let mut sink = |bytes: &[u8], off: u64| {
                    tx.send((bytes.to_vec(), at + off, k))
                        .map_err(|_| ConvertError::Interrupted)
                };
                let written = write_tensor(&ck, layout, k, ty, entry, partial, &mut sink, cancel)?;
                for (name, _) in t.sources() {
                    ck.release(&scale_name(&name));
                    ck.release(&name);
                }
                pb.inc(written);
            }
            Ok(())
        })();
        drop(tx);
        let wrote = writer
            .join()
            .unwrap_or_else(|_| Err(out_err(partial, "", "the writer thread panicked".into())));
        // The writer's error is the cause when both failed.
        wrote.and(computed)
    });
    pb.finish_and_clear();
    let res = res.and_then(|()| finish(f, &partial, out));
    if res.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    res.map(|()| Converted {
        tensors: n,
        bytes: lay.file_len,
        without_imatrix,
    })
}

/// The directory of a V4 checkpoint's file `opts.part` and its metadata:
/// the model's keys and the tokenizer's (main file), the MTP file's two
/// keys, or the drafter's keys.
fn v4_header(
    ck: &Checkpoint,
    opts: &ConvertOptions<'_>,
) -> Result<(Layout, GgufWriter), ConvertError> {
    let name = opts.name.unwrap_or(V4_NAME);
    let meta = V4Config::from_config(ck.config(), &ck.dir().join(CONFIG_FILE), name)?;
    // The drafter's keys of `config.json`, read and checked (`--dspark-only`).
    let mut dspark = None;
    let layout = match opts.part {
        Part::Main => Layout::v4(&meta.model),
        Part::Mtp => Layout::v4_mtp(&meta.model),
        Part::Dspark => {
            let file = ck.dir().join(CONFIG_FILE);
            let ds = DsparkMeta::from_config(ck.config(), &file, name, &meta.model.core, Arch::V4)?;
            let layout = Layout::v4_dspark(&meta.model, &ds.config);
            dspark = Some(ds);
            layout
        }
    };
    let mut w = GgufWriter::new();
    match opts.part {
        Part::Main => {
            meta.add_to(&mut w);
            TokenizerKeys::read(ck.dir(), meta.model.n_vocab)?.add_to(&mut w);
        }
        // Like the published MTP file: the architecture and a name, no
        // model keys (ds4 reads none from it, GGUF.md §7) and no tokenizer.
        Part::Mtp => {
            w.add_str("general.architecture", "deepseek4");
            w.add_str("general.name", &format!("{name} MTP"));
        }
        // The `dspark.*` keys the loader reads (docs/SPECULATIVE.md); no
        // model keys and no tokenizer, as for MTP.
        Part::Dspark => {
            if let Some(ds) = &dspark {
                ds.add_to(&mut w);
            }
        }
    }
    Ok((layout, w))
}

/// The `deepseek41` directory of a V4.1 checkpoint and its metadata: the
/// model's keys with the Engram layout (the token map and multipliers from
/// the checkpoint's [`EngramTables::FILE`]) and the tokenizer's. Only the
/// main file: V4.1's drafter is not converted yet.
fn v41_header(
    ck: &Checkpoint,
    opts: &ConvertOptions<'_>,
) -> Result<(Layout, GgufWriter), ConvertError> {
    let config = ck.dir().join(CONFIG_FILE);
    let name = opts.name.unwrap_or(V41_NAME);
    match opts.part {
        Part::Main => {}
        Part::Mtp => {
            return Err(ConvertError::Input {
                file: config.display().to_string(),
                msg: "a DeepSeek V4.1 checkpoint has no MTP block: its mtp.* tensors \
                      are the DSpark drafter's stages (--dspark-only)"
                    .into(),
            })
        }
        Part::Dspark => return v41_dspark_header(ck, &config, name),
    }
    let tables_file = ck.dir().join(EngramTables::FILE);
    let tables = EngramTables::read(&tables_file)?;
    let meta = V41Meta::from_config(ck.config(), &config, name, Some((&tables, &tables_file)))?;
    let mut w = GgufWriter::new();
    meta.add_to(&mut w);
    TokenizerKeys::read(ck.dir(), meta.config.n_vocab)?.add_to(&mut w);
    Ok((Layout::v41(&meta.config, &meta.spec), w))
}

/// The V4.1 drafter's directory (`deepseek41-dspark`) and `dspark.*` keys
/// (`--dspark-only`): its keys are read with `text_config`'s, against the
/// model's configuration (the Engram tables are not needed).
fn v41_dspark_header(
    ck: &Checkpoint,
    config: &Path,
    name: &str,
) -> Result<(Layout, GgufWriter), ConvertError> {
    let meta = V41Meta::from_config(ck.config(), config, name, None)?;
    // `text_config`, with any `dspark_*` key found beside it (where the
    // release puts them is not known here; `text_config`'s own win).
    let json = ck.config();
    let mut text = json
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(json)
        .clone();
    if let (Some(t), Some(top)) = (text.as_object_mut(), json.as_object()) {
        for (k, v) in top.iter().filter(|(k, _)| k.starts_with("dspark_")) {
            t.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let ds = DsparkMeta::from_config(&text, config, name, &meta.config.core, Arch::V41)?;
    let mut w = GgufWriter::new();
    ds.add_to(&mut w);
    Ok((Layout::v41_dspark(&meta.config, &meta.spec, &ds.config), w))
}

/// Tensor `name` of `layout` converted from `ck` to `ty` in memory, as the
/// converter writes it (with `entry`'s importance rows when `ty` uses
/// them): tools and tests that look at one tensor without writing a file.
pub fn convert_tensor(
    ck: &Checkpoint,
    layout: &Layout,
    name: &str,
    ty: GgmlType,
    entry: Option<&imatrix::Entry>,
) -> Result<Vec<u8>, ConvertError> {
    let k = layout
        .tensors
        .iter()
        .position(|t| t.name == name)
        .ok_or_else(|| ConvertError::Usage(format!("{name}: not a tensor of this model")))?;
    let mut buf = Vec::new();
    let mut sink = |bytes: &[u8], off: u64| {
        let end = off as usize + bytes.len();
        if buf.len() < end {
            buf.resize(end, 0);
        }
        buf[off as usize..end].copy_from_slice(bytes);
        Ok(())
    };
    let cancel = AtomicBool::new(false);
    let path = Path::new("<memory>");
    write_tensor(ck, layout, k, ty, entry, path, &mut sink, &cancel)?;
    Ok(buf)
}

/// Checks `imatrix` against the directory (every entry a tensor of the
/// model, of its shape) and warns on stderr for each tensor whose type uses
/// an imatrix but has no entry (it is quantized without, docs/TOOLS.md).
/// Returns the imatrix to use, `None` when no tensor of the recipe uses one
/// (a note says it is ignored), and the tensors without an entry.
#[allow(clippy::type_complexity)]
fn check_imatrix<'a>(
    layout: &Layout,
    types: &[GgmlType],
    imatrix: Option<(&'a Imatrix, &'a Path)>,
) -> Result<(Option<(&'a Imatrix, &'a Path)>, Vec<String>), ConvertError> {
    let Some((im, file)) = imatrix else {
        return Ok((None, Vec::new()));
    };
    im.check(layout, file)?;
    let users: Vec<&str> = layout
        .tensors
        .iter()
        .zip(types)
        .filter(|(_, &ty)| imatrix::uses_importance(ty))
        .map(|(t, _)| t.name.as_str())
        .collect();
    if users.is_empty() {
        eprintln!(
            "ds4-quantize: note: {}: ignored, no tensor of this recipe is IQ2_XXS, Q2_K or Q4_K",
            file.display()
        );
        return Ok((None, Vec::new()));
    }
    let missing: Vec<String> = users
        .into_iter()
        .filter(|n| im.get(n).is_none())
        .map(str::to_string)
        .collect();
    for n in &missing {
        eprintln!(
            "ds4-quantize: warning: {}: no entry for {n}; it is quantized without an imatrix",
            file.display()
        );
    }
    // Experts no calibration token reached: uniform weights, as
    // llama-quantize gives them.
    let (mut empty, mut tensors) = (0, 0);
    for t in layout.tensors.iter().zip(types) {
        if let Some(e) = im.get(&t.0.name).filter(|_| imatrix::uses_importance(*t.1)) {
            empty += e.empty_matrices();
            tensors += (e.empty_matrices() > 0) as usize;
        }
    }
    if empty > 0 {
        eprintln!(
            "ds4-quantize: note: {}: {empty} matrices of {tensors} tensors have no data \
             (count 0); they are quantized with uniform weights",
            file.display()
        );
    }
    Ok((Some((im, file)), missing))
}

fn out_err(file: &Path, tensor: &str, msg: String) -> ConvertError {
    ConvertError::Tensor {
        file: file.display().to_string(),
        tensor: tensor.to_string(),
        msg,
    }
}

/// Where a tensor's bytes go: (bytes, offset in the tensor), in order.
type Sink<'a> = dyn FnMut(&[u8], u64) -> Result<(), ConvertError> + 'a;

/// Converts tensor `k` of `layout` to `ty` (quantized with `entry`'s
/// importance rows when given and `ty` uses them) and hands its bytes to
/// `write` (bytes, offset in the tensor), in order; `path` names the
/// output in errors. Returns the tensor's size in bytes.
#[allow(clippy::too_many_arguments)]
fn write_tensor(
    ck: &Checkpoint,
    layout: &Layout,
    k: usize,
    ty: GgmlType,
    entry: Option<&imatrix::Entry>,
    path: &Path,
    write: &mut Sink,
    cancel: &AtomicBool,
) -> Result<u64, ConvertError> {
    let t = &layout.tensors[k];
    let srcs: Vec<Weight> = match &t.source {
        Source::Table(name) => {
            if ty != GgmlType::I32 {
                return Err(out_err(path, &t.name, format!("a table cannot be {ty}")));
            }
            let v = to_i32(&ck.tensor(name)?)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            write(&bytes, 0)?;
            return Ok(bytes.len() as u64);
        }
        Source::EngramRows { name, head_dim } => {
            if ty != GgmlType::I8 {
                let msg = format!("an Engram table is copied as I8 rows, not {ty}");
                return Err(out_err(path, &t.name, msg));
            }
            return copy_engram_rows(ck, name, *head_dim as usize, write, cancel);
        }
        Source::One(_) | Source::Experts { .. } => t
            .sources()
            .iter()
            .map(|(name, _)| Weight::open(ck, name))
            .collect::<Result<_, _>>()?,
    };
    let ne0 = t.ne[0] as usize;
    let row_bytes = ty.row_bytes(t.ne[0]).ok_or_else(|| {
        out_err(
            path,
            &t.name,
            format!("rows of {ne0} are not whole {ty} blocks"),
        )
    })?;
    // The chunks, source by source (expert X is rows X·rows.. of the tensor).
    let per = (CHUNK_VALUES / ne0.max(1)).max(1);
    let mut chunks = Vec::new();
    let mut row = 0u64;
    for (s, w) in srcs.iter().enumerate() {
        if w.cols != ne0 {
            return Err(w
                .tensor
                .error(format!("rows of {} values, {} needs {ne0}", w.cols, t.name)));
        }
        for r0 in (0..w.rows).step_by(per) {
            let n = per.min(w.rows - r0);
            chunks.push(Chunk {
                src: s,
                r0,
                n,
                at: (row + r0 as u64) * row_bytes,
            });
        }
        row += w.rows as u64;
    }
    let total = row * row_bytes;
    // The importance row of each source (expert X: matrix X of the entry).
    let importance: Vec<Option<Vec<f32>>> = match entry {
        Some(e) if imatrix::uses_importance(ty) => {
            let (ne0, n_mat) = imatrix::tensor_matrices(&t.ne);
            e.fits(ne0, n_mat)
                .map_err(|m| out_err(path, &t.name, format!("imatrix: {m}")))?;
            (0..srcs.len())
                .map(|s| Some(e.importance(ne0, s.min(n_mat.saturating_sub(1)))))
                .collect()
        }
        _ => vec![None; srcs.len()],
    };
    let wave = 2 * rayon::current_num_threads();
    for group in chunks.chunks(wave) {
        if cancel.load(Ordering::Relaxed) {
            return Err(ConvertError::Interrupted);
        }
        let done: Vec<Vec<u8>> = group
            .par_iter()
            .map(|c| {
                let imp = importance[c.src].as_deref();
                convert_chunk(&srcs[c.src], c, ty, row_bytes as usize, imp)
            })
            .collect::<Result<_, String>>()
            .map_err(|e| out_err(path, &t.name, e))?;
        for (c, bytes) in group.iter().zip(&done) {
            write(bytes, c.at)?;
        }
    }
    Ok(total)
}

/// V4.1's Engram table `name` (E4M3 rows of `head_dim` codes, E8M0
/// `.scale` rows of `head_dim / 32` bytes) handed to `write` as ds4's rows:
/// each row's codes then its scale bytes, bytes unchanged. A chunk of about
/// 4 MiB of rows at a time, whose source pages are released once written:
/// a real table is about 100 GB, never resident at once.
fn copy_engram_rows(
    ck: &Checkpoint,
    name: &str,
    head_dim: usize,
    write: &mut Sink,
    cancel: &AtomicBool,
) -> Result<u64, ConvertError> {
    let sname = scale_name(name);
    let (codes, scales) = (ck.tensor(name)?, ck.tensor(&sname)?);
    let per_row = head_dim / 32;
    let row_bytes = head_dim + per_row;
    let rows = codes.bytes.len() / head_dim.max(1);
    let chunk = (4 * CHUNK_VALUES / row_bytes).max(1);
    let mut buf = Vec::with_capacity(chunk * row_bytes);
    for r0 in (0..rows).step_by(chunk) {
        if cancel.load(Ordering::Relaxed) {
            return Err(ConvertError::Interrupted);
        }
        let n = chunk.min(rows - r0);
        buf.clear();
        let c = &codes.bytes[r0 * head_dim..(r0 + n) * head_dim];
        let s = &scales.bytes[r0 * per_row..(r0 + n) * per_row];
        for (c, s) in c.chunks_exact(head_dim).zip(s.chunks_exact(per_row)) {
            buf.extend_from_slice(c);
            buf.extend_from_slice(s);
        }
        write(&buf, (r0 * row_bytes) as u64)?;
        ck.release_range(name, r0 * head_dim..(r0 + n) * head_dim);
        ck.release_range(&sname, r0 * per_row..(r0 + n) * per_row);
    }
    Ok((rows * row_bytes) as u64)
}

/// One chunk's bytes in `ty`: FP4 sources repacked to MXFP4 as they are,
/// anything else decoded to f32 and quantized row by row (with `importance`,
/// one weight per column, when given).
fn convert_chunk(
    w: &Weight,
    c: &Chunk,
    ty: GgmlType,
    row_bytes: usize,
    importance: Option<&[f32]>,
) -> Result<Vec<u8>, String> {
    if ty == GgmlType::Mxfp4 && w.is_fp4() {
        let blocks = w.rows_mxfp4(c.r0, c.n).map_err(|e| e.to_string())?;
        return Ok(bytemuck::cast_slice(&blocks).to_vec());
    }
    let mut vals = vec![0f32; c.n * w.cols];
    w.rows_f32(c.r0, &mut vals);
    let mut out = vec![0u8; c.n * row_bytes];
    for (src, dst) in vals
        .chunks_exact(w.cols)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        quant::quantize_row(ty, src, dst, importance).map_err(|e| e.to_string())?;
    }
    Ok(out)
}
