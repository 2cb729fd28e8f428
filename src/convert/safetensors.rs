//! The official checkpoints' container: safetensors shards, memory-mapped,
//! read one tensor at a time.
//!
//! A shard is `u64 n` (little-endian), `n` bytes of JSON (`name → {dtype,
//! shape, data_offsets}`, plus an optional `__metadata__`), then the data.
//! A checkpoint is a folder with `model.safetensors.index.json` (its
//! `weight_map` names the shard of every tensor) or one `model.safetensors`.
//! Everything read from a header is checked against the bytes that are
//! there before it is used: a tensor's extent must lie in its shard and
//! match its dtype and shape, so a truncated or crafted shard gives an error
//! naming the file and the tensor, never a panic.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use super::ConvertError;

/// The largest JSON header accepted (the real shards' are well under 1 MB).
const MAX_HEADER: u64 = 256 << 20;

/// Element types of the checkpoints (safetensors spelling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F64,
    F32,
    F16,
    Bf16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    F8E4m3,
    F8E5m2,
    F8E8m0,
}

impl Dtype {
    pub fn parse(s: &str) -> Option<Dtype> {
        use Dtype::*;
        Some(match s {
            "F64" => F64,
            "F32" => F32,
            "F16" => F16,
            "BF16" => Bf16,
            "I64" => I64,
            "I32" => I32,
            "I16" => I16,
            "I8" => I8,
            "U8" => U8,
            "BOOL" => Bool,
            "F8_E4M3" => F8E4m3,
            "F8_E5M2" => F8E5m2,
            "F8_E8M0" => F8E8m0,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            F64 => "F64",
            F32 => "F32",
            F16 => "F16",
            Bf16 => "BF16",
            I64 => "I64",
            I32 => "I32",
            I16 => "I16",
            I8 => "I8",
            U8 => "U8",
            Bool => "BOOL",
            F8E4m3 => "F8_E4M3",
            F8E5m2 => "F8_E5M2",
            F8E8m0 => "F8_E8M0",
        }
    }

    pub fn size(self) -> u64 {
        use Dtype::*;
        match self {
            F64 | I64 => 8,
            F32 | I32 => 4,
            F16 | Bf16 | I16 => 2,
            I8 | U8 | Bool | F8E4m3 | F8E5m2 | F8E8m0 => 1,
        }
    }
}

/// One tensor of a shard: where its bytes are.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Absolute byte range in the shard file.
    pub start: u64,
    pub len: u64,
}

/// One mapped shard and its tensor directory.
pub struct Shard {
    pub path: PathBuf,
    map: Option<memmap2::Mmap>,
    pub tensors: HashMap<String, TensorEntry>,
}

impl Shard {
    /// Maps `path` and parses its header.
    pub fn open(path: &Path) -> Result<Shard, ConvertError> {
        let bad = |msg: String| ConvertError::Checkpoint {
            file: path.display().to_string(),
            msg,
        };
        let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| bad(format!("cannot stat: {e}")))?
            .len();
        if len < 8 {
            return Err(bad(format!(
                "{len} bytes: too short for a safetensors header"
            )));
        }
        // SAFETY: read-only private map; the tool never writes its inputs, and
        // a concurrent truncation by another process is outside what an
        // mmap-based reader can defend against.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(format!("cannot map: {e}")))?;
        let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        if n > MAX_HEADER || n > len - 8 {
            return Err(bad(format!(
                "header length {n} exceeds the file ({len} bytes) or the {MAX_HEADER}-byte limit"
            )));
        }
        let json: serde_json::Value = serde_json::from_slice(&map[8..8 + n as usize])
            .map_err(|e| bad(format!("header is not JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| bad("header is not a JSON object".into()))?;
        let data_start = 8 + n;
        let mut tensors = HashMap::with_capacity(obj.len());
        for (name, v) in obj {
            if name == "__metadata__" {
                continue;
            }
            let tbad = |msg: String| ConvertError::Tensor {
                file: path.display().to_string(),
                tensor: name.clone(),
                msg,
            };
            let dtype_s = v
                .get("dtype")
                .and_then(|d| d.as_str())
                .ok_or_else(|| tbad("no dtype".into()))?;
            let dtype = Dtype::parse(dtype_s)
                .ok_or_else(|| tbad(format!("unknown dtype {dtype_s:?}")))?;
            let shape: Vec<u64> = v
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| tbad("no shape".into()))?
                .iter()
                .map(|d| d.as_u64().ok_or_else(|| tbad(format!("bad shape entry {d}"))))
                .collect::<Result<_, _>>()?;
            let offs = v
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .filter(|a| a.len() == 2)
                .ok_or_else(|| tbad("no data_offsets pair".into()))?;
            let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
                (Some(b), Some(e)) if b <= e => (b, e),
                _ => return Err(tbad(format!("bad data_offsets {offs:?}"))),
            };
            let numel = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype.size()))
                .ok_or_else(|| tbad("size overflows".into()))?;
            if e - b != numel {
                return Err(tbad(format!(
                    "{} bytes stored, but {dtype_s} {shape:?} needs {numel}",
                    e - b
                )));
            }
            if data_start + e > len {
                return Err(tbad(format!(
                    "data ends at byte {} but the shard has {len} bytes (truncated?)",
                    data_start + e
                )));
            }
            tensors.insert(
                name.clone(),
                TensorEntry {
                    dtype,
                    shape,
                    start: data_start + b,
                    len: e - b,
                },
            );
        }
        Ok(Shard {
            path: path.to_path_buf(),
            map: Some(map),
            tensors,
        })
    }

    /// The bytes of `t` (an entry of this shard; bounds checked at open).
    pub fn bytes(&self, t: &TensorEntry) -> &[u8] {
        match &self.map {
            Some(m) => &m[t.start as usize..(t.start + t.len) as usize],
            None => &[],
        }
    }

    /// Tells the kernel this process is done with `t`'s pages, so a
    /// 150 GB checkpoint read once does not stay in this process's resident
    /// set (the page cache keeps them as it sees fit).
    pub fn release(&self, t: &TensorEntry) {
        if let Some(m) = &self.map {
            release_pages(m, t.start, t.len);
        }
    }
}

fn release_pages(m: &memmap2::Mmap, start: u64, len: u64) {
    let page = 4096u64;
    let s = start.div_ceil(page) * page;
    let e = (start + len) / page * page;
    if e > s {
        // SAFETY: the range lies inside the mapping; MADV_DONTNEED on a
        // read-only file mapping only drops this process's page references.
        unsafe {
            libc::madvise(
                m.as_ptr().add(s as usize) as *mut libc::c_void,
                (e - s) as usize,
                libc::MADV_DONTNEED,
            );
        }
    }
}

/// A checkpoint folder: every shard mapped, every tensor located.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub shards: Vec<Shard>,
    /// Tensor name → shard index.
    index: BTreeMap<String, usize>,
}

/// A tensor located in its shard.
#[derive(Clone, Copy)]
pub struct HfTensor<'a> {
    pub name: &'a str,
    pub shard: &'a Shard,
    pub entry: &'a TensorEntry,
}

impl<'a> HfTensor<'a> {
    pub fn bytes(&self) -> &'a [u8] {
        self.shard.bytes(self.entry)
    }

    pub fn file(&self) -> String {
        self.shard.path.display().to_string()
    }
}

impl Checkpoint {
    /// Opens `dir`: the index's shards (each must exist and hold the tensors
    /// the index assigns it), or a lone `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint, ConvertError> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut shards = Vec::new();
        let mut index = BTreeMap::new();
        if index_path.exists() {
            let ipath = index_path.display().to_string();
            let text = std::fs::read(&index_path).map_err(|e| ConvertError::Checkpoint {
                file: ipath.clone(),
                msg: format!("cannot read: {e}"),
            })?;
            let json: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| ConvertError::Checkpoint {
                    file: ipath.clone(),
                    msg: format!("not JSON: {e}"),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ConvertError::Checkpoint {
                    file: ipath.clone(),
                    msg: "no weight_map object".into(),
                })?;
            let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (name, f) in map {
                let f = f.as_str().ok_or_else(|| ConvertError::Checkpoint {
                    file: ipath.clone(),
                    msg: format!("weight_map entry of {name} is not a file name"),
                })?;
                if f.contains('/') || f.contains("..") {
                    return Err(ConvertError::Checkpoint {
                        file: ipath.clone(),
                        msg: format!("shard name {f:?} (tensor {name}) leaves the folder"),
                    });
                }
                by_file.entry(f.to_string()).or_default().push(name.clone());
            }
            for (f, names) in by_file {
                let p = dir.join(&f);
                if !p.exists() {
                    return Err(ConvertError::Tensor {
                        file: p.display().to_string(),
                        tensor: names[0].clone(),
                        msg: format!(
                            "shard is missing (model.safetensors.index.json assigns it {} tensors)",
                            names.len()
                        ),
                    });
                }
                let shard = Shard::open(&p)?;
                for n in names {
                    if !shard.tensors.contains_key(&n) {
                        return Err(ConvertError::Tensor {
                            file: p.display().to_string(),
                            tensor: n,
                            msg: "listed in model.safetensors.index.json but not in the shard"
                                .into(),
                        });
                    }
                    index.insert(n, shards.len());
                }
                shards.push(shard);
            }
        } else {
            let p = dir.join("model.safetensors");
            if !p.exists() {
                return Err(ConvertError::Checkpoint {
                    file: dir.display().to_string(),
                    msg: "neither model.safetensors.index.json nor model.safetensors".into(),
                });
            }
            let shard = Shard::open(&p)?;
            for n in shard.tensors.keys() {
                index.insert(n.clone(), 0);
            }
            shards.push(shard);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            index,
        })
    }

    pub fn get(&self, name: &str) -> Option<HfTensor<'_>> {
        let (name, &i) = self.index.get_key_value(name)?;
        let shard = &self.shards[i];
        Some(HfTensor {
            name,
            shard,
            entry: &shard.tensors[name],
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(|s| s.as_str())
    }

    /// Bytes of all tensors (what a conversion reads).
    pub fn total_bytes(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| s.tensors.values())
            .map(|t| t.len)
            .sum()
    }
}
