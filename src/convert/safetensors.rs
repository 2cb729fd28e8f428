//! The official checkpoints' container: safetensors shards, memory-mapped,
//! read one tensor at a time (docs/TOOLS.md, "Reading official checkpoints").
//!
//! A shard is `u64 n` (little-endian), `n` bytes of JSON (`name → {dtype,
//! shape, data_offsets}`, plus an optional `__metadata__`), then the data;
//! `data_offsets` count from the end of the header. A checkpoint is a folder
//! with `config.json` and `model.safetensors.index.json`, whose `weight_map`
//! names the shard of every tensor.
//!
//! Everything a header says is checked against the bytes that are there
//! before it is used: each tensor's extent lies in its shard, matches its
//! dtype and shape, and overlaps no other; every shard the index names
//! exists and holds the tensors the index gives it. A truncated or crafted
//! file is an error naming the file and the tensor, never a panic.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use super::ConvertError;

/// The largest JSON header accepted (the release's shards have well under
/// 1 MiB each).
const MAX_HEADER: u64 = 100 << 20;

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The model configuration beside the shards.
pub const CONFIG_FILE: &str = "config.json";

/// Element types of the safetensors format (its spelling in [`Dtype::name`]).
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

const DTYPES: [Dtype; 13] = [
    Dtype::F64,
    Dtype::F32,
    Dtype::F16,
    Dtype::Bf16,
    Dtype::I64,
    Dtype::I32,
    Dtype::I16,
    Dtype::I8,
    Dtype::U8,
    Dtype::Bool,
    Dtype::F8E4m3,
    Dtype::F8E5m2,
    Dtype::F8E8m0,
];

impl Dtype {
    /// The dtype spelled `s` in a header, if it is one of the format's.
    pub fn parse(s: &str) -> Option<Dtype> {
        DTYPES.into_iter().find(|d| d.name() == s)
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F64 => "F64",
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I64 => "I64",
            Dtype::I32 => "I32",
            Dtype::I16 => "I16",
            Dtype::I8 => "I8",
            Dtype::U8 => "U8",
            Dtype::Bool => "BOOL",
            Dtype::F8E4m3 => "F8_E4M3",
            Dtype::F8E5m2 => "F8_E5M2",
            Dtype::F8E8m0 => "F8_E8M0",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::Bf16 | Dtype::I16 => 2,
            Dtype::I8 | Dtype::U8 | Dtype::Bool | Dtype::F8E4m3 | Dtype::F8E5m2 | Dtype::F8E8m0 => {
                1
            }
        }
    }
}

/// Where one tensor's bytes lie in its shard.
#[derive(Clone, Debug)]
struct Entry {
    dtype: Dtype,
    shape: Vec<u64>,
    /// Absolute byte range in the shard file.
    start: usize,
    end: usize,
}

/// One mapped shard and its tensor directory.
pub struct Shard {
    path: PathBuf,
    map: memmap2::Mmap,
    tensors: HashMap<String, Entry>,
}

fn input(path: &Path, msg: String) -> ConvertError {
    ConvertError::Input {
        file: path.display().to_string(),
        msg,
    }
}

fn tensor_err(path: &Path, tensor: &str, msg: String) -> ConvertError {
    ConvertError::Tensor {
        file: path.display().to_string(),
        tensor: tensor.to_string(),
        msg,
    }
}

/// At most this much of a tensor is read ahead ([`Checkpoint::prefetch`]).
const PREFETCH_BYTES: usize = 256 << 20;

impl Shard {
    /// Maps `path` and checks its whole header against the file.
    pub fn open(path: &Path) -> Result<Shard, ConvertError> {
        let file = File::open(path).map_err(|e| input(path, format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| input(path, format!("cannot stat: {e}")))?
            .len();
        if len < 8 {
            return Err(input(
                path,
                format!("{len} bytes: too short for a safetensors header (truncated?)"),
            ));
        }
        // SAFETY: a read-only map of a file this process never writes. Another
        // process truncating it while it is read is outside what a reader of
        // mapped files can defend against (the page-in would fault).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| input(path, format!("cannot map: {e}")))?;
        let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        if n > MAX_HEADER || n > len - 8 {
            return Err(input(
                path,
                format!(
                    "header length {n} exceeds the file ({len} bytes, truncated?) \
                     or the {MAX_HEADER}-byte limit"
                ),
            ));
        }
        let data_start = 8 + n;
        let json: serde_json::Value = serde_json::from_slice(&map[8..data_start as usize])
            .map_err(|e| input(path, format!("header is not JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| input(path, "header is not a JSON object".into()))?;
        let mut tensors = HashMap::with_capacity(obj.len());
        for (name, v) in obj {
            if name == "__metadata__" {
                continue;
            }
            let entry = parse_entry(v, data_start, len)
                .map_err(|msg| tensor_err(path, name, format!("header: {msg}")))?;
            tensors.insert(name.clone(), entry);
        }
        // Extents must not overlap (the format lays them end to end).
        let mut extents: Vec<(&String, &Entry)> =
            tensors.iter().filter(|(_, e)| e.start < e.end).collect();
        extents.sort_by_key(|(_, e)| e.start);
        for w in extents.windows(2) {
            let ((a, ea), (b, eb)) = (w[0], w[1]);
            if eb.start < ea.end {
                return Err(tensor_err(
                    path,
                    b,
                    format!("header: data overlaps tensor {a}'s"),
                ));
            }
        }
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }

    /// The shard's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// See [`Checkpoint::prefetch`].
    fn prefetch(&self, name: &str) {
        let Some(e) = self.tensors.get(name) else {
            return;
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = e.start / page * page;
        // The first part only: the kernel's own read-ahead follows the
        // reads after it, and a whole Engram table (100 GB) would evict
        // the page cache.
        let end = e.end.min(self.map.len()).min(start + PREFETCH_BYTES);
        if end > start {
            // Advice only: an error changes nothing but the speed.
            let _ = self
                .map
                .advise_range(memmap2::Advice::WillNeed, start, end - start);
        }
    }

    /// See [`Checkpoint::release`]. The range is widened to whole pages;
    /// a page shared with a neighbour is only read again if needed.
    fn release(&self, name: &str) {
        self.release_range(name, 0..usize::MAX);
    }

    /// Bytes `range` of tensor `name` released as [`Shard::release`] does
    /// (the range clipped to the tensor).
    fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        let Some(e) = self.tensors.get(name) else {
            return;
        };
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = e.start.saturating_add(range.start).min(e.end) / page * page;
        let end = e
            .end
            .min(e.start.saturating_add(range.end))
            .min(self.map.len());
        if end > start {
            // SAFETY: the map is a read-only shared map of a file: dropped
            // pages read back from the file, unchanged, on the next access
            // (no private copy is lost, which is what makes DontNeed unsafe
            // in general).
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                )
            };
        }
    }

    /// The names of the tensors it holds (in no particular order).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// A view of tensor `name`, if the shard holds it.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let (name, e) = self.tensors.get_key_value(name)?;
        Some(TensorView {
            name,
            file: &self.path,
            dtype: e.dtype,
            shape: &e.shape,
            // In bounds: checked against the file's length at open.
            bytes: &self.map[e.start..e.end],
        })
    }
}

/// One header entry, checked: a known dtype, a shape of non-negative
/// integers, `data_offsets` that hold exactly `shape × dtype` bytes inside
/// the file.
fn parse_entry(v: &serde_json::Value, data_start: u64, len: u64) -> Result<Entry, String> {
    let dtype_s = v
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or("no dtype string")?;
    let dtype = Dtype::parse(dtype_s).ok_or_else(|| format!("unknown dtype {dtype_s:?}"))?;
    let shape: Vec<u64> = v
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or("no shape array")?
        .iter()
        .map(|d| {
            d.as_u64()
                .ok_or_else(|| format!("shape entry {d} is not a size"))
        })
        .collect::<Result<_, _>>()?;
    let offs = v
        .get("data_offsets")
        .and_then(|s| s.as_array())
        .filter(|a| a.len() == 2)
        .ok_or("no data_offsets pair")?;
    let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
        (Some(b), Some(e)) if b <= e => (b, e),
        _ => return Err(format!("data_offsets {offs:?} are not an ordered pair")),
    };
    let need = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    if e - b != need {
        return Err(format!(
            "data_offsets [{b}, {e}] hold {} bytes, but {dtype_s} {shape:?} needs {need}",
            e - b
        ));
    }
    let end = data_start
        .checked_add(e)
        .filter(|&end| end <= len)
        .ok_or_else(|| {
            format!(
                "data ends at byte {} but the file has {len} bytes (truncated?)",
                data_start as u128 + e as u128
            )
        })?;
    Ok(Entry {
        dtype,
        shape,
        start: (data_start + b) as usize,
        end: end as usize,
    })
}

/// One tensor of a shard: its dtype, stored shape and bytes (row-major,
/// little-endian), with the names an error needs.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub file: &'a Path,
    pub dtype: Dtype,
    pub shape: &'a [u64],
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// An error about this tensor, naming its shard and its name.
    pub fn error(&self, msg: impl Into<String>) -> ConvertError {
        tensor_err(self.file, self.name, msg.into())
    }

    /// Elements stored.
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }
}

/// A checkpoint folder: `config.json`, and every shard of the index mapped
/// with every tensor located.
pub struct Checkpoint {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Shard>,
    /// Tensor name → index into `shards`.
    index: BTreeMap<String, usize>,
}

fn read_json(path: &Path) -> Result<serde_json::Value, ConvertError> {
    let text = std::fs::read(path).map_err(|e| input(path, format!("cannot read: {e}")))?;
    serde_json::from_slice(&text).map_err(|e| input(path, format!("not JSON: {e}")))
}

impl Checkpoint {
    /// Opens `dir`: reads `config.json` and the index, maps every shard the
    /// index names and checks that each holds the tensors the index gives it.
    pub fn open(dir: &Path) -> Result<Checkpoint, ConvertError> {
        let config = read_json(&dir.join(CONFIG_FILE))?;
        let index_path = dir.join(INDEX_FILE);
        let json = read_json(&index_path)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| input(&index_path, "no weight_map object".into()))?;
        let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, f) in map {
            let f = f.as_str().ok_or_else(|| {
                tensor_err(&index_path, name, "shard name is not a string".into())
            })?;
            // A bare file name: the index may not reach outside the folder.
            if f.is_empty() || f.contains(['/', '\\']) || f == "." || f == ".." {
                return Err(tensor_err(
                    &index_path,
                    name,
                    format!("shard name {f:?} is not a file in the folder"),
                ));
            }
            by_file.entry(f).or_default().push(name);
        }
        let mut shards = Vec::with_capacity(by_file.len());
        let mut index = BTreeMap::new();
        for (f, names) in by_file {
            let p = dir.join(f);
            if !p.is_file() {
                return Err(tensor_err(
                    &p,
                    names[0],
                    format!(
                        "shard missing: {INDEX_FILE} places {} tensor(s) in it",
                        names.len()
                    ),
                ));
            }
            let shard = Shard::open(&p)?;
            for n in names {
                if !shard.tensors.contains_key(n) {
                    return Err(tensor_err(
                        &p,
                        n,
                        format!("{INDEX_FILE} places it in this shard, which does not hold it"),
                    ));
                }
                index.insert(n.to_string(), shards.len());
            }
            shards.push(shard);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            index,
        })
    }

    /// The checkpoint's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// The mapped shards, in file-name order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Every tensor the index names, in name order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(|s| s.as_str())
    }

    /// Tensor `name`, if the index names it.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.shards[*self.index.get(name)?].tensor(name)
    }

    /// Asks the kernel to start reading tensor `name`'s pages now (the
    /// converter calls it for the next tensor while converting one), so a
    /// cold checkpoint is read ahead in large requests instead of page
    /// fault by page fault. Unknown names are ignored.
    pub fn prefetch(&self, name: &str) {
        if let Some(&i) = self.index.get(name) {
            self.shards[i].prefetch(name);
        }
    }

    /// Drops tensor `name`'s pages from this process (the converter calls
    /// it once a tensor is written), so memory stays a few chunks however
    /// large the checkpoint: mapped pages otherwise stay resident until
    /// the kernel needs them. Reading the tensor again reads the file
    /// again. Unknown names are ignored.
    pub fn release(&self, name: &str) {
        if let Some(&i) = self.index.get(name) {
            self.shards[i].release(name);
        }
    }

    /// Bytes `range` of tensor `name` released (see [`Checkpoint::release`]):
    /// a tensor too large to keep resident (V4.1's Engram tables, about
    /// 100 GB each) is dropped piece by piece as it is copied.
    pub fn release_range(&self, name: &str, range: std::ops::Range<usize>) {
        if let Some(&i) = self.index.get(name) {
            self.shards[i].release_range(name, range);
        }
    }

    /// Tensor `name`, or an error naming the index and the tensor.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, ConvertError> {
        self.get(name).ok_or_else(|| {
            tensor_err(
                &self.dir.join(INDEX_FILE),
                name,
                "not in the checkpoint".into(),
            )
        })
    }

    /// The FP8 block `[rows, cols]` of `config.json`'s
    /// `quantization_config.weight_block_size` (V4 Flash 128 × 128, V4.1
    /// 32 × 32).
    pub fn weight_block_size(&self) -> Result<[usize; 2], ConvertError> {
        let v = self
            .config
            .pointer("/quantization_config/weight_block_size")
            .and_then(|v| v.as_array())
            .filter(|a| a.len() == 2);
        let b: Option<Vec<usize>> = v.map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .filter(|&x| x > 0)
                .map(|x| x as usize)
                .collect()
        });
        match b.as_deref() {
            Some(&[r, c]) => Ok([r, c]),
            _ => Err(input(
                &self.dir.join(CONFIG_FILE),
                "no quantization_config.weight_block_size of two positive integers".into(),
            )),
        }
    }
}
