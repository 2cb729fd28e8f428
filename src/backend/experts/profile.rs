//! The expert popularity profile: how often each routed layer's router
//! chose each expert, recorded by the cache while it serves and kept in a
//! small text file next to the model (`<model>.experts-profile`), so that
//! the next start preloads each layer's most used experts first
//! (`--ssd-streaming-preload-experts N`: the N most used per layer).
//!
//! The file is versioned, tied to one model file (its length and a hash of
//! its header, metadata and tensor table, plus the routed layers' shapes)
//! and ends with a checksum of everything before it. A file that does not
//! parse, fails the checksum or names another model is ignored (the caller
//! logs why and falls back to the order without a profile); it is never
//! half-used. Writes go to a temporary file renamed over the old one, so a
//! crash mid-write leaves the previous profile.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use super::ExpertLayer;
use crate::gguf::GgufFile;

/// First line of a profile file; the number is the format version.
const MAGIC: &str = "ds4-expert-profile 1";

/// Header bytes hashed into the model fingerprint (the whole header when
/// shorter: metadata and tensor table identify the model's layout).
const HEADER_HASH_BYTES: u64 = 1 << 20;

/// Which model a profile belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelKey {
    pub file_bytes: u64,
    pub fingerprint: u64,
    pub layers: usize,
    pub n_expert: usize,
}

impl ModelKey {
    /// The key of `file` with its routed `layers`.
    pub fn of(file: &GgufFile, layers: &[ExpertLayer]) -> ModelKey {
        let mut h = Fnv::new();
        h.bytes(&file.file_len().to_le_bytes());
        let head = file
            .data_offset()
            .min(file.file_len())
            .min(HEADER_HASH_BYTES);
        h.bytes(file.raw_bytes(0, head));
        for l in layers {
            for p in &l.parts {
                h.bytes(&p.offset.to_le_bytes());
                h.bytes(&p.n_bytes.to_le_bytes());
            }
            h.bytes(&(l.n_expert as u64).to_le_bytes());
            h.bytes(&(l.k as u64).to_le_bytes());
        }
        ModelKey {
            file_bytes: file.file_len(),
            fingerprint: h.0,
            layers: layers.len(),
            n_expert: layers.iter().map(|l| l.n_expert).max().unwrap_or(0),
        }
    }
}

/// Uses per expert of every routed layer (`counts[layer][expert]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub counts: Vec<Vec<u64>>,
}

impl Profile {
    /// Tokens' worth of choices recorded (every layer's sum, the largest).
    pub fn total(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.iter().sum::<u64>())
            .max()
            .unwrap_or(0)
    }
}

/// Where the profile of the model at `model` is kept by default.
pub fn default_path(model: &Path) -> PathBuf {
    let mut s = model.as_os_str().to_owned();
    s.push(".experts-profile");
    PathBuf::from(s)
}

/// The profile at `path` for the model `key`: `Ok(None)` when there is no
/// file, `Err(why)` when there is one that cannot be used (unreadable,
/// corrupt, another version or another model).
pub fn load(path: &Path, key: &ModelKey) -> Result<Option<Profile>, String> {
    let text = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    parse(&text, key)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a profile file's bytes and checks them against `key`.
pub fn parse(text: &[u8], key: &ModelKey) -> Result<Profile, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not a text file (corrupt)".to_string())?;
    let body_end = text
        .rfind("end fnv=")
        .ok_or("no checksum line (truncated or corrupt)")?;
    let (body, tail) = text.split_at(body_end);
    let sum = tail
        .trim_end()
        .strip_prefix("end fnv=")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or("a bad checksum line (corrupt)")?;
    let mut h = Fnv::new();
    h.bytes(body.as_bytes());
    if h.0 != sum {
        return Err("the checksum does not match (corrupt)".into());
    }
    let mut lines = body.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("not a profile of this version (want {MAGIC:?})"));
    }
    let model = lines.next().ok_or("no model line")?;
    let field = |name: &str| -> Result<u64, String> {
        let v = model
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("the model line lacks {name}"))?;
        if name == "fingerprint" {
            u64::from_str_radix(v, 16).map_err(|_| format!("a bad {name}"))
        } else {
            v.parse().map_err(|_| format!("a bad {name}"))
        }
    };
    let got = ModelKey {
        file_bytes: field("bytes")?,
        fingerprint: field("fingerprint")?,
        layers: field("layers")? as usize,
        n_expert: field("experts")? as usize,
    };
    if got != *key {
        return Err(format!(
            "recorded for another model ({} bytes, fingerprint {:016x}; this one is {} bytes, {:016x})",
            got.file_bytes, got.fingerprint, key.file_bytes, key.fingerprint
        ));
    }
    let mut counts = Vec::with_capacity(key.layers);
    for (i, line) in lines.enumerate() {
        let row = line
            .strip_prefix(&format!("layer {i}:"))
            .ok_or_else(|| format!("line {} is not layer {i}", i + 3))?;
        let c: Vec<u64> = row
            .split_whitespace()
            .map(|w| w.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("layer {i}: a bad count"))?;
        if c.len() != key.n_expert {
            return Err(format!(
                "layer {i}: {} counts for {} experts",
                c.len(),
                key.n_expert
            ));
        }
        counts.push(c);
    }
    if counts.len() != key.layers {
        return Err(format!(
            "{} layers for a model with {}",
            counts.len(),
            key.layers
        ));
    }
    Ok(Profile { counts })
}

/// The file's text for `profile` of the model `key`.
pub fn render(profile: &Profile, key: &ModelKey) -> String {
    let mut s = format!(
        "{MAGIC}\nmodel bytes={} fingerprint={:016x} layers={} experts={}\n",
        key.file_bytes, key.fingerprint, key.layers, key.n_expert
    );
    for (i, c) in profile.counts.iter().enumerate() {
        let _ = write!(s, "layer {i}:");
        for n in c {
            let _ = write!(s, " {n}");
        }
        s.push('\n');
    }
    let mut h = Fnv::new();
    h.bytes(s.as_bytes());
    let _ = writeln!(s, "end fnv={:016x}", h.0);
    s
}

/// Writes the profile to `path` through a temporary file and a rename.
pub fn save(path: &Path, profile: &Profile, key: &ModelKey) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, render(profile, key))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// 64-bit FNV-1a: a checksum and a fingerprint, not a defence against
/// someone forging a file.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ModelKey {
        ModelKey {
            file_bytes: 1234,
            fingerprint: 0xdead_beef,
            layers: 2,
            n_expert: 4,
        }
    }

    #[test]
    fn a_profile_round_trips_and_a_damaged_one_is_refused() {
        let p = Profile {
            counts: vec![vec![5, 0, 7, 1], vec![0, 0, 0, 9]],
        };
        let text = render(&p, &key());
        assert_eq!(parse(text.as_bytes(), &key()).unwrap(), p);
        assert_eq!(p.total(), 13);
        // One digit changed: the checksum catches it.
        let bad = text.replacen("layer 0: 5", "layer 0: 6", 1);
        assert!(parse(bad.as_bytes(), &key())
            .unwrap_err()
            .contains("checksum"));
        // Cut short.
        let cut = &text.as_bytes()[..text.len() / 2];
        assert!(parse(cut, &key()).is_err());
        // Another model.
        let other = ModelKey {
            fingerprint: 1,
            ..key()
        };
        assert!(parse(text.as_bytes(), &other)
            .unwrap_err()
            .contains("another model"));
        // Binary garbage.
        assert!(parse(&[0xff, 0xfe, 0], &key()).is_err());
    }
}
