//! Importance matrices in llama.cpp's formats (`ds4-quantize --imatrix`,
//! docs/TOOLS.md).
//!
//! An imatrix holds, for every weight matrix `W` (GGUF `ne` `[n_cols,
//! n_rows(, n_mat)]`) that a calibration run multiplied activations `x`
//! with, the sum over all activation rows of `x_j²` per input column `j`,
//! per matrix (one matrix per routed expert of a 3-D expert tensor), and how
//! many activation rows were summed per matrix. The quantizers weigh the
//! squared error of column `j` by the mean `Σx_j² / count`.
//!
//! The GGUF format, as llama.cpp's `llama-imatrix` writes it by default
//! (tools/imatrix/imatrix.cpp, `IMatrixCollector::save_imatrix`):
//!
//! * `general.type` = `"imatrix"` (string), `imatrix.datasets` (array of
//!   strings: the calibration files), `imatrix.chunk_count` (u32: chunks
//!   processed), `imatrix.chunk_size` (u32: tokens per chunk);
//! * per weight tensor `NAME`, in name order: `NAME.in_sum2`, F32 `ne`
//!   `[n_cols, n_mat]` (Σx² per column, matrix after matrix), then
//!   `NAME.counts`, F32 `ne` `[1, n_mat]` (activation rows per matrix).
//!
//! llama-quantize (tools/quantize/quantize.cpp, `load_imatrix`) requires
//! the three `imatrix.*` keys, ignores tensors of other suffixes, refuses a
//! `.in_sum2` without its `.counts` (or the reverse), and uses for matrix
//! `e` the row `in_sum2[:, e] / counts[e]`, or all ones where `counts[e]`
//! is 0 (an expert no calibration token was routed to). Its check against
//! the model (src/llama-quant.cpp, `llama_model_quantize_impl`) is on the
//! total size, `n_cols · n_mat = ne0 · ne2`; we also require the per-matrix
//! shape where the file gives one (several counts).
//!
//! The legacy format (`--output-format dat`; `save_imatrix_legacy`, read by
//! quantize.cpp's `load_legacy_imatrix`) is read too: an i32 entry count,
//! then per entry an i32 name length, the name, an i32 `ncall`, an i32
//! value count and the values (mean x² × `ncall`, one count for all
//! experts), then optionally an i32 chunk count, an i32 length and the
//! dataset name. Its importance is `value / ncall` (`ncall` > 0). Only
//! the GGUF format is written.

use std::collections::BTreeMap;
use std::path::Path;

use super::layout::Layout;
use super::output::partial_path;
use super::ConvertError;
use crate::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use crate::quant::GgmlType;

/// `general.type` of an imatrix file, and its value.
pub const KEY_TYPE: &str = "general.type";
pub const TYPE_IMATRIX: &str = "imatrix";
/// The imatrix file's keys (imatrix.cpp `LLM_KV_IMATRIX_*`; gguf-py
/// `Keys.IMatrix`).
pub const KEY_DATASETS: &str = "imatrix.datasets";
pub const KEY_CHUNK_COUNT: &str = "imatrix.chunk_count";
pub const KEY_CHUNK_SIZE: &str = "imatrix.chunk_size";
/// Tensor name suffixes of one entry.
pub const SUFFIX_SUMS: &str = ".in_sum2";
pub const SUFFIX_COUNTS: &str = ".counts";
/// The keys llama-quantize adds to a model quantized with an imatrix
/// (quantize.cpp `LLM_KV_QUANTIZE_IMATRIX_*`): the file and first dataset
/// as strings (at most 127 bytes, its `strncpy`), the entry and chunk
/// counts as u32 (llama-quant.cpp writes integer overrides with
/// `gguf_set_val_u32`); the chunk count only when it is above 0.
pub const KEY_QUANTIZE_FILE: &str = "quantize.imatrix.file";
pub const KEY_QUANTIZE_DATASET: &str = "quantize.imatrix.dataset";
pub const KEY_QUANTIZE_ENTRIES: &str = "quantize.imatrix.entries_count";
pub const KEY_QUANTIZE_CHUNKS: &str = "quantize.imatrix.chunks_count";

/// Which format a file was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    Legacy,
}

/// One weight tensor's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Columns per matrix (`in_sum2`'s `ne0`; a legacy entry's value count).
    pub n_cols: usize,
    /// Σx² per column, matrix after matrix (`n_cols · counts.len()` values).
    pub in_sum2: Vec<f32>,
    /// Activation rows per matrix; one value for all matrices when the file
    /// has one (a dense tensor, or any legacy entry).
    pub counts: Vec<f32>,
}

impl Entry {
    /// An entry of `n_mat` matrices of `n_cols` columns.
    pub fn new(n_cols: usize, in_sum2: Vec<f32>, counts: Vec<f32>) -> Entry {
        Entry {
            n_cols,
            in_sum2,
            counts,
        }
    }

    /// Matrices the file gives counts for.
    pub fn n_mat(&self) -> usize {
        self.counts.len()
    }

    /// `Ok` when this entry can serve a tensor of `n_mat` matrices of
    /// `ne0` columns; else what disagrees.
    pub fn fits(&self, ne0: usize, n_mat: usize) -> Result<(), String> {
        let ok = if self.counts.len() > 1 {
            self.n_cols == ne0 && self.counts.len() == n_mat
        } else {
            Some(self.in_sum2.len()) == ne0.checked_mul(n_mat)
        };
        if ok {
            return Ok(());
        }
        Err(format!(
            "the imatrix has {} sums ({} columns, {} count{}), the model's tensor {ne0} columns \
             × {n_mat} matri{} (an imatrix made for another model?)",
            self.in_sum2.len(),
            self.n_cols,
            self.counts.len(),
            if self.counts.len() == 1 { "" } else { "s" },
            if n_mat == 1 { "x" } else { "ces" },
        ))
    }

    /// The importance of matrix `e` of a tensor with `ne0` columns (the
    /// entry must [`fit`](Entry::fits) it): `in_sum2[:, e] / counts[e]`,
    /// all ones where the count is 0, as llama-quantize reads it.
    pub fn importance(&self, ne0: usize, e: usize) -> Vec<f32> {
        let n = self.in_sum2.len() / ne0.max(1);
        let count = if self.counts.len() == n {
            self.counts.get(e)
        } else {
            self.counts.first()
        };
        let sums = e
            .checked_mul(ne0)
            .and_then(|a| self.in_sum2.get(a..a.checked_add(ne0)?));
        match (sums, count) {
            (Some(sums), Some(&c)) if c > 0.0 => sums.iter().map(|&s| s / c).collect(),
            _ => vec![1.0; ne0],
        }
    }

    /// Matrices of this entry without data (count 0).
    pub fn empty_matrices(&self) -> usize {
        self.counts.iter().filter(|&&c| c <= 0.0).count()
    }
}

/// An importance matrix file's contents.
#[derive(Clone, Debug, PartialEq)]
pub struct Imatrix {
    pub format: Format,
    /// The calibration files (`imatrix.datasets`; a legacy file's one name).
    pub datasets: Vec<String>,
    /// Chunks processed (`imatrix.chunk_count`; a legacy file's trailer, or 0).
    pub chunk_count: u32,
    /// Tokens per chunk (`imatrix.chunk_size`; 0 for a legacy file, which
    /// does not store it).
    pub chunk_size: u32,
    /// The entries by weight tensor name.
    pub entries: BTreeMap<String, Entry>,
}

fn bad(file: &str, msg: impl Into<String>) -> ConvertError {
    ConvertError::Input {
        file: file.to_string(),
        msg: msg.into(),
    }
}

fn bad_tensor(file: &str, tensor: &str, msg: impl Into<String>) -> ConvertError {
    ConvertError::Tensor {
        file: file.to_string(),
        tensor: tensor.to_string(),
        msg: msg.into(),
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Imatrix {
    /// Reads `path`: a GGUF imatrix when it starts with the GGUF magic,
    /// else the legacy format.
    pub fn read(path: &Path) -> Result<Imatrix, ConvertError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| bad(&file, format!("cannot read: {e}")))?;
        if bytes.starts_with(b"GGUF") {
            let f = GgufFile::from_vec(bytes)
                .map_err(|e| bad(&file, format!("not a readable GGUF imatrix: {e}")))?;
            Imatrix::from_gguf(&f, &file)
        } else {
            Imatrix::from_legacy(&bytes, &file)
        }
    }

    /// The entries of a GGUF imatrix (`file` names it in errors).
    pub fn from_gguf(f: &GgufFile, file: &str) -> Result<Imatrix, ConvertError> {
        if let Some(v) = f.get(KEY_TYPE) {
            match v {
                MetaValue::String(s) if s == TYPE_IMATRIX => {}
                other => {
                    return Err(bad(
                        file,
                        format!(
                            "{KEY_TYPE} is {}, not \"{TYPE_IMATRIX}\": not an imatrix",
                            other.summary()
                        ),
                    ))
                }
            }
        }
        let missing = |k: &str, what: &str| bad(file, format!("{k}: missing or not {what}"));
        let datasets = f
            .get_array(KEY_DATASETS)
            .and_then(|a| {
                a.as_strings()
                    .map(<[String]>::to_vec)
                    .or(a.is_empty().then(Vec::new))
            })
            .ok_or_else(|| missing(KEY_DATASETS, "an array of strings"))?;
        let uint = |k: &str| {
            f.get_uint(k)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| missing(k, "an unsigned 32-bit integer"))
        };
        let chunk_count = uint(KEY_CHUNK_COUNT)?;
        let chunk_size = uint(KEY_CHUNK_SIZE)?;

        // Pair the tensors by name; other tensors are ignored (llama.cpp).
        let mut pairs: BTreeMap<&str, (Option<usize>, Option<usize>)> = BTreeMap::new();
        for (i, t) in f.tensor_infos().iter().enumerate() {
            if let Some(n) = t.name.strip_suffix(SUFFIX_SUMS) {
                pairs.entry(n).or_default().0 = Some(i);
            } else if let Some(n) = t.name.strip_suffix(SUFFIX_COUNTS) {
                pairs.entry(n).or_default().1 = Some(i);
            }
        }
        if pairs.is_empty() {
            return Err(bad(
                file,
                format!("no imatrix entries (no NAME{SUFFIX_SUMS} / NAME{SUFFIX_COUNTS} tensors)"),
            ));
        }
        let mut entries = BTreeMap::new();
        for (name, (s, c)) in pairs {
            let (Some(s), Some(c)) = (s, c) else {
                let (has, lacks) = if s.is_some() {
                    (SUFFIX_SUMS, SUFFIX_COUNTS)
                } else {
                    (SUFFIX_COUNTS, SUFFIX_SUMS)
                };
                return Err(bad_tensor(
                    file,
                    name,
                    format!("{name}{has} has no {name}{lacks}"),
                ));
            };
            let read = |i: usize| -> Result<(Vec<u64>, Vec<f32>), ConvertError> {
                let info = &f.tensor_infos()[i];
                let v = f
                    .view(info)
                    .map_err(|e| bad_tensor(file, &info.name, e.to_string()))?;
                if v.ty != GgmlType::F32 {
                    return Err(bad_tensor(
                        file,
                        &info.name,
                        format!("type {}, expected F32", v.ty),
                    ));
                }
                if info.ne.len() > 2 {
                    return Err(bad_tensor(
                        file,
                        &info.name,
                        format!("shape {:?}: more than 2 dimensions", info.ne),
                    ));
                }
                let vals: Vec<f32> = v
                    .data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                if let Some(x) = vals.iter().find(|x| !x.is_finite() || **x < 0.0) {
                    return Err(bad_tensor(
                        file,
                        &info.name,
                        format!("holds {x}: sums and counts are finite and not negative"),
                    ));
                }
                Ok((info.ne.clone(), vals))
            };
            let (ne, in_sum2) = read(s)?;
            let (_, counts) = read(c)?;
            let n_cols = ne.first().copied().unwrap_or(1) as usize;
            let n_mat = ne.get(1).copied().unwrap_or(1) as usize;
            if n_cols == 0 || n_mat == 0 {
                return Err(bad_tensor(
                    file,
                    name,
                    format!("{name}{SUFFIX_SUMS} is empty ({ne:?})"),
                ));
            }
            if counts.len() != n_mat {
                return Err(bad_tensor(
                    file,
                    name,
                    format!(
                        "{name}{SUFFIX_SUMS} has {n_mat} matrices, {name}{SUFFIX_COUNTS} {} counts",
                        counts.len()
                    ),
                ));
            }
            entries.insert(name.to_string(), Entry::new(n_cols, in_sum2, counts));
        }
        Ok(Imatrix {
            format: Format::Gguf,
            datasets,
            chunk_count,
            chunk_size,
            entries,
        })
    }

    /// The entries of a legacy (`.dat`) imatrix.
    pub fn from_legacy(bytes: &[u8], file: &str) -> Result<Imatrix, ConvertError> {
        let not = |msg: String| {
            bad(
                file,
                format!("neither a GGUF imatrix nor a legacy (.dat) one: {msg}"),
            )
        };
        let mut pos = 0usize;
        let i32_at = |pos: &mut usize, what: &str| -> Result<i32, ConvertError> {
            let b = bytes
                .get(*pos..*pos + 4)
                .ok_or_else(|| not(format!("truncated at byte {pos} reading {what}")))?;
            *pos += 4;
            Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let n = i32_at(&mut pos, "the entry count")?;
        if n < 1 || n as usize > bytes.len() / 12 {
            return Err(not(format!("entry count {n}")));
        }
        let mut entries = BTreeMap::new();
        for k in 0..n as usize {
            let len = i32_at(&mut pos, "a name length")?;
            if len < 1 || len as usize > bytes.len() - pos {
                return Err(not(format!("entry {k}: name length {len}")));
            }
            let name = std::str::from_utf8(&bytes[pos..pos + len as usize])
                .map_err(|_| not(format!("entry {k}: the name is not UTF-8")))?
                .to_string();
            pos += len as usize;
            let ncall = i32_at(&mut pos, "a call count")?;
            let nval = i32_at(&mut pos, "a value count")?;
            if nval < 1 || nval as usize > (bytes.len() - pos) / 4 {
                return Err(not(format!("entry {name}: value count {nval}")));
            }
            let vals: Vec<f32> = bytes[pos..pos + 4 * nval as usize]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            pos += 4 * nval as usize;
            if let Some(x) = vals.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(bad_tensor(
                    file,
                    &name,
                    format!("holds {x}: values are finite and not negative"),
                ));
            }
            // quantize.cpp divides by ncall only when it is above 0.
            let count = if ncall > 0 { ncall as f32 } else { 1.0 };
            if entries
                .insert(name.clone(), Entry::new(vals.len(), vals, vec![count]))
                .is_some()
            {
                return Err(bad_tensor(file, &name, "appears twice"));
            }
        }
        // The optional trailer: the chunk count and the dataset's name.
        let mut chunk_count = 0;
        let mut datasets = Vec::new();
        if bytes.len() - pos >= 4 {
            chunk_count = i32_at(&mut pos, "the chunk count")?.max(0) as u32;
            if bytes.len() - pos >= 4 {
                let len = i32_at(&mut pos, "the dataset length")?;
                if len < 0 || len as usize > bytes.len() - pos {
                    return Err(not(format!("dataset name length {len}")));
                }
                let d = &bytes[pos..pos + len as usize];
                datasets.push(String::from_utf8_lossy(d).into_owned());
            }
        }
        Ok(Imatrix {
            format: Format::Legacy,
            datasets,
            chunk_count,
            chunk_size: 0,
            entries,
        })
    }

    /// The entry of weight tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// The file as llama-imatrix writes it: the three keys after
    /// `general.type`, then per entry in name order `NAME.in_sum2`
    /// `[n_cols, n_mat]` and `NAME.counts` `[1, n_mat]`, all F32.
    pub fn to_gguf(&self) -> Result<GgufWriter, ConvertError> {
        let mut w = GgufWriter::new();
        w.add_str(KEY_TYPE, TYPE_IMATRIX);
        w.add_array(KEY_DATASETS, MetaArray::String(self.datasets.clone()));
        w.add_u32(KEY_CHUNK_COUNT, self.chunk_count);
        w.add_u32(KEY_CHUNK_SIZE, self.chunk_size);
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for (name, e) in &self.entries {
            let n_mat = e.counts.len();
            if n_mat == 0 || e.in_sum2.len() != e.n_cols * n_mat {
                return Err(ConvertError::Usage(format!(
                    "imatrix entry {name}: {} sums for {n_mat} matrices of {} columns",
                    e.in_sum2.len(),
                    e.n_cols
                )));
            }
            let err = |e: std::io::Error| ConvertError::Usage(e.to_string());
            w.add_tensor(
                &format!("{name}{SUFFIX_SUMS}"),
                &[e.n_cols as u64, n_mat as u64],
                GgmlType::F32,
                f32_bytes(&e.in_sum2),
            )
            .map_err(err)?;
            w.add_tensor(
                &format!("{name}{SUFFIX_COUNTS}"),
                &[1, n_mat as u64],
                GgmlType::F32,
                f32_bytes(&e.counts),
            )
            .map_err(err)?;
        }
        Ok(w)
    }

    /// Writes the GGUF form to `path` (under a temporary name, renamed when
    /// complete).
    pub fn write(&self, path: &Path) -> Result<(), ConvertError> {
        let w = self.to_gguf()?;
        let partial = partial_path(path);
        let res = w
            .write_to_path(&partial)
            .and_then(|()| std::fs::rename(&partial, path));
        res.map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            ConvertError::Output {
                file: path.display().to_string(),
                msg: format!("cannot write the imatrix: {e}"),
            }
        })
    }

    /// Checks that every entry names a tensor of `layout` and fits its
    /// shape (`ne0` columns, `ne2` matrices); the first disagreement is an
    /// error naming `file` (the imatrix) and the tensor.
    pub fn check(&self, layout: &Layout, file: &Path) -> Result<(), ConvertError> {
        let file = file.display().to_string();
        for (name, e) in &self.entries {
            let Some(t) = layout.get(name) else {
                return Err(bad_tensor(
                    &file,
                    name,
                    "not a tensor of this model (an imatrix made for another model?)",
                ));
            };
            let (ne0, n_mat) = tensor_matrices(&t.ne);
            e.fits(ne0, n_mat)
                .map_err(|m| bad_tensor(&file, name, format!("shape {:?}: {m}", t.ne)))?;
        }
        Ok(())
    }

    /// llama-quantize's `quantize.imatrix.*` keys for a model quantized
    /// with this imatrix read from `file` (the name as given).
    pub fn quantize_keys(&self, file: &str) -> Vec<(String, MetaValue)> {
        let s = |v: &str| MetaValue::String(truncated(v, 127).to_string());
        let mut kv = vec![(KEY_QUANTIZE_FILE.to_string(), s(file))];
        if let Some(d) = self.datasets.first() {
            kv.push((KEY_QUANTIZE_DATASET.to_string(), s(d)));
        }
        kv.push((
            KEY_QUANTIZE_ENTRIES.to_string(),
            MetaValue::U32(u32::try_from(self.entries.len()).unwrap_or(u32::MAX)),
        ));
        if self.chunk_count > 0 {
            kv.push((
                KEY_QUANTIZE_CHUNKS.to_string(),
                MetaValue::U32(self.chunk_count),
            ));
        }
        kv
    }

    /// A report of the file: a summary line, then per entry its name,
    /// columns, matrices, the smallest and largest count, the matrices
    /// without data, and the mean and largest importance.
    pub fn stats(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{} imatrix: {} entries, {} chunks of {} tokens, datasets {:?}",
            match self.format {
                Format::Gguf => "GGUF",
                Format::Legacy => "legacy (.dat)",
            },
            self.entries.len(),
            self.chunk_count,
            self.chunk_size,
            self.datasets
        )];
        out.push(format!(
            "{:<40} {:>7} {:>5} {:>12} {:>12} {:>6} {:>12} {:>12}",
            "tensor", "columns", "mats", "min count", "max count", "empty", "mean imp", "max imp"
        ));
        for (name, e) in &self.entries {
            let n_mat = (e.in_sum2.len() / e.n_cols.max(1)).max(1);
            let ne0 = e.in_sum2.len() / n_mat;
            let (mut sum, mut max, mut n) = (0f64, 0f32, 0usize);
            for m in 0..n_mat {
                for v in e.importance(ne0, m) {
                    sum += v as f64;
                    max = max.max(v);
                    n += 1;
                }
            }
            let min_c = e.counts.iter().copied().fold(f32::INFINITY, f32::min);
            let max_c = e.counts.iter().copied().fold(0f32, f32::max);
            let empty = e.empty_matrices();
            out.push(format!(
                "{name:<40} {:>7} {:>5} {min_c:>12} {max_c:>12} {empty:>6} {:>12.6e} {max:>12.6e}",
                e.n_cols,
                e.counts.len(),
                sum / n.max(1) as f64
            ));
        }
        out
    }
}

/// Columns and matrices of a tensor of GGUF shape `ne`: `ne0`, and the
/// product of the dimensions past the second (the experts of a 3-D tensor;
/// 1 for a matrix or vector).
pub fn tensor_matrices(ne: &[u64]) -> (usize, usize) {
    let ne0 = ne.first().copied().unwrap_or(1) as usize;
    let n_mat = ne.iter().skip(2).product::<u64>() as usize;
    (ne0, n_mat)
}

/// Whether `quant::quantize_row` uses an importance row for `ty` (the
/// weighted K and IQ searches; Q8_0, MXFP4 and the float types ignore it).
pub fn uses_importance(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q2K | GgmlType::Q4K | GgmlType::Iq2Xxs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut entries = BTreeMap::new();
        entries.insert(
            "blk.0.ffn_gate_exps.weight".to_string(),
            Entry::new(4, (0..12).map(|i| i as f32).collect(), vec![2.0, 0.0, 4.0]),
        );
        entries.insert(
            "blk.0.attn_q_a.weight".to_string(),
            Entry::new(3, vec![1.0, 2.0, 3.0], vec![5.0]),
        );
        Imatrix {
            format: Format::Gguf,
            datasets: vec!["calib.txt".into()],
            chunk_count: 7,
            chunk_size: 512,
            entries,
        }
    }

    #[test]
    fn gguf_round_trip_in_memory() {
        let m = sample();
        let bytes = m.to_gguf().unwrap().to_bytes().unwrap();
        let f = GgufFile::from_vec(bytes).unwrap();
        assert_eq!(Imatrix::from_gguf(&f, "mem").unwrap(), m);
    }

    #[test]
    fn importance_divides_by_the_count_and_is_one_without_data() {
        let m = sample();
        let e = m.get("blk.0.ffn_gate_exps.weight").unwrap();
        assert_eq!(e.importance(4, 0), vec![0.0, 0.5, 1.0, 1.5]);
        assert_eq!(e.importance(4, 1), vec![1.0; 4]);
        assert_eq!(e.importance(4, 2), vec![2.0, 2.25, 2.5, 2.75]);
        assert!(e.fits(4, 3).is_ok());
        assert!(e.fits(3, 4).is_err());
        assert!(e.fits(4, 2).is_err());
        // One count for all matrices (legacy): only the total size matters.
        let l = Entry::new(12, (0..12).map(|i| i as f32).collect(), vec![2.0]);
        assert!(l.fits(4, 3).is_ok() && l.fits(6, 2).is_ok() && l.fits(5, 2).is_err());
        assert_eq!(l.importance(4, 2), vec![4.0, 4.5, 5.0, 5.5]);
    }

    #[test]
    fn legacy_reads() {
        // Two entries, then the trailer (chunk count 3, dataset "d.txt").
        let mut b = Vec::new();
        b.extend(2i32.to_le_bytes());
        for (name, ncall, vals) in [
            ("a.weight", 4i32, vec![4.0f32, 8.0]),
            ("b.weight", 0, vec![1.0]),
        ] {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            vals.iter().for_each(|v| b.extend(v.to_le_bytes()));
        }
        b.extend(3i32.to_le_bytes());
        b.extend(5i32.to_le_bytes());
        b.extend(b"d.txt");
        let m = Imatrix::from_legacy(&b, "x.dat").unwrap();
        assert_eq!(m.format, Format::Legacy);
        assert_eq!(m.chunk_count, 3);
        assert_eq!(m.datasets, vec!["d.txt".to_string()]);
        assert_eq!(m.get("a.weight").unwrap().importance(2, 0), vec![1.0, 2.0]);
        assert_eq!(m.get("b.weight").unwrap().importance(1, 0), vec![1.0]);
        // Truncated anywhere: an error, never a panic.
        for n in 0..b.len() - 9 {
            let _ = Imatrix::from_legacy(&b[..n], "x.dat");
        }
        assert!(Imatrix::from_legacy(b"hello world, not an imatrix", "x").is_err());
    }

    #[test]
    fn quantize_keys_follow_llama_quantize() {
        let m = sample();
        let long = "f".repeat(300);
        let kv = m.quantize_keys(&long);
        let names: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                KEY_QUANTIZE_FILE,
                KEY_QUANTIZE_DATASET,
                KEY_QUANTIZE_ENTRIES,
                KEY_QUANTIZE_CHUNKS
            ]
        );
        assert_eq!(kv[0].1, MetaValue::String("f".repeat(127)));
        assert_eq!(kv[2].1, MetaValue::U32(2));
        assert_eq!(kv[3].1, MetaValue::U32(7));
    }
}
