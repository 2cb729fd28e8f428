//! A V4 checkpoint converted to ds4's `deepseek4` GGUF in one of ds4's
//! published mixes (`ds4-quantize --hf DIR --recipe R -o OUT.gguf`,
//! docs/TOOLS.md).
//!
//! The directory is the name map's ([`Layout`]), every source checked by
//! header first; the metadata is [`V4Config`]'s; each tensor's type is the
//! one the test-model generator gives it in the [`Variant`] of the recipe's
//! name ([`testmodel::tensor_types`], the published files' types), so a
//! converted file and a generated one of the same variant have the same
//! directory. Tensors are converted one at a time in file order, each in
//! chunks of about [`CHUNK_VALUES`] decoded values, a wave of chunks in
//! parallel (rayon) and then written at their offsets: memory stays a few
//! waves of chunks whatever the checkpoint's size. The routed experts of
//! the `mxfp4` recipe are the checkpoint's FP4 codes repacked without loss
//! ([`Weight::rows_mxfp4`]); every other tensor is decoded to f32 and
//! quantized (`quant::quantize_row`, no importance matrix); tables are I32.
//!
//! The output is written under a temporary name and renamed when complete
//! ([`super::output`]): any failure removes it, so nothing is ever left
//! under the final name.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::decode::{to_i32, Weight};
use super::layout::{Layout, Source};
use super::metadata::V4Config;
use super::output::{create_partial, finish, partial_path, progress_bar};
use super::safetensors::{Checkpoint, CONFIG_FILE};
use super::ConvertError;
use crate::gguf::GgufWriter;
use crate::quant::{self, GgmlType};
use crate::testmodel::{self, TestModelSpec, Variant};

/// Decoded values per chunk of work (4 MiB of f32).
pub const CHUNK_VALUES: usize = 1 << 20;

/// What a conversion wrote.
#[derive(Clone, Debug)]
pub struct Converted {
    pub tensors: usize,
    pub bytes: u64,
}

/// One chunk of a tensor: rows `r0 .. r0 + n` of source `src`, written at
/// byte `at` of the tensor's data.
struct Chunk {
    src: usize,
    r0: usize,
    n: usize,
    at: u64,
}

/// Converts the checkpoint in `dir` to `out` with `variant`'s types
/// (`general.name` = `name`). `progress` shows a bar on stderr; `cancel`
/// (Ctrl-C) stops between waves. On any error nothing is left under `out`.
pub fn convert(
    dir: &Path,
    out: &Path,
    variant: Variant,
    name: &str,
    progress: bool,
    cancel: &AtomicBool,
) -> Result<Converted, ConvertError> {
    let ck = Checkpoint::open(dir)?;
    let meta = V4Config::from_config(ck.config(), &ck.dir().join(CONFIG_FILE), name)?;
    let layout = Layout::v4(&meta.model);
    layout.check(&ck)?;
    let types = tensor_types(&layout, variant)?;

    let mut w = GgufWriter::new();
    meta.add_to(&mut w);
    for (t, &ty) in layout.tensors.iter().zip(&types) {
        w.add_tensor_hole(&t.name, &t.ne, ty)
            .map_err(|e| out_err(out, &t.name, e.to_string()))?;
    }
    let lay = w.layout();
    let partial = partial_path(out);
    let f = create_partial(&partial, &lay.header, lay.file_len)?;
    let pb = progress_bar(lay.file_len, progress);
    let n = layout.tensors.len();
    let res = (|| {
        for (k, (t, &ty)) in layout.tensors.iter().zip(&types).enumerate() {
            pb.set_message(format!("{}/{n} {}", k + 1, t.name));
            let written = write_tensor(&ck, &layout, k, ty, &f, &partial, lay.offsets[k], cancel)?;
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
    })
}

/// The type of every tensor of `layout` in `variant`: the test-model
/// generator's plan for the same shapes, which must have the same names
/// and shapes in the same order.
pub fn tensor_types(layout: &Layout, variant: Variant) -> Result<Vec<GgmlType>, ConvertError> {
    let spec = TestModelSpec::from_config(&layout.config);
    let plan = testmodel::tensor_types(&spec, variant, layout.config.n_vocab);
    if plan.len() != layout.tensors.len() {
        return Err(ConvertError::Usage(format!(
            "internal: the {} plan has {} tensors, the name map {}",
            variant.name(),
            plan.len(),
            layout.tensors.len()
        )));
    }
    layout
        .tensors
        .iter()
        .zip(plan)
        .map(|(t, (pname, pne, ty))| {
            if pname != t.name || pne != t.ne {
                return Err(ConvertError::Usage(format!(
                    "internal: the {} plan has {pname} {pne:?} where the name map has {} {:?}",
                    variant.name(),
                    t.name,
                    t.ne
                )));
            }
            Ok(ty)
        })
        .collect()
}

fn out_err(file: &Path, tensor: &str, msg: String) -> ConvertError {
    ConvertError::Tensor {
        file: file.display().to_string(),
        tensor: tensor.to_string(),
        msg,
    }
}

/// Converts tensor `k` of `layout` to `ty` and writes it at `at` of `f`
/// (named `path`); returns its size in bytes.
#[allow(clippy::too_many_arguments)]
fn write_tensor(
    ck: &Checkpoint,
    layout: &Layout,
    k: usize,
    ty: GgmlType,
    f: &std::fs::File,
    path: &Path,
    at: u64,
    cancel: &AtomicBool,
) -> Result<u64, ConvertError> {
    let t = &layout.tensors[k];
    let write = |bytes: &[u8], off: u64| {
        f.write_all_at(bytes, at + off)
            .map_err(|e| out_err(path, &t.name, format!("write failed: {e}")))
    };
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
    let wave = 2 * rayon::current_num_threads();
    for group in chunks.chunks(wave) {
        if cancel.load(Ordering::Relaxed) {
            return Err(ConvertError::Interrupted);
        }
        let done: Vec<Vec<u8>> = group
            .par_iter()
            .map(|c| convert_chunk(&srcs[c.src], c, ty, row_bytes as usize))
            .collect::<Result<_, String>>()
            .map_err(|e| out_err(path, &t.name, e))?;
        for (c, bytes) in group.iter().zip(&done) {
            write(bytes, c.at)?;
        }
    }
    Ok(total)
}

/// One chunk's bytes in `ty`: FP4 sources repacked to MXFP4 as they are,
/// anything else decoded to f32 and quantized row by row.
fn convert_chunk(w: &Weight, c: &Chunk, ty: GgmlType, row_bytes: usize) -> Result<Vec<u8>, String> {
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
        quant::quantize_row(ty, src, dst, None).map_err(|e| e.to_string())?;
    }
    Ok(out)
}
