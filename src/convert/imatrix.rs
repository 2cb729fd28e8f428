//! Importance matrices in llama.cpp's formats, so files go both ways.
//!
//! An entry belongs to one weight (its GGUF name) and holds, per matrix
//! (one, or one per routed expert), the sum over the tokens that reached it
//! of each input column's square, and how many tokens that was. The mean
//! `sum / count` is a column's activation energy: the weight the IQ2_XXS,
//! Q2_K and Q4_K searches give that column's error.
//!
//! * GGUF (llama.cpp's current `llama-imatrix` output, `general.type =
//!   "imatrix"`): tensors `NAME.in_sum2` (F32 `[cols, n_mat]`) and
//!   `NAME.counts` (F32 `[1, n_mat]`), keys `imatrix.datasets` (string
//!   array), `imatrix.chunk_count`, `imatrix.chunk_size` (u32).
//! * legacy `.dat` (GGUF.md §10): `i32 n`, then per entry `i32 len, name,
//!   i32 ncall, i32 nval, f32 × nval` (already averaged and multiplied by
//!   ncall), then optionally `i32 chunks, i32 len, dataset`.

use std::collections::BTreeMap;
use std::path::Path;

use super::ConvertError;
use crate::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use crate::quant::GgmlType;

/// One weight's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Input columns of one matrix.
    pub cols: usize,
    /// `cols × n_mat` sums of squares.
    pub sums: Vec<f32>,
    /// Tokens per matrix.
    pub counts: Vec<f32>,
}

impl Entry {
    pub fn n_mat(&self) -> usize {
        self.counts.len()
    }
}

/// An importance matrix.
#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    /// Where it was read from (for messages and `quantize.imatrix.file`).
    pub file: String,
    pub entries: BTreeMap<String, Entry>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
    /// `sum / count` per entry, computed on load.
    means: BTreeMap<String, Vec<f32>>,
}

fn bad(file: &str, msg: String) -> ConvertError {
    ConvertError::Checkpoint {
        file: file.to_string(),
        msg,
    }
}

impl Imatrix {
    pub fn new(datasets: Vec<String>, chunk_count: u32, chunk_size: u32) -> Imatrix {
        Imatrix {
            datasets,
            chunk_count,
            chunk_size,
            ..Default::default()
        }
    }

    /// Adds (or accumulates into) an entry.
    pub fn add(&mut self, name: &str, cols: usize, sums: &[f32], counts: &[f32]) {
        let e = self.entries.entry(name.to_string()).or_insert_with(|| Entry {
            cols,
            sums: vec![0.0; sums.len()],
            counts: vec![0.0; counts.len()],
        });
        for (a, b) in e.sums.iter_mut().zip(sums) {
            *a += b;
        }
        for (a, b) in e.counts.iter_mut().zip(counts) {
            *a += b;
        }
    }

    fn compute_means(&mut self) {
        self.means = self
            .entries
            .iter()
            .map(|(k, e)| {
                let m = e
                    .sums
                    .chunks(e.cols)
                    .zip(&e.counts)
                    .flat_map(|(s, &c)| s.iter().map(move |&v| if c > 0.0 { v / c } else { 0.0 }))
                    .collect();
                (k.clone(), m)
            })
            .collect();
    }

    /// Reads either format.
    pub fn read(path: &Path) -> Result<Imatrix, ConvertError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| bad(&file, format!("cannot read: {e}")))?;
        let mut m = if bytes.starts_with(b"GGUF") {
            Self::from_gguf(bytes, &file)?
        } else {
            Self::from_legacy(&bytes, &file)?
        };
        m.file = file;
        m.compute_means();
        Ok(m)
    }

    fn from_gguf(bytes: Vec<u8>, file: &str) -> Result<Imatrix, ConvertError> {
        let g = GgufFile::from_vec(bytes).map_err(|e| bad(file, e.to_string()))?;
        if g.get_str("general.type") != Some("imatrix") {
            return Err(bad(file, "a GGUF file but not an imatrix (general.type)".into()));
        }
        let mut m = Imatrix {
            chunk_count: g.get_uint("imatrix.chunk_count").unwrap_or(0) as u32,
            chunk_size: g.get_uint("imatrix.chunk_size").unwrap_or(0) as u32,
            ..Default::default()
        };
        if let Some(MetaArray::String(d)) = g.get_array("imatrix.datasets") {
            m.datasets = d.clone();
        }
        let f32s = |name: &str| -> Result<(Vec<u64>, Vec<f32>), ConvertError> {
            let t = g
                .tensor(name)
                .map_err(|e| bad(file, e.to_string()))?
                .ok_or_else(|| bad(file, format!("{name} is missing")))?;
            if t.ty != GgmlType::F32 {
                return Err(bad(file, format!("{name} is {} (F32 expected)", t.ty)));
            }
            let v = t
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            Ok((t.dims().to_vec(), v))
        };
        for info in g.tensor_infos() {
            let Some(name) = info.name.strip_suffix(".in_sum2") else {
                continue;
            };
            let (ne, sums) = f32s(&info.name)?;
            let (cne, counts) = f32s(&format!("{name}.counts"))?;
            let n_mat = ne.get(1).copied().unwrap_or(1) as usize;
            if counts.len() != n_mat || cne[0] != 1 {
                return Err(bad(
                    file,
                    format!("{name}: {} counts for {n_mat} matrices", counts.len()),
                ));
            }
            m.entries.insert(
                name.to_string(),
                Entry {
                    cols: ne[0] as usize,
                    sums,
                    counts,
                },
            );
        }
        Ok(m)
    }

    fn from_legacy(b: &[u8], file: &str) -> Result<Imatrix, ConvertError> {
        let mut pos = 0usize;
        let i32_at = |pos: &mut usize| -> Result<i32, ConvertError> {
            let v = b
                .get(*pos..*pos + 4)
                .ok_or_else(|| bad(file, format!("truncated at byte {pos}")))?;
            *pos += 4;
            Ok(i32::from_le_bytes(v.try_into().unwrap()))
        };
        let n = i32_at(&mut pos)?;
        if n < 0 || n as usize > b.len() / 12 {
            return Err(bad(file, format!("not an imatrix ({n} entries?)")));
        }
        let mut m = Imatrix::default();
        for _ in 0..n {
            let len = i32_at(&mut pos)? as usize;
            let name = b
                .get(pos..pos + len)
                .and_then(|s| std::str::from_utf8(s).ok())
                .ok_or_else(|| bad(file, format!("bad entry name at byte {pos}")))?
                .to_string();
            pos += len;
            let ncall = i32_at(&mut pos)?.max(1) as f32;
            let nval = i32_at(&mut pos)? as usize;
            let vals = b
                .get(pos..pos + 4 * nval)
                .ok_or_else(|| bad(file, format!("{name}: truncated values")))?;
            pos += 4 * nval;
            // Stored values are mean·ncall: keep them as sums with count ncall.
            let sums: Vec<f32> = vals
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            m.entries.insert(
                name,
                Entry {
                    cols: nval,
                    sums,
                    counts: vec![ncall],
                },
            );
        }
        if let Ok(chunks) = i32_at(&mut pos) {
            m.chunk_count = chunks.max(0) as u32;
            if let Ok(len) = i32_at(&mut pos) {
                if let Some(d) = b.get(pos..pos + len.max(0) as usize) {
                    m.datasets.push(String::from_utf8_lossy(d).into_owned());
                }
            }
        }
        Ok(m)
    }

    /// Writes llama.cpp's GGUF format.
    pub fn write(&self, path: &Path) -> Result<(), ConvertError> {
        let mut w = GgufWriter::new();
        w.add_str("general.type", "imatrix");
        w.add_array("imatrix.datasets", MetaArray::String(self.datasets.clone()));
        w.add_u32("imatrix.chunk_count", self.chunk_count);
        w.add_u32("imatrix.chunk_size", self.chunk_size);
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let io = |e: std::io::Error| ConvertError::Output {
            file: path.display().to_string(),
            msg: e.to_string(),
        };
        for (name, e) in &self.entries {
            let n_mat = e.n_mat() as u64;
            w.add_tensor(&format!("{name}.in_sum2"), &[e.cols as u64, n_mat], GgmlType::F32, le(&e.sums))
                .map_err(io)?;
            w.add_tensor(&format!("{name}.counts"), &[1, n_mat], GgmlType::F32, le(&e.counts))
                .map_err(io)?;
        }
        let tmp = super::run::partial_path(path);
        let r = w.write_to_path(&tmp).map_err(io).and_then(|()| {
            std::fs::rename(&tmp, path).map_err(io)
        });
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// The importance of tensor `name`'s columns (expert `expert` of a
    /// stacked tensor), `None` when the matrix has none or saw no token.
    pub fn importance(&self, name: &str, expert: Option<usize>, cols: usize) -> Result<Option<&[f32]>, ConvertError> {
        let (Some(e), Some(m)) = (self.entries.get(name), self.means.get(name)) else {
            return Ok(None);
        };
        if e.cols != cols {
            return Err(ConvertError::Tensor {
                file: self.file.clone(),
                tensor: name.to_string(),
                msg: format!("imatrix rows of {} columns, the tensor has {cols}", e.cols),
            });
        }
        let k = if e.n_mat() == 1 { 0 } else { expert.unwrap_or(0) };
        if e.counts.get(k).copied().unwrap_or(0.0) <= 0.0 {
            return Ok(None);
        }
        Ok(m.get(k * cols..(k + 1) * cols))
    }

    /// Checks the matrix fits the output tensors (`(name, ne)`): every entry
    /// names one of them with its column count and matrix count, and at
    /// least one entry exists. An imatrix made for another model fails here.
    pub fn check_against<'a>(&self, tensors: impl Iterator<Item = (&'a str, &'a [u64])>) -> Result<(), ConvertError> {
        let shapes: BTreeMap<&str, &[u64]> = tensors.collect();
        if self.entries.is_empty() {
            return Err(bad(&self.file, "the imatrix has no entries".into()));
        }
        for (name, e) in &self.entries {
            let Some(ne) = shapes.get(name.as_str()) else {
                return Err(ConvertError::Tensor {
                    file: self.file.clone(),
                    tensor: name.clone(),
                    msg: "the imatrix names a tensor this model does not have (made for another model?)".into(),
                });
            };
            let n_mat = if ne.len() == 3 { ne[2] as usize } else { 1 };
            if e.cols as u64 != ne[0] || (e.n_mat() != n_mat && e.n_mat() != 1) {
                return Err(ConvertError::Tensor {
                    file: self.file.clone(),
                    tensor: name.clone(),
                    msg: format!(
                        "imatrix has {} columns × {} matrices, the tensor {} × {n_mat} (made for another model?)",
                        e.cols,
                        e.n_mat(),
                        ne[0]
                    ),
                });
            }
        }
        Ok(())
    }

    /// The `quantize.imatrix.*` keys of a file made with this matrix.
    pub fn add_keys(&self, w: &mut GgufWriter) {
        w.add_str("quantize.imatrix.file", &self.file);
        w.add_kv("quantize.imatrix.entries_count", MetaValue::U64(self.entries.len() as u64));
        if let Some(d) = self.datasets.first() {
            w.add_str("quantize.imatrix.dataset", d);
        }
        if self.chunk_count > 0 {
            w.add_kv("quantize.imatrix.chunks_count", MetaValue::U64(self.chunk_count as u64));
        }
    }
}
