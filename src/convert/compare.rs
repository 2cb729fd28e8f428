//! Two GGUFs of the same model side by side: per-tensor errors
//! (`--compare`), and a file made of one's tensors with some taken from the
//! other (`--splice`, ds4's mixed files).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::output::{create_partial, finish, glob, partial_path, progress_bar};
use super::ConvertError;
use crate::gguf::{GgufFile, GgufWriter, Tensor};
use crate::quant::{self, GgmlType};

/// One tensor's difference.
#[derive(Clone, Debug)]
pub struct TensorDiff {
    pub name: String,
    pub ty_a: GgmlType,
    pub ty_b: GgmlType,
    /// Root mean square of `a − b`.
    pub rmse: f64,
    /// Largest `|a − b|`.
    pub max_err: f64,
    /// Root mean square of `a` (to read `rmse` against).
    pub rms_a: f64,
}

fn open(p: &Path) -> Result<GgufFile, ConvertError> {
    GgufFile::open(p).map_err(|e| ConvertError::Input {
        file: p.display().to_string(),
        msg: e.to_string(),
    })
}

/// Values of a tensor's row `r` as f64 (integer tables widened).
fn row_f64(t: &Tensor, r: usize, buf: &mut Vec<f32>) -> Option<Vec<f64>> {
    let bytes = t.row(r)?;
    let n = t.ne[0] as usize;
    match t.ty {
        GgmlType::I32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
        ),
        GgmlType::I8 => Some(bytes.iter().map(|&b| b as i8 as f64).collect()),
        ty => {
            buf.resize(n, 0.0);
            quant::dequantize_row(ty, bytes, buf).ok()?;
            Some(buf.iter().map(|&v| v as f64).collect())
        }
    }
}

/// Compares every tensor the two files share (same name and shape);
/// returns the differences and the names found in only one file or with
/// different shapes.
pub fn compare(a: &GgufFile, b: &GgufFile) -> Result<(Vec<TensorDiff>, Vec<String>), ConvertError> {
    let mut diffs = Vec::new();
    let mut other = Vec::new();
    let err = |f: &GgufFile, e: crate::gguf::GgufError| ConvertError::Input {
        file: f.path().display().to_string(),
        msg: e.to_string(),
    };
    for info in a.tensor_infos() {
        let Some(ib) = b.tensor_info(&info.name) else {
            other.push(format!("{} only in {}", info.name, a.path().display()));
            continue;
        };
        if ib.ne != info.ne {
            other.push(format!(
                "{}: shapes {:?} and {:?}",
                info.name, info.ne, ib.ne
            ));
            continue;
        }
        let ta = a.view(info).map_err(|e| err(a, e))?;
        let tb = b.view(ib).map_err(|e| err(b, e))?;
        let (mut sse, mut ssa, mut max) = (0f64, 0f64, 0f64);
        let (mut ba, mut bb) = (Vec::new(), Vec::new());
        let rows = ta.n_rows() as usize;
        for r in 0..rows {
            let (Some(x), Some(y)) = (row_f64(&ta, r, &mut ba), row_f64(&tb, r, &mut bb)) else {
                other.push(format!(
                    "{}: type {} or {} cannot be decoded",
                    info.name, ta.ty, tb.ty
                ));
                break;
            };
            for (p, q) in x.iter().zip(&y) {
                let d = p - q;
                sse += d * d;
                ssa += p * p;
                max = max.max(d.abs());
            }
        }
        let n = ta.n_elements() as f64;
        diffs.push(TensorDiff {
            name: info.name.clone(),
            ty_a: ta.ty,
            ty_b: tb.ty,
            rmse: (sse / n).sqrt(),
            max_err: max,
            rms_a: (ssa / n).sqrt(),
        });
    }
    for info in b.tensor_infos() {
        if a.tensor_info(&info.name).is_none() {
            other.push(format!("{} only in {}", info.name, b.path().display()));
        }
    }
    Ok((diffs, other))
}

/// `--compare A B`: one line per shared tensor, then the totals.
pub fn print_compare(pa: &Path, pb: &Path) -> Result<(), ConvertError> {
    let (a, b) = (open(pa)?, open(pb)?);
    let (diffs, other) = compare(&a, &b)?;
    println!(
        "{:<44} {:>8} {:>8} {:>12} {:>12} {:>10}",
        "tensor", "A", "B", "rmse", "max err", "rmse/rms"
    );
    let (mut worst, mut identical) = (0f64, 0usize);
    for d in &diffs {
        let rel = if d.rms_a > 0.0 { d.rmse / d.rms_a } else { 0.0 };
        worst = worst.max(rel);
        identical += (d.max_err == 0.0) as usize;
        println!(
            "{:<44} {:>8} {:>8} {:>12.4e} {:>12.4e} {:>10.3e}",
            d.name,
            d.ty_a.name(),
            d.ty_b.name(),
            d.rmse,
            d.max_err,
            rel
        );
    }
    for o in &other {
        println!("{o}");
    }
    println!(
        "{} tensors compared, {identical} identical, worst rmse/rms {worst:.3e}; {} not comparable",
        diffs.len(),
        other.len()
    );
    Ok(())
}

/// `--splice BASE OTHER --take P…`: BASE's metadata and tensors, with each
/// tensor matching a pattern taken from OTHER (which must have it with the
/// same shape). Written under a temporary name and renamed; returns how many
/// tensors came from OTHER.
pub fn splice(
    pbase: &Path,
    pother: &Path,
    take: &[String],
    out: &Path,
    progress: bool,
    cancel: &AtomicBool,
) -> Result<usize, ConvertError> {
    let (base, other) = (open(pbase)?, open(pother)?);
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        w.add_kv(k, v.clone());
    }
    let mut srcs = Vec::new();
    let mut used = vec![false; take.len()];
    for info in base.tensor_infos() {
        let hit = take.iter().position(|p| glob(p, &info.name));
        let (file, i) = match hit {
            Some(k) => {
                used[k] = true;
                let io = other
                    .tensor_info(&info.name)
                    .ok_or_else(|| ConvertError::Tensor {
                        file: pother.display().to_string(),
                        tensor: info.name.clone(),
                        msg: "missing (the files must be of the same model)".into(),
                    })?;
                if io.ne != info.ne {
                    return Err(ConvertError::Tensor {
                        file: pother.display().to_string(),
                        tensor: info.name.clone(),
                        msg: format!("shape {:?}, {:?} in {}", io.ne, info.ne, pbase.display()),
                    });
                }
                (&other, io)
            }
            None => (&base, info),
        };
        let ty = file
            .view(i)
            .map_err(|e| ConvertError::Input {
                file: file.path().display().to_string(),
                msg: e.to_string(),
            })?
            .ty;
        w.add_tensor_hole(&info.name, &info.ne, ty)
            .map_err(|e| ConvertError::Tensor {
                file: pbase.display().to_string(),
                tensor: info.name.clone(),
                msg: e.to_string(),
            })?;
        srcs.push((file, i));
    }
    if let Some(k) = used.iter().position(|u| !u) {
        return Err(ConvertError::Usage(format!(
            "--take {:?} matches no tensor of {}",
            take[k],
            pbase.display()
        )));
    }
    let lay = w.layout();
    let partial = partial_path(out);
    let f = create_partial(&partial, &lay.header, lay.file_len)?;
    let pb = progress_bar(lay.file_len, progress);
    let res = (|| {
        use std::os::unix::fs::FileExt;
        for (k, (file, i)) in srcs.iter().enumerate() {
            let t = file.view(i).map_err(|e| ConvertError::Input {
                file: file.path().display().to_string(),
                msg: e.to_string(),
            })?;
            for (c, chunk) in t.data.chunks(64 << 20).enumerate() {
                if cancel.load(Ordering::Relaxed) {
                    return Err(ConvertError::Interrupted);
                }
                let at = lay.offsets[k] + (c as u64) * (64 << 20);
                f.write_all_at(chunk, at)
                    .map_err(|e| ConvertError::Tensor {
                        file: partial.display().to_string(),
                        tensor: i.name.clone(),
                        msg: format!("write failed: {e}"),
                    })?;
                pb.inc(chunk.len() as u64);
            }
        }
        Ok(())
    })();
    pb.finish_and_clear();
    let res = res.and_then(|()| finish(f, &partial, out));
    if res.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    res.map(|()| {
        srcs.iter()
            .filter(|(f, _)| std::ptr::eq(*f, &other))
            .count()
    })
}
