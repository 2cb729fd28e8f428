//! Engram rows read from the model file by position, never mapped or made
//! resident (issue 19 item 5): each table row is one positioned read of
//! `row_bytes` (264 in the real file: 256 E4M3 codes and 8 E8M0 scales),
//! behind a small LRU of hot rows, since n-gram traffic is Zipfian.
//!
//! The rows a step needs are known from its token ids alone
//! (`engram::hash_rows`), so [`EngramReader::prefetch`] can run before the
//! layers do; [`EngramReader::read`] then finds them in the cache. Within a
//! request, rows are deduplicated and read in ascending order. On Linux the
//! file is opened with `POSIX_FADV_RANDOM` so the kernel does not read ahead
//! around the scattered rows. [`EngramStats`] counts what was asked, found
//! and read.

use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::path::Path;

use lru::LruCache;

use super::config::EngramConfig;
use super::weights::V41Weights;
use crate::graph::ops::engram::decode_row;

/// What the reader did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngramStats {
    /// Tokens whose rows were requested ([`EngramReader::count_tokens`]).
    pub tokens: u64,
    /// Row lookups asked for (every column of every token and layer).
    pub rows_requested: u64,
    /// Lookups served from the hot-row cache (or a duplicate in the same request).
    pub cache_hits: u64,
    /// Bytes read from the file.
    pub bytes_read: u64,
}

/// Several readers' counts together (the server's slots, one reader each).
impl std::ops::AddAssign for EngramStats {
    fn add_assign(&mut self, o: EngramStats) {
        self.tokens += o.tokens;
        self.rows_requested += o.rows_requested;
        self.cache_hits += o.cache_hits;
        self.bytes_read += o.bytes_read;
    }
}

impl EngramStats {
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_read as f64 / self.tokens.max(1) as f64
    }

    pub fn hit_rate(&self) -> f64 {
        self.cache_hits as f64 / self.rows_requested.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug)]
struct Table {
    offset: u64,
    rows: u64,
}

/// Positioned reads of the Engram tables of one model file.
pub struct EngramReader {
    file: File,
    tables: Vec<Table>,
    row_bytes: usize,
    head_dim: usize,
    cache: LruCache<(usize, u32), Box<[u8]>>,
    stats: EngramStats,
}

impl EngramReader {
    /// Opens `path` (the model file `weights` was bound from) for row reads,
    /// with a cache of `cache_rows` rows (at least 1).
    pub fn open(
        path: impl AsRef<Path>,
        cfg: &EngramConfig,
        weights: &V41Weights,
        cache_rows: usize,
    ) -> io::Result<EngramReader> {
        let file = File::open(path)?;
        advise_random(&file);
        let len = file.metadata()?.len();
        let mut tables = Vec::with_capacity(cfg.layer_ids.len());
        for &l in &cfg.layer_ids {
            let t = weights
                .layers
                .get(l)
                .and_then(|w| w.engram.as_ref())
                .map(|e| &e.table)
                .ok_or_else(|| io::Error::other(format!("layer {l} has no Engram table")))?;
            if t.offset.saturating_add(t.n_bytes) > len {
                return Err(io::Error::other(format!(
                    "{}: the table ends past the file ({} bytes)",
                    t.name, len
                )));
            }
            tables.push(Table {
                offset: t.offset,
                rows: t.ne[1],
            });
        }
        Ok(EngramReader {
            file,
            tables,
            row_bytes: cfg.row_bytes(),
            head_dim: cfg.head_dim,
            cache: LruCache::new(NonZeroUsize::new(cache_rows.max(1)).unwrap_or(NonZeroUsize::MIN)),
            stats: EngramStats::default(),
        })
    }

    pub fn stats(&self) -> EngramStats {
        self.stats
    }

    /// Counts `n` tokens for [`EngramStats::bytes_per_token`].
    pub fn count_tokens(&mut self, n: usize) {
        self.stats.tokens += n as u64;
    }

    /// Bytes held by the cache at most.
    pub fn cache_bytes(&self) -> usize {
        self.cache.cap().get() * self.row_bytes
    }

    /// Counts the lookups of `rows` (a hit: cached already, or repeated in
    /// this request), then reads the rows not cached yet into the cache
    /// (sorted, deduplicated). A session calls it with a step's rows as soon
    /// as the step's ids are known, then [`EngramReader::decode`]s them.
    /// Ids past the table are skipped (they read as zeros).
    pub fn prefetch(&mut self, slot: usize, rows: &[u32]) -> io::Result<()> {
        let mut seen = std::collections::HashSet::new();
        for &r in rows {
            self.stats.rows_requested += 1;
            if self.cache.contains(&(slot, r)) || !seen.insert(r) {
                self.stats.cache_hits += 1;
            }
        }
        self.fetch_missing(slot, rows)
    }

    /// The rows of `rows` not cached yet, read into the cache.
    fn fetch_missing(&mut self, slot: usize, rows: &[u32]) -> io::Result<()> {
        let Some(&t) = self.tables.get(slot) else {
            return Err(io::Error::other(format!("no Engram table {slot}")));
        };
        let mut missing: Vec<u32> = rows
            .iter()
            .copied()
            .filter(|&r| (r as u64) < t.rows && !self.cache.contains(&(slot, r)))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        for r in missing {
            self.read_row(slot, t, r)?;
        }
        Ok(())
    }

    /// Reads row `r` of table `slot` (`t`) from the file into the cache.
    fn read_row(&mut self, slot: usize, t: Table, r: u32) -> io::Result<()> {
        let mut buf = vec![0u8; self.row_bytes].into_boxed_slice();
        read_at(
            &self.file,
            &mut buf,
            t.offset + r as u64 * self.row_bytes as u64,
        )?;
        self.stats.bytes_read += self.row_bytes as u64;
        self.cache.put((slot, r), buf);
        Ok(())
    }

    /// Decoded rows `rows` of table `slot`, one `head_dim` run each, into
    /// `out` (the layout the graph's `engram_rows@L` input expects). Rows
    /// past the table, or holding a NaN code or scale, read as zeros.
    pub fn read(&mut self, slot: usize, rows: &[u32], out: &mut [f32]) -> io::Result<()> {
        let hd = self.head_dim;
        if out.len() < rows.len() * hd {
            return Err(io::Error::other("output shorter than the rows asked for"));
        }
        let t = *self
            .tables
            .get(slot)
            .ok_or_else(|| io::Error::other(format!("no Engram table {slot}")))?;
        self.prefetch(slot, rows)?;
        self.decode_rows(slot, t, rows, out)
    }

    /// Decodes rows already [`EngramReader::prefetch`]ed (lookups counted
    /// there) into `out`, as [`EngramReader::read`] does; a row evicted
    /// since is read again.
    pub fn decode(&mut self, slot: usize, rows: &[u32], out: &mut [f32]) -> io::Result<()> {
        if out.len() < rows.len() * self.head_dim {
            return Err(io::Error::other("output shorter than the rows asked for"));
        }
        let t = *self
            .tables
            .get(slot)
            .ok_or_else(|| io::Error::other(format!("no Engram table {slot}")))?;
        self.decode_rows(slot, t, rows, out)
    }

    fn decode_rows(
        &mut self,
        slot: usize,
        t: Table,
        rows: &[u32],
        out: &mut [f32],
    ) -> io::Result<()> {
        let hd = self.head_dim;
        for (i, &r) in rows.iter().enumerate() {
            let o = &mut out[i * hd..(i + 1) * hd];
            o.fill(0.0);
            if r as u64 >= t.rows {
                continue;
            }
            // A row evicted by this very request (cache smaller than it) is read again.
            if !self.cache.contains(&(slot, r)) {
                self.read_row(slot, t, r)?;
            }
            if let Some(raw) = self.cache.get(&(slot, r)) {
                if decode_row(raw, hd, o).is_none() {
                    o.fill(0.0);
                }
            }
        }
        Ok(())
    }
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, offset)
}

#[cfg(not(unix))]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

/// Drops the Engram tables' pages of `m`'s file from the OS page cache
/// (`POSIX_FADV_DONTNEED` over each table; Linux, best effort, elsewhere
/// nothing), so the next row reads come from the disk: what a real-size
/// table, far larger than RAM, does for rows outside the hot set.
pub fn drop_table_pages(m: &super::V41ModelFile) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let f = File::open(m.file.path())?;
        for e in m.weights.layers.iter().filter_map(|l| l.engram.as_ref()) {
            // SAFETY: a valid open descriptor; the call only gives advice.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    e.table.offset as libc::off_t,
                    e.table.n_bytes as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = m;
    Ok(())
}

/// Scattered row reads: tell Linux not to read ahead (best effort).
fn advise_random(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a valid open descriptor; the call only sets an access hint.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}
