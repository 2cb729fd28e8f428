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
use super::imatrix::{self, Imatrix};
use super::layout::{Layout, Part, Source};
use super::metadata::V4Config;
use super::output::{create_partial, finish, partial_path, progress_bar};
use super::recipe::Recipe;
use super::safetensors::{Checkpoint, CONFIG_FILE};
use super::tokenizer::TokenizerKeys;
use super::ConvertError;
use crate::gguf::GgufWriter;
use crate::quant::{self, GgmlType};

/// Decoded values per chunk of work (4 MiB of f32).
pub const CHUNK_VALUES: usize = 1 << 20;

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
    /// `general.name`.
    pub name: &'a str,
    /// The main file, or the MTP block's file.
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
    let meta = V4Config::from_config(ck.config(), &ck.dir().join(CONFIG_FILE), opts.name)?;
    let layout = match opts.part {
        Part::Main => Layout::v4(&meta.model),
        Part::Mtp => Layout::v4_mtp(&meta.model),
    };
    layout.check(&ck)?;
    let types = opts.recipe.types(&layout)?;
    let (imatrix, without_imatrix) = check_imatrix(&layout, &types, opts.imatrix)?;

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
            w.add_str("general.name", &format!("{} MTP", opts.name));
        }
    }
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
    let res = (|| {
        for (k, (t, &ty)) in layout.tensors.iter().zip(&types).enumerate() {
            pb.set_message(format!("{}/{n} {}", k + 1, t.name));
            let entry = imatrix.and_then(|(im, _)| im.get(&t.name));
            let at = lay.offsets[k];
            let mut sink = |bytes: &[u8], off: u64| {
                f.write_all_at(bytes, at + off)
                    .map_err(|e| out_err(&partial, &t.name, format!("write failed: {e}")))
            };
            let written = write_tensor(&ck, &layout, k, ty, entry, &partial, &mut sink, cancel)?;
            for (name, _) in t.sources() {
                ck.release(&scale_name(&name));
                ck.release(&name);
            }
            pb.inc(written);
        }
        Ok(())
    })();
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
