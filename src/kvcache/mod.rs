//! The disk KV cache (KVCACHE.md): checkpoints of the live session in ds4's
//! KVC files, named by the SHA-1 of the rendered prefix they hold.
//!
//! * [`file`]: one file — header, text, session payload, KTM map; crash-safe
//!   writes, checked reads.
//! * [`store`]: the folder — store, lookup + load, eviction under the budget.
//! * [`policy`]: ds4's flags, the cold boundary, the continued frontier.
//! * [`moments`]: the worker's calls at each save moment (cold, continued,
//!   evict, shutdown) and at the disk lookup rule.
//! * [`toolmap`]: which tool ids a checkpoint's KTM map carries.
//! * [`guard`]: the folder's permission check and the safe opens (no
//!   symlinks, no FIFOs, temp files created new).
//!
//! The server's worker owns one [`SaveMoments`] (around a [`DiskCache`] from
//! [`DiskCache::open`]) beside its live session. The CLI and
//! `ds4-bench` use [`save_file`] / [`load_file`]: the same format and code
//! for one file at a path of the user's choosing.

pub mod file;
pub mod guard;
pub mod moments;
pub mod policy;
pub mod store;
pub mod toolmap;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use crate::session::{Session, SessionError};

use crate::model::Arch;
pub use file::{KtmEntry, KvcHeader, SaveReason};
pub use moments::{DiskResume, SaveMoments, VisibleKey};
pub use policy::{ContinuedSaves, KvCacheConfig};
pub use store::{CacheKey, DiskCache, DiskHit, LookupOutcome, StoreOutcome};
pub use toolmap::{tool_map_for, NoToolIds, ToolIds};

#[derive(Debug, Error)]
pub enum KvCacheError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kv cache: {0}")]
    Config(String),
    /// The folder is not safe to load from (`guard::check_folder`).
    #[error("{0}")]
    UnsafeFolder(String),
    #[error("{path}: not a usable KVC checkpoint: {why}")]
    BadFile { path: PathBuf, why: String },
    #[error(transparent)]
    Session(#[from] SessionError),
}

impl KvCacheError {
    fn io(path: &Path, source: std::io::Error) -> KvCacheError {
        KvCacheError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The model family as log lines name it.
pub fn arch_name(a: Arch) -> &'static str {
    match a {
        Arch::V4 => "DeepSeek V4 (deepseek4)",
        Arch::V41 => "DeepSeek V4.1 (deepseek41)",
    }
}

/// Counters for the server's `/metrics`. Shared (`Arc`) and updated by the
/// cache as it works.
#[derive(Debug, Default)]
pub struct KvCacheMetrics {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub saves: AtomicU64,
    pub bytes_written: AtomicU64,
    pub evictions: AtomicU64,
    pub save_failures: AtomicU64,
    pub load_failures: AtomicU64,
    /// Files removed because they can never load (truncated, checksum, text hash).
    pub corrupt_removed: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub saves: u64,
    pub bytes_written: u64,
    pub evictions: u64,
    pub save_failures: u64,
    pub load_failures: u64,
    pub corrupt_removed: u64,
}

impl KvCacheMetrics {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            hits: g(&self.hits),
            misses: g(&self.misses),
            saves: g(&self.saves),
            bytes_written: g(&self.bytes_written),
            evictions: g(&self.evictions),
            save_failures: g(&self.save_failures),
            load_failures: g(&self.load_failures),
            corrupt_removed: g(&self.corrupt_removed),
        }
    }
}

impl MetricsSnapshot {
    /// Prometheus text exposition lines (counters).
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        for (name, help, v) in [
            (
                "ds4_kv_disk_hits_total",
                "disk checkpoints loaded",
                self.hits,
            ),
            (
                "ds4_kv_disk_misses_total",
                "lookups that loaded nothing",
                self.misses,
            ),
            ("ds4_kv_disk_saves_total", "checkpoints written", self.saves),
            (
                "ds4_kv_disk_bytes_written_total",
                "bytes of checkpoints written",
                self.bytes_written,
            ),
            (
                "ds4_kv_disk_evictions_total",
                "checkpoints deleted for the budget",
                self.evictions,
            ),
            (
                "ds4_kv_disk_save_failures_total",
                "failed checkpoint writes",
                self.save_failures,
            ),
            (
                "ds4_kv_disk_load_failures_total",
                "chosen checkpoints that did not load",
                self.load_failures,
            ),
            (
                "ds4_kv_disk_corrupt_removed_total",
                "corrupt checkpoints removed",
                self.corrupt_removed,
            ),
        ] {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        }
        s
    }
}

/// Writes the whole session as one KVC file at `path` (crash safe), with
/// `text` as its cache text (normally the decoded tokens). For the CLI and
/// ds4-bench; the server uses [`DiskCache::store`].
pub fn save_file(
    path: &Path,
    session: &Session,
    text: &[u8],
    reason: SaveReason,
) -> Result<u64, KvCacheError> {
    let payload = session.save_snapshot()?;
    let n = session.tokens().len();
    if u32::try_from(text.len()).is_err() || u32::try_from(n).is_err() {
        return Err(KvCacheError::Config(
            "cache text or token count over 4 GiB".into(),
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let c = file::NewCheckpoint {
        header: fresh_header(
            session,
            session.routed_quant_bits(),
            reason,
            now,
            text,
            &payload,
        ),
        text,
        payload: &payload,
        tool_map: &[],
    };
    file::write_atomic(path, &c, None).map_err(|e| KvCacheError::io(path, e))
}

/// The header of a new checkpoint of `session` (all its tokens) written at
/// `now`, with cache text `text` and snapshot `payload`; no extensions.
fn fresh_header(
    session: &Session,
    quant_bits: u8,
    reason: SaveReason,
    now: u64,
    text: &[u8],
    payload: &[u8],
) -> KvcHeader {
    KvcHeader {
        quant_bits,
        arch: session.arch(),
        reason,
        ext_flags: 0,
        tokens: session.tokens().len() as u32,
        hits: 0,
        ctx: session.ctx() as u32,
        created: now,
        last_used: now,
        payload_bytes: payload.len() as u64,
        checksum: Some(file::checksum(text, payload)),
    }
}

/// Loads a KVC file written by [`save_file`], [`DiskCache::store`] or ds4
/// into `session`; returns its header and cache text. On error the session
/// is left empty if the payload was tried, untouched otherwise.
pub fn load_file(path: &Path, session: &mut Session) -> Result<(KvcHeader, Vec<u8>), KvCacheError> {
    let bad = |why: String| KvCacheError::BadFile {
        path: path.to_path_buf(),
        why,
    };
    // A file named like a checkpoint has its text checked against the name.
    let sha = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(file::checkpoint_stem)
        .unwrap_or_default();
    // The user named this path, so a symlink is followed here, once: the
    // reads below go to the resolved file and never follow one themselves.
    let real = std::fs::canonicalize(path).map_err(|e| KvCacheError::io(path, e))?;
    let e = match file::probe(&real, &sha).map_err(|e| KvCacheError::io(path, e))? {
        file::Probe::Valid(e) => e,
        file::Probe::BadHeader => return Err(bad("invalid KVC header".into())),
        file::Probe::Truncated {
            declared, actual, ..
        } => {
            return Err(bad(format!(
                "truncated: {actual} bytes, header says {declared}"
            )))
        }
    };
    if e.header.arch != session.arch() {
        return Err(bad(format!(
            "its header says it holds a {} session; the loaded model is {}: refused, nothing loaded",
            arch_name(e.header.arch),
            arch_name(session.arch())
        )));
    }
    let (header, c) = file::read_contents(&e, true, usize::MAX).map_err(|e| bad(e.to_string()))?;
    session.load_snapshot(&c.payload)?;
    let got = session.tokens().len();
    if got != header.tokens as usize {
        session.reset();
        return Err(bad(format!(
            "payload holds {got} tokens, header says {}",
            header.tokens
        )));
    }
    Ok((header, c.text))
}
