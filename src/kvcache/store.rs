//! The checkpoint folder (KVCACHE.md §3, §5, §7, §8): store the live
//! session, find and load the longest stored prefix of a rendered prompt,
//! and keep the folder under its byte budget. There is no index: every
//! lookup and eviction re-scans the folder, as ds4 does, so files written by
//! ds4 and by us mix freely.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::file::{
    self, checkpoint_stem, read_contents, sha1_hex, ContentError, Entry, KtmEntry, KvcHeader,
    NewCheckpoint, Probe, SaveReason, EXT_RESPONSES_TEXT, EXT_THINKING_TEXT, EXT_TOOL_MAP,
};
use super::guard::{self, FileId, Removal};
use super::{KvCacheConfig, KvCacheError, KvCacheMetrics};
use crate::model::Arch;
use crate::session::Session;

/// What the cache text of a checkpoint is (§4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKey {
    /// The decoded tokens: the exact rendered bytes of the prefix.
    Tokens,
    /// The Responses visible transcript remembered at the live frontier.
    ResponsesVisible,
    /// The thinking visible transcript remembered at the live frontier.
    ThinkingVisible,
}

impl CacheKey {
    fn ext_flag(self) -> u8 {
        match self {
            CacheKey::Tokens => 0,
            CacheKey::ResponsesVisible => EXT_RESPONSES_TEXT,
            CacheKey::ThinkingVisible => EXT_THINKING_TEXT,
        }
    }
}

/// Result of a store request. Nothing here is an error for the caller: the
/// server keeps serving whatever happened (the log line says why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    Stored {
        sha: String,
        bytes: u64,
    },
    /// A compatible file with the same text was already there.
    AlreadyStored {
        sha: String,
    },
    /// Not stored by policy (too short, over budget, no tokens).
    Skipped(String),
    /// The write failed (disk full, permissions); the folder is unchanged.
    Failed(String),
}

/// A checkpoint loaded into the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskHit {
    pub sha: String,
    /// Tokens now in the session (the payload's).
    pub tokens: usize,
    /// Bytes of the rendered prompt the file covered: tokenize only the rest.
    pub text_bytes: usize,
    pub ext_flags: u8,
    pub reason: SaveReason,
    /// KTM entries, for the tool memory.
    pub tool_map: Vec<KtmEntry>,
    /// Deleted after loading (longer than the cold maximum, §7.7).
    pub consumed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupOutcome {
    Hit(DiskHit),
    Miss,
    /// The chosen file did not load; the session is empty if `invalidated`.
    Failed {
        sha: String,
        reason: String,
        removed: bool,
        invalidated: bool,
    },
}

type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// The disk KV cache of one server (or CLI) process.
pub struct DiskCache {
    dir: PathBuf,
    cfg: KvCacheConfig,
    quant_bits: u8,
    metrics: Arc<KvCacheMetrics>,
    write_limit: Option<u64>,
    fixed_now: Option<u64>,
    log: Logger,
    /// Set while writes to the folder fail (read-only, full): the first
    /// failure is logged, the rest only counted, until a write works again.
    writes_failing: AtomicBool,
}

/// A temp file from another host is its writer's until it is this old
/// (its pid means nothing here; a live writer finishes in seconds).
pub const STALE_TEMP_SECONDS: u64 = 3600;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether a process with this id exists (a temp file's writer).
fn process_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: kill with signal 0 only checks for existence.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

impl DiskCache {
    /// Opens the cache named by `cfg.kv_disk_dir` (`Ok(None)` when the flag
    /// is absent): creates the folder (mode 0700, parents too), refuses it
    /// if other users can write it ([`guard::check_folder`]), removes temp
    /// files of writers that died, and runs eviction. `quant_bits` is the
    /// routed-expert quant of the loaded model ([`crate::model::AnyModel::routed_quant_bits`]).
    pub fn open(cfg: &KvCacheConfig, quant_bits: u8) -> Result<Option<DiskCache>, KvCacheError> {
        let Some(dir) = cfg.kv_disk_dir.clone() else {
            return Ok(None);
        };
        cfg.validate().map_err(KvCacheError::Config)?;
        if !matches!(quant_bits, 2 | 4) {
            return Err(KvCacheError::Config(format!(
                "routed-expert quant bits {quant_bits}: KVC files record 2 or 4"
            )));
        }
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(&dir).map_err(|e| KvCacheError::io(&dir, e))?;
        // The folder is checked and then used by its resolved path, so a
        // symlink given as --kv-disk-dir cannot be re-pointed afterwards.
        let dir = fs::canonicalize(&dir).map_err(|e| KvCacheError::io(&dir, e))?;
        guard::check_folder(&dir).map_err(KvCacheError::UnsafeFolder)?;
        let c = DiskCache {
            dir,
            cfg: cfg.clone(),
            quant_bits,
            metrics: Arc::new(KvCacheMetrics::default()),
            write_limit: None,
            fixed_now: None,
            log: Arc::new(|m| eprintln!("ds4: kv cache: {m}")),
            writes_failing: AtomicBool::new(false),
        };
        c.remove_stale_temps();
        c.log_odd_entries();
        c.evict(None);
        Ok(Some(c))
    }

    /// Sends log lines to `f` instead of stderr.
    pub fn with_logger(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> DiskCache {
        self.log = Arc::new(f);
        self
    }

    /// Makes every write fail with ENOSPC after `limit` bytes (a full disk
    /// without privileges, for tests); `None` restores normal writes.
    pub fn set_write_limit(&mut self, limit: Option<u64>) {
        self.write_limit = limit;
    }

    /// Uses `now` (Unix seconds) instead of the clock (eviction tests).
    pub fn set_now(&mut self, now: Option<u64>) {
        self.fixed_now = now;
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    /// Counters for `/metrics` (shared; they keep counting).
    pub fn metrics(&self) -> Arc<KvCacheMetrics> {
        self.metrics.clone()
    }

    fn now(&self) -> u64 {
        self.fixed_now.unwrap_or_else(unix_now)
    }

    fn log(&self, m: &str) {
        (self.log)(m)
    }

    fn path_for(&self, sha: &str) -> PathBuf {
        self.dir.join(format!("{sha}.kv"))
    }

    /// Removes temp files whose writer is gone: on this host, a dead pid
    /// (ds4's names carry no host and are judged the same way); from
    /// another host sharing the folder, an age over [`STALE_TEMP_SECONDS`].
    fn remove_stale_temps(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for de in rd.flatten() {
            if !is_regular(&de) {
                continue;
            }
            let name = de.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(t) = file::parse_temp_name(name) else {
                continue;
            };
            let stale = match t.host.as_deref() {
                None => t.pid != std::process::id() && !process_alive(t.pid),
                Some(h) if h == file::host_tag() => {
                    t.pid != std::process::id() && !process_alive(t.pid)
                }
                Some(_) => de
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|m| now.duration_since(m).ok())
                    .is_some_and(|age| age.as_secs() > STALE_TEMP_SECONDS),
            };
            if stale && fs::remove_file(de.path()).is_ok() {
                self.log(&format!("removed {name} left by a writer that died"));
            }
        }
    }

    /// A write to the folder failed: logged the first time, then only
    /// counted until [`DiskCache::write_worked`].
    fn write_failed(&self, what: &str) {
        if !self.writes_failing.swap(true, Ordering::Relaxed) {
            self.log(&format!(
                "{what}; serving goes on without disk saves (loads still work); \
                 further write failures are counted in ds4_kv_disk_save_failures_total, \
                 not logged, until a write succeeds"
            ));
        }
    }

    fn write_worked(&self) {
        if self.writes_failing.swap(false, Ordering::Relaxed) {
            self.log("writes to the cache folder work again");
        }
    }

    /// Whether the last write to the folder failed.
    pub fn writes_failing(&self) -> bool {
        self.writes_failing.load(Ordering::Relaxed)
    }

    /// One log line at open per checkpoint-named entry that is not a
    /// regular file (a symlink, FIFO, folder): the scan skips them silently
    /// afterwards, and nothing ever opens, follows or deletes them.
    fn log_odd_entries(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        for de in rd.flatten() {
            let name = de.file_name();
            if name.to_str().and_then(checkpoint_stem).is_none() || is_regular(&de) {
                continue;
            }
            let kind = de
                .file_type()
                .map(|t| guard::kind_name(&t))
                .unwrap_or("unreadable");
            self.log(&format!(
                "ignoring {}: {kind}, not a regular file (never opened, followed or deleted)",
                de.path().display()
            ));
        }
    }

    /// Removes a file that can never load, with a log line; only if the
    /// name still holds the file found bad (`id`) and no one is reading it.
    fn remove_corrupt(&self, path: &Path, id: FileId, why: &str) -> bool {
        let r = guard::remove_unread(path, id);
        let ok = matches!(r, Ok(Removal::Removed));
        if ok {
            KvCacheMetrics::add(&self.metrics.corrupt_removed, 1);
            let _ = file::sync_dir(&self.dir);
        }
        let what = match r {
            Ok(Removal::Removed) => "removed",
            Ok(Removal::Gone) => "already gone:",
            Ok(Removal::Busy) => "kept (being read elsewhere)",
            Ok(Removal::Replaced) => "kept (replaced since):",
            Err(_) => "could not remove",
        };
        self.log(&format!("{what} {}: {why}", path.display()));
        ok
    }

    /// All checkpoints with a valid header and the size it declares (§3).
    /// Truncated files (a valid header but shorter) can never load and are
    /// removed; files with an invalid header are ignored and kept, as in ds4.
    /// Only regular files count: a symlink, FIFO or folder under a
    /// checkpoint name is skipped (`probe` re-checks on the open descriptor,
    /// in case one was swapped in after the directory read).
    pub fn scan(&self) -> Vec<Entry> {
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return out;
        };
        for de in rd.flatten() {
            if !is_regular(&de) {
                continue;
            }
            let name = de.file_name();
            let Some(sha) = name.to_str().and_then(checkpoint_stem) else {
                continue;
            };
            let path = de.path();
            match file::probe(&path, &sha) {
                Ok(Probe::Valid(e)) => out.push(e),
                Ok(Probe::Truncated {
                    declared,
                    actual,
                    id,
                }) => {
                    self.remove_corrupt(
                        &path,
                        id,
                        &format!("truncated ({actual} bytes, header says {declared})"),
                    );
                }
                Ok(Probe::BadHeader) | Err(_) => {}
            }
        }
        out
    }

    fn quant_ok(&self, h: &KvcHeader) -> bool {
        !self.cfg.kv_cache_reject_different_quant || h.quant_bits == self.quant_bits
    }

    /// `--kv-cache-require-checksum`: only files with our CRC mark load.
    fn checksum_ok(&self, h: &KvcHeader) -> bool {
        !self.cfg.kv_cache_require_checksum || h.checksum.is_some()
    }

    /// Stores the whole live session under `text` (§5 steps 1–6). The caller
    /// has synced the session to exactly the tokens to store; `text` is their
    /// decoded bytes, or a visible transcript for `key` ≠ `Tokens`.
    pub fn store(
        &self,
        session: &Session,
        text: &[u8],
        key: CacheKey,
        reason: SaveReason,
        tool_map: &[KtmEntry],
    ) -> StoreOutcome {
        let n = session.tokens().len();
        let r = reason.name();
        if n == 0 || n < self.cfg.kv_cache_min_tokens {
            return StoreOutcome::Skipped(format!(
                "{n} tokens < --kv-cache-min-tokens {}",
                self.cfg.kv_cache_min_tokens
            ));
        }
        if u32::try_from(text.len()).is_err() || u32::try_from(n).is_err() {
            return StoreOutcome::Skipped("cache text or token count over 4 GiB".into());
        }
        let sha = sha1_hex(text);
        let path = self.path_for(&sha);
        if tool_map.is_empty()
            && self.existing_compatible(&path, &sha, text, session.ctx(), session.arch())
        {
            return StoreOutcome::AlreadyStored { sha };
        }
        let payload = match session.save_snapshot() {
            Ok(p) => p,
            Err(e) => {
                KvCacheMetrics::add(&self.metrics.save_failures, 1);
                self.log(&format!("store failed ({r}): {e}"));
                return StoreOutcome::Failed(e.to_string());
            }
        };
        let now = self.now();
        let mut ext = key.ext_flag();
        if !tool_map.is_empty() {
            ext |= EXT_TOOL_MAP;
        }
        let c = NewCheckpoint {
            header: KvcHeader {
                ext_flags: ext,
                ..super::fresh_header(session, self.quant_bits, reason, now, text, &payload)
            },
            text,
            payload: &payload,
            tool_map,
        };
        let bytes = c.file_bytes();
        let required = bytes + bytes.div_ceil(100);
        let budget = self.cfg.budget_bytes();
        if required > budget {
            let m = format!(
                "skipped tokens={n} reason={r}: file {:.2} MiB ({:.2} MiB with 1% slack) exceeds the budget {:.2} MiB",
                mib(bytes),
                mib(required),
                mib(budget)
            );
            self.log(&m);
            return StoreOutcome::Skipped(m);
        }
        let t0 = std::time::Instant::now();
        match file::write_atomic(&path, &c, self.write_limit) {
            Ok(bytes) => {
                self.write_worked();
                KvCacheMetrics::add(&self.metrics.saves, 1);
                KvCacheMetrics::add(&self.metrics.bytes_written, bytes);
                self.log(&format!(
                    "stored tokens={n} reason={r} key={}{} size={:.2} MiB save={:.1} ms file={}",
                    match key {
                        CacheKey::Tokens => "token-text",
                        CacheKey::ResponsesVisible => "responses-visible",
                        CacheKey::ThinkingVisible => "thinking-visible",
                    },
                    if tool_map.is_empty() {
                        String::new()
                    } else {
                        format!(" tool_ids={}", tool_map.len())
                    },
                    mib(bytes),
                    t0.elapsed().as_secs_f64() * 1e3,
                    path.display()
                ));
                self.evict(Some(&sha));
                StoreOutcome::Stored { sha, bytes }
            }
            Err(e) => {
                KvCacheMetrics::add(&self.metrics.save_failures, 1);
                self.write_failed(&format!(
                    "store failed ({r}): {e}; the cache folder is unchanged"
                ));
                StoreOutcome::Failed(e.to_string())
            }
        }
    }

    /// §5 step 4: a file of that name with the same text, usable by this
    /// session (quant, ctx), makes the store a no-op.
    fn existing_compatible(
        &self,
        path: &Path,
        sha: &str,
        text: &[u8],
        ctx: usize,
        arch: Arch,
    ) -> bool {
        let Ok(Probe::Valid(e)) = file::probe(path, sha) else {
            return false;
        };
        if e.header.arch != arch {
            return false;
        }
        // An unmarked file would never load under --kv-cache-require-checksum:
        // replace it with a marked one rather than keep it.
        if !self.quant_ok(&e.header) || e.header.ctx as usize > ctx || !self.checksum_ok(&e.header)
        {
            return false;
        }
        matches!(read_contents(&e, false, text.len()), Ok((_, c)) if c.text == text)
    }

    /// Finds the longest stored prefix of `rendered` and loads it into
    /// `session` (§7). On `Hit`, the caller tokenizes
    /// `rendered[hit.text_bytes..]` and appends it to the session's tokens.
    pub fn lookup(&self, session: &mut Session, rendered: &[u8]) -> LookupOutcome {
        // A file replaced or deleted by another replica between the scan
        // and the read is not a failure of the folder: scan again.
        let mut r = self.lookup_inner(session, rendered);
        for _ in 0..2 {
            match &r {
                LookupOutcome::Failed {
                    reason,
                    invalidated: false,
                    ..
                } if reason == REPLACED => r = self.lookup_inner(session, rendered),
                _ => break,
            }
        }
        match &r {
            LookupOutcome::Hit(_) => KvCacheMetrics::add(&self.metrics.hits, 1),
            LookupOutcome::Miss => KvCacheMetrics::add(&self.metrics.misses, 1),
            LookupOutcome::Failed { .. } => {
                KvCacheMetrics::add(&self.metrics.misses, 1);
                KvCacheMetrics::add(&self.metrics.load_failures, 1);
            }
        }
        r
    }

    fn lookup_inner(&self, session: &mut Session, rendered: &[u8]) -> LookupOutcome {
        let ctx = session.ctx();
        // Checkpoints of the other model family (V4 / V4.1) are refused by
        // their header: never candidates, never read, never removed.
        let arch = session.arch();
        let mut cands: Vec<Entry> = self
            .scan()
            .into_iter()
            .filter(|e| {
                e.text_bytes as usize <= rendered.len()
                    && e.header.tokens as usize >= self.cfg.kv_cache_min_tokens
                    && e.header.ctx as usize <= ctx
                    && e.header.arch == arch
                    && self.quant_ok(&e.header)
            })
            .collect();
        cands.sort_by_key(|e| std::cmp::Reverse((e.text_bytes, e.header.tokens)));
        let mut prefix_sha: HashMap<u32, String> = HashMap::new();
        let Some(e) = cands.into_iter().find(|e| {
            let want = prefix_sha
                .entry(e.text_bytes)
                .or_insert_with(|| sha1_hex(&rendered[..e.text_bytes as usize]));
            if *want != e.sha {
                return false;
            }
            // Checked after the prefix match so only a file that would
            // have loaded earns a log line; a shorter marked one may follow.
            if !self.checksum_ok(&e.header) {
                self.log(&format!(
                    "skipped file={}: no checksum mark (written or touched by ds4) and --kv-cache-require-checksum is set",
                    e.path.display()
                ));
                return false;
            }
            true
        }) else {
            return LookupOutcome::Miss;
        };
        let fail = |reason: String, removed: bool, invalidated: bool| {
            self.log(&format!(
                "load failed file={}: {reason}{}",
                e.path.display(),
                if removed { " (removed)" } else { " (kept)" }
            ));
            LookupOutcome::Failed {
                sha: e.sha.clone(),
                reason,
                removed,
                invalidated,
            }
        };
        let (header, contents) = match read_contents(&e, true, rendered.len()) {
            Ok(x) => x,
            Err(ContentError::Replaced) => {
                return LookupOutcome::Failed {
                    sha: e.sha.clone(),
                    reason: REPLACED.into(),
                    removed: false,
                    invalidated: false,
                }
            }
            Err(err @ (ContentError::TextHash { .. } | ContentError::Checksum { .. })) => {
                let m = err.to_string();
                let removed = self.remove_corrupt(&e.path, e.id, &m);
                return fail(m, removed, false);
            }
            Err(err) => return fail(err.to_string(), false, false),
        };
        if header.ctx as usize > ctx
            || header.arch != arch
            || !self.quant_ok(&header)
            || !self.checksum_ok(&header)
        {
            return fail("the header changed since the scan".into(), false, false);
        }
        if !rendered.starts_with(&contents.text) {
            return fail(
                "cache text is not a prefix of the prompt".into(),
                false,
                false,
            );
        }
        if let Err(err) = session.load_snapshot(&contents.payload) {
            return fail(err.to_string(), false, true);
        }
        let tokens = session.tokens().len();
        if tokens != header.tokens as usize {
            session.reset();
            let m = format!(
                "payload holds {tokens} tokens, header says {}",
                header.tokens
            );
            let removed = self.remove_corrupt(&e.path, e.id, &m);
            return fail(m, removed, true);
        }
        let tool_map = if header.ext_flags & EXT_TOOL_MAP != 0 {
            let all = file::decode_ktm(
                &contents.trailer,
                self.cfg.tool_memory_max_ids.saturating_mul(4),
            );
            self.checked_tool_map(&e, all, &contents.text)
        } else {
            Vec::new()
        };
        let max = self.cfg.kv_cache_cold_max_tokens;
        let consumed = max > 0 && tokens > max;
        if consumed {
            if let Ok(Removal::Removed) = guard::remove_unread(&e.path, e.id) {
                let _ = file::sync_dir(&self.dir);
            }
        } else {
            let touched = KvcHeader {
                hits: header.hits.saturating_add(1),
                last_used: self.now(),
                ..header.clone()
            };
            // Only a new file proves the folder writable again (a full
            // disk still takes an in-place header rewrite).
            if let Err(err) = file::rewrite_header(&e.path, &touched) {
                self.write_failed(&format!("could not update {}: {err}", e.path.display()));
            }
        }
        self.log(&format!(
            "hit tokens={tokens} text={} bytes reason={}{} file={}",
            contents.text.len(),
            header.reason.name(),
            if consumed { " (consumed)" } else { "" },
            e.path.display()
        ));
        LookupOutcome::Hit(DiskHit {
            sha: e.sha.clone(),
            tokens,
            text_bytes: contents.text.len(),
            ext_flags: header.ext_flags,
            reason: header.reason,
            tool_map,
            consumed,
        })
    }

    /// Tool-id prefetch (§7, last paragraph): the KTM entries of every
    /// checkpoint with a tool map whose id `wanted` accepts, independent of
    /// which file (if any) loads.
    pub fn prefetch_tool_ids(&self, wanted: &dyn Fn(&[u8]) -> bool) -> Vec<KtmEntry> {
        let max = self.cfg.tool_memory_max_ids.saturating_mul(4);
        let mut out = Vec::new();
        for e in self.scan() {
            if e.header.ext_flags & EXT_TOOL_MAP == 0 || !self.checksum_ok(&e.header) {
                continue;
            }
            let Some(start) = e.header.payload_end(e.text_bytes) else {
                continue;
            };
            let Ok(trailer) = file::read_tail(&e.path, start) else {
                continue;
            };
            let found: Vec<KtmEntry> = file::decode_ktm(&trailer, max)
                .into_iter()
                .filter(|k| wanted(&k.id))
                .collect();
            if found.is_empty() {
                continue;
            }
            // The text (SHA-1 = name) vouches for the blocks.
            match read_contents(&e, false, e.text_bytes as usize) {
                Ok((_, c)) => out.extend(self.checked_tool_map(&e, found, &c.text)),
                Err(err) => self.log(&format!("tool map of {} not used: {err}", e.path.display())),
            }
        }
        if !out.is_empty() {
            self.log(&format!("restored {} tool ids from disk", out.len()));
        }
        out
    }

    /// The KTM entries whose block occurs in the file's text; the others
    /// are damaged and dropped with a log line.
    fn checked_tool_map(&self, e: &Entry, entries: Vec<KtmEntry>, text: &[u8]) -> Vec<KtmEntry> {
        let (kept, dropped) = super::toolmap::entries_in_text(entries, text);
        if dropped > 0 {
            self.log(&format!(
                "tool map of {}: {dropped} entries name a DSML block the cache text does not hold (damaged), skipped",
                e.path.display()
            ));
        }
        kept
    }

    /// Deletes the lowest-scoring files until the folder fits the budget
    /// (§8), never `protected` unless it alone exceeds the budget. Returns
    /// the number of files deleted.
    pub fn evict(&self, protected: Option<&str>) -> usize {
        self.evict_within(self.cfg.budget_bytes(), protected).len()
    }

    /// [`DiskCache::evict`] under another budget; the deleted entries in
    /// the order they were deleted. The budget counts every checkpoint in
    /// the folder, whoever wrote it. In a shared folder a file being read by
    /// another replica is skipped ([`guard::remove_unread`]), as is one
    /// replaced since the scan; one already deleted by another evictor
    /// counts as freed.
    pub fn evict_within(&self, budget: u64, protected: Option<&str>) -> Vec<Entry> {
        let mut entries = self.scan();
        let mut total: u64 = entries.iter().map(|e| e.file_size).sum();
        let protected = protected.filter(|p| {
            entries
                .iter()
                .find(|e| e.sha == *p)
                .is_none_or(|e| e.file_size <= budget)
        });
        let now = self.now();
        let mut evicted = Vec::new();
        let mut changed = false;
        while total > budget && !entries.is_empty() {
            let scores: Vec<f64> = entries
                .iter()
                .map(|e| eviction_score(e, protected, now))
                .collect();
            let mut v = 0;
            for i in 1..entries.len() {
                if scores[i] < scores[v]
                    || (scores[i] == scores[v]
                        && entries[i].header.last_used < entries[v].header.last_used)
                {
                    v = i;
                }
            }
            let e = entries.remove(v);
            match guard::remove_unread(&e.path, e.id) {
                Ok(Removal::Removed) => changed = true,
                Ok(Removal::Gone) => {
                    total = total.saturating_sub(e.file_size);
                    continue;
                }
                Ok(Removal::Busy) => {
                    self.log(&format!(
                        "kept file={} for now: another process is reading it",
                        e.path.display()
                    ));
                    continue;
                }
                Ok(Removal::Replaced) => continue,
                Err(err) => {
                    self.write_failed(&format!("could not evict {}: {err}", e.path.display()));
                    continue;
                }
            }
            KvCacheMetrics::add(&self.metrics.evictions, 1);
            total = total.saturating_sub(e.file_size);
            self.log(&format!(
                "evicted reason=disk-cache-full tokens={} hits={} size={:.2} MiB file={}",
                e.header.tokens,
                e.header.hits,
                mib(e.file_size),
                e.path.display()
            ));
            evicted.push(e);
        }
        if changed {
            let _ = file::sync_dir(&self.dir);
        }
        evicted
    }
}

/// The failure reason of a lookup whose chosen file changed under it.
const REPLACED: &str = "replaced or removed since the scan (another writer or evictor)";

/// Half-life of a hit in the eviction score (ds4: 6 hours).
const HIT_HALF_LIFE_SECONDS: f64 = 21600.0;
/// Decayed hit counts below this count as none.
const MIN_EFFECTIVE_HITS: f64 = 0.01;

/// Tokens kept per byte, boosted by recent hits (§8); +∞ for `protected`.
pub fn eviction_score(e: &Entry, protected: Option<&str>, now: u64) -> f64 {
    if e.file_size == 0 {
        return 0.0;
    }
    if protected == Some(e.sha.as_str()) {
        return f64::MAX;
    }
    let h = &e.header;
    let used = if h.last_used != 0 {
        h.last_used
    } else {
        h.created
    };
    let mut eff = h.hits as f64;
    if used == 0 {
        eff = 0.0;
    } else if now > used {
        eff *= (-((now - used) as f64) / HIT_HALF_LIFE_SECONDS).exp2();
        if eff < MIN_EFFECTIVE_HITS {
            eff = 0.0;
        }
    }
    (eff + 1.0) * h.tokens as f64 / e.file_size as f64
}

/// Whether a directory entry is a regular file, judged without following
/// a symlink (`DirEntry::file_type` is `lstat`'s answer).
fn is_regular(de: &fs::DirEntry) -> bool {
    de.file_type().is_ok_and(|t| t.is_file())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
