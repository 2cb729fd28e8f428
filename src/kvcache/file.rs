//! One KVC checkpoint file (KVCACHE.md §4): the 48-byte header, `u32`
//! text length, the rendered cache text, ds4's session payload and the
//! optional KTM tool-id map. Writing is crash safe (temp file in the same
//! folder, fsync, rename, fsync of the folder); reading checks every length
//! against the file before trusting it. Every open goes through
//! [`super::guard`]: no symlinks followed, no FIFO waited on, temp files
//! created new with mode 0600.
//!
//! One addition to ds4's layout, invisible to ds4: header byte 7 and bytes
//! 20..24 are reserved in ds4 (written 0, ignored on read, re-zeroed when ds4
//! rewrites a header). We write `CHECKSUM_MARK` at byte 7 and the CRC-32 of
//! `u32 text_bytes ‖ text ‖ payload` at bytes 20..24, so a flipped bit in the
//! text or the 13+ MB of state is caught before it reaches a session. A file
//! without the mark (written or touched by ds4) is read unchecked, as ds4 does.
//!
//! The mark also names the model family (issue 19): `CHECKSUM_MARK` for a
//! DeepSeek V4 session, `CHECKSUM_MARK_V41` for V4.1. A V4.1 checkpoint is
//! always written with its checksum; a file without a mark is V4 (ds4's).
//! So a checkpoint is refused by its header when offered to a model of the
//! other family, and its payload's first word refuses it once more if a
//! rewrite by ds4 has cleared the mark (`session::V41_SNAPSHOT_MAGIC`).

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha1::{Digest, Sha1};

use super::guard;
use crate::model::Arch;

/// Bytes of the fixed header.
pub const HEADER_BYTES: usize = 48;
/// Header plus the `u32` text length: where the cache text starts.
pub const PREFIX_BYTES: u64 = HEADER_BYTES as u64 + 4;
const MAGIC: [u8; 3] = *b"KVC";
const VERSION: u8 = 1;
/// Byte 7 value saying bytes 20..24 hold our payload checksum (V4 session).
const CHECKSUM_MARK: u8 = 0xC5;
/// The same for a DeepSeek V4.1 session.
const CHECKSUM_MARK_V41: u8 = 0xC6;

/// Extension flags, header byte 6.
pub const EXT_TOOL_MAP: u8 = 1;
pub const EXT_RESPONSES_TEXT: u8 = 2;
pub const EXT_THINKING_TEXT: u8 = 4;

const KTM_MAGIC: [u8; 3] = *b"KTM";
const KTM_VERSION: u8 = 1;
/// ds4's per-entry limits when reading a tool map (KVCACHE.md §4.5).
const KTM_MAX_ID: u32 = 256;
const KTM_MAX_DSML: u32 = 512 << 20;

/// Why a checkpoint was written (header byte 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaveReason {
    Unknown = 0,
    Cold = 1,
    Continued = 2,
    Evict = 3,
    Shutdown = 4,
    /// Written only by ds4-agent; read and kept.
    AgentSystem = 5,
    AgentSession = 6,
}

impl SaveReason {
    pub fn from_byte(b: u8) -> SaveReason {
        match b {
            1 => SaveReason::Cold,
            2 => SaveReason::Continued,
            3 => SaveReason::Evict,
            4 => SaveReason::Shutdown,
            5 => SaveReason::AgentSystem,
            6 => SaveReason::AgentSession,
            _ => SaveReason::Unknown,
        }
    }

    /// The word ds4's log lines use.
    pub fn name(self) -> &'static str {
        match self {
            SaveReason::Unknown => "unknown",
            SaveReason::Cold => "cold",
            SaveReason::Continued => "continued",
            SaveReason::Evict => "evict",
            SaveReason::Shutdown => "shutdown",
            SaveReason::AgentSystem => "agent-system",
            SaveReason::AgentSession => "agent-session",
        }
    }
}

/// The fixed header, decoded (KVCACHE.md §4.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvcHeader {
    /// Routed-expert quant bits, 2 or 4.
    pub quant_bits: u8,
    pub reason: SaveReason,
    pub ext_flags: u8,
    /// Tokens in the payload.
    pub tokens: u32,
    pub hits: u32,
    /// Context size of the writing session.
    pub ctx: u32,
    pub created: u64,
    pub last_used: u64,
    pub payload_bytes: u64,
    /// CRC-32 of `u32 text_bytes ‖ text ‖ payload`; `None` for ds4's files.
    pub checksum: Option<u32>,
    /// The model family whose session the payload holds (byte 7).
    pub arch: Arch,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl KvcHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..3].copy_from_slice(&MAGIC);
        h[3] = VERSION;
        h[4] = self.quant_bits;
        h[5] = self.reason as u8;
        h[6] = self.ext_flags;
        h[8..12].copy_from_slice(&self.tokens.to_le_bytes());
        h[12..16].copy_from_slice(&self.hits.to_le_bytes());
        h[16..20].copy_from_slice(&self.ctx.to_le_bytes());
        // A V4.1 header always carries the mark that names it (with
        // checksum 0 if none was given, which then fails verification).
        if self.checksum.is_some() || self.arch == Arch::V41 {
            h[7] = match self.arch {
                Arch::V4 => CHECKSUM_MARK,
                Arch::V41 => CHECKSUM_MARK_V41,
            };
            h[20..24].copy_from_slice(&self.checksum.unwrap_or(0).to_le_bytes());
        }
        h[24..32].copy_from_slice(&self.created.to_le_bytes());
        h[32..40].copy_from_slice(&self.last_used.to_le_bytes());
        h[40..48].copy_from_slice(&self.payload_bytes.to_le_bytes());
        h
    }

    /// `None` unless the header is valid in ds4's sense: magic, version,
    /// tokens ≠ 0, quant bits 2 or 4.
    pub fn decode(h: &[u8; HEADER_BYTES]) -> Option<KvcHeader> {
        if h[..3] != MAGIC || h[3] != VERSION {
            return None;
        }
        let hdr = KvcHeader {
            quant_bits: h[4],
            reason: SaveReason::from_byte(h[5]),
            ext_flags: h[6],
            tokens: u32_at(h, 8),
            hits: u32_at(h, 12),
            ctx: u32_at(h, 16),
            checksum: matches!(h[7], CHECKSUM_MARK | CHECKSUM_MARK_V41).then(|| u32_at(h, 20)),
            arch: if h[7] == CHECKSUM_MARK_V41 {
                Arch::V41
            } else {
                Arch::V4
            },
            created: u64_at(h, 24),
            last_used: u64_at(h, 32),
            payload_bytes: u64_at(h, 40),
        };
        (hdr.tokens != 0 && matches!(hdr.quant_bits, 2 | 4)).then_some(hdr)
    }

    /// Offset just past the payload (where a KTM section starts), or `None`
    /// when the sizes overflow.
    pub fn payload_end(&self, text_bytes: u32) -> Option<u64> {
        PREFIX_BYTES
            .checked_add(text_bytes as u64)?
            .checked_add(self.payload_bytes)
    }
}

/// Checksum stored in our headers.
pub fn checksum(text: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&(text.len() as u32).to_le_bytes());
    h.update(text);
    h.update(payload);
    h.finalize()
}

/// Lowercase hex SHA-1: the file name stem of a checkpoint with this text.
pub fn sha1_hex(text: &[u8]) -> String {
    let d = Sha1::digest(text);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The lowercased stem if `name` is a checkpoint name (40 hex digits of
/// either case + `.kv`), else `None`.
pub fn checkpoint_stem(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".kv")?;
    (stem.len() == 40 && stem.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| stem.to_ascii_lowercase())
}

/// One tool id and the exact DSML block it was sampled as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KtmEntry {
    pub id: Vec<u8>,
    pub dsml: Vec<u8>,
}

/// The KTM section bytes; empty when there are no entries (no section).
pub fn encode_ktm(entries: &[KtmEntry]) -> Vec<u8> {
    if entries.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    out.extend_from_slice(&KTM_MAGIC);
    out.push(KTM_VERSION);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&(e.id.len() as u32).to_le_bytes());
        out.extend_from_slice(&(e.dsml.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.id);
        out.extend_from_slice(&e.dsml);
    }
    out
}

/// Reads a KTM section as ds4 does: nothing unless magic and version match,
/// nothing if it claims more than `max_entries`, and entries up to the first
/// bad length or short read.
pub fn decode_ktm(b: &[u8], max_entries: usize) -> Vec<KtmEntry> {
    if b.len() < 8 || b[..3] != KTM_MAGIC || b[3] != KTM_VERSION {
        return Vec::new();
    }
    let count = u32_at(b, 4) as usize;
    if count > max_entries {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut pos = 8usize;
    for _ in 0..count {
        if b.len() < pos + 8 {
            break;
        }
        let (il, dl) = (u32_at(b, pos), u32_at(b, pos + 4));
        if !(1..=KTM_MAX_ID).contains(&il) || !(1..=KTM_MAX_DSML).contains(&dl) {
            break;
        }
        let (il, dl) = (il as usize, dl as usize);
        let start = pos + 8;
        if b.len() < start + il + dl {
            break;
        }
        out.push(KtmEntry {
            id: b[start..start + il].to_vec(),
            dsml: b[start + il..start + il + dl].to_vec(),
        });
        pos = start + il + dl;
    }
    out
}

/// Everything needed to write one checkpoint.
pub struct NewCheckpoint<'a> {
    pub header: KvcHeader,
    pub text: &'a [u8],
    pub payload: &'a [u8],
    pub tool_map: &'a [KtmEntry],
}

impl NewCheckpoint<'_> {
    /// Exact size of the file that [`write_atomic`] produces.
    pub fn file_bytes(&self) -> u64 {
        PREFIX_BYTES
            + self.text.len() as u64
            + self.payload.len() as u64
            + encoded_ktm_len(self.tool_map)
    }
}

fn encoded_ktm_len(entries: &[KtmEntry]) -> u64 {
    if entries.is_empty() {
        0
    } else {
        8 + entries
            .iter()
            .map(|e| 8 + e.id.len() as u64 + e.dsml.len() as u64)
            .sum::<u64>()
    }
}

/// A writer that fails with ENOSPC once `limit` bytes have been written in
/// total: a full disk on demand for tests (no privileges needed).
struct LimitedWriter<W> {
    inner: W,
    left: Option<u64>,
}

impl<W: Write> Write for LimitedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.left {
            None => buf.len(),
            Some(0) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(left) => buf.len().min(left as usize),
        };
        let n = self.inner.write(&buf[..n])?;
        if let Some(left) = &mut self.left {
            *left -= n as u64;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The temporary name a checkpoint is written under: ds4's `.tmp.<pid>`,
/// then `.<host>.<thread>` ([`host_tag`], a number per writing thread). In
/// a folder shared by several replicas (several hosts on NFS, or several
/// writers in one process) two writers of the same prefix must never share
/// a temp file: pids repeat across hosts, and two threads of one process
/// may store the same prefix at once. One thread writes one file at a time,
/// so the name is fixed per thread (and a test can predict it).
pub fn temp_path(final_path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    thread_local! {
        static THREAD: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let n = THREAD.with(|t| *t);
    let mut s = final_path.as_os_str().to_owned();
    s.push(format!(".tmp.{}.{}.{n}", std::process::id(), host_tag()));
    PathBuf::from(s)
}

/// What a temp file's name says about its writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TempName {
    /// The checkpoint name it becomes (`<sha>.kv`).
    pub checkpoint: String,
    pub pid: u32,
    /// `None` for ds4's `.tmp.<pid>` (no host recorded).
    pub host: Option<String>,
}

/// Parses a temp name written by [`temp_path`] or by ds4; `None` for any
/// other name.
pub fn parse_temp_name(name: &str) -> Option<TempName> {
    // ds4: `<sha>.kv.tmp.<pid>`; ours: `<sha>.kv.tmp.<pid>.<host>.<n>`.
    let (base, rest) = name.rsplit_once(".tmp.")?;
    checkpoint_stem(base)?;
    let mut parts = rest.split('.');
    let pid = parts.next()?.parse().ok()?;
    let host = match (parts.next(), parts.next(), parts.next()) {
        (None, _, _) => None,
        (Some(h), Some(n), None) if n.parse::<u64>().is_ok() && !h.is_empty() => {
            Some(h.to_string())
        }
        _ => return None,
    };
    Some(TempName {
        checkpoint: base.to_string(),
        pid,
        host,
    })
}

/// Eight hex digits naming this machine in temp names (SHA-1 of the host
/// name): a temp file from another host is judged by its age, never by a
/// pid that means nothing here.
pub fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| sha1_hex(host_name().as_bytes())[..8].to_string())
}

fn host_name() -> String {
    #[cfg(unix)]
    {
        let mut b = [0u8; 256];
        // SAFETY: the buffer and its length are valid; gethostname writes at
        // most that many bytes.
        if unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) } == 0 {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            return String::from_utf8_lossy(&b[..end]).into_owned();
        }
    }
    String::from("localhost")
}

/// Writes `c` to `final_path` so that a crash at any moment leaves either
/// the old file (or none) or the complete new one: temp file in the same
/// folder, fsync, rename, fsync of the folder. On error the temp file is
/// removed. `write_limit` injects a full disk after that many bytes.
pub fn write_atomic(
    final_path: &Path,
    c: &NewCheckpoint<'_>,
    write_limit: Option<u64>,
) -> io::Result<u64> {
    let text_len = u32::try_from(c.text.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cache text over 4 GiB"))?;
    let tmp = temp_path(final_path);
    // Only a temp file we created is ours to remove on error: a symlink or
    // FIFO that was in the way stays for the operator to look at.
    let file = guard::create_temp(&tmp)?;
    let r = write_then_rename(file, &tmp, final_path, c, text_len, write_limit);
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

fn write_then_rename(
    file: File,
    tmp: &Path,
    final_path: &Path,
    c: &NewCheckpoint<'_>,
    text_len: u32,
    write_limit: Option<u64>,
) -> io::Result<u64> {
    let mut w = LimitedWriter {
        inner: io::BufWriter::with_capacity(1 << 20, &file),
        left: write_limit,
    };
    w.write_all(&c.header.encode())?;
    w.write_all(&text_len.to_le_bytes())?;
    w.write_all(c.text)?;
    w.write_all(c.payload)?;
    w.write_all(&encode_ktm(c.tool_map))?;
    w.flush()?;
    drop(w);
    file.sync_all()?;
    drop(file);
    fs::rename(tmp, final_path)?;
    sync_dir(final_path.parent().unwrap_or(Path::new(".")))?;
    Ok(c.file_bytes())
}

/// Makes a rename or unlink in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// What a scan learns from a file's first 52 bytes and its size.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Lowercase SHA-1 from the file name.
    pub sha: String,
    pub path: PathBuf,
    pub header: KvcHeader,
    pub text_bytes: u32,
    pub file_size: u64,
    /// The file the scan saw ([`guard::FileId`]): a later delete or read
    /// acts only if the name still holds this file, not one another
    /// replica renamed over it since.
    pub id: guard::FileId,
}

/// Result of looking at one checkpoint-named file.
#[derive(Debug)]
pub enum Probe {
    Valid(Entry),
    /// Not a valid header (ds4: invisible, never deleted automatically).
    BadHeader,
    /// Valid header but the file is shorter than the sizes it declares: it
    /// can never load.
    Truncated {
        declared: u64,
        actual: u64,
        id: guard::FileId,
    },
}

/// Reads the header and text length of `path` (named `<sha>.kv`).
pub fn probe(path: &Path, sha: &str) -> io::Result<Probe> {
    let mut f = guard::open_read(path)?;
    let md = f.metadata()?;
    let size = md.len();
    if size < PREFIX_BYTES {
        return Ok(Probe::BadHeader);
    }
    let mut b = [0u8; PREFIX_BYTES as usize];
    f.read_exact(&mut b)?;
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(&b[..HEADER_BYTES]);
    let Some(header) = KvcHeader::decode(&h) else {
        return Ok(Probe::BadHeader);
    };
    let text_bytes = u32_at(&b, HEADER_BYTES);
    match header.payload_end(text_bytes) {
        Some(end) if end <= size => Ok(Probe::Valid(Entry {
            sha: sha.to_string(),
            path: path.to_path_buf(),
            header,
            text_bytes,
            file_size: size,
            id: guard::FileId::of(&md),
        })),
        end => Ok(Probe::Truncated {
            declared: end.unwrap_or(u64::MAX),
            actual: size,
            id: guard::FileId::of(&md),
        }),
    }
}

/// The parts of a checkpoint after the header, read and checked.
pub struct Contents {
    pub text: Vec<u8>,
    pub payload: Vec<u8>,
    /// Bytes after the payload (a KTM section or nothing).
    pub trailer: Vec<u8>,
}

/// Why a file's contents cannot be used.
#[derive(Debug)]
pub enum ContentError {
    Io(io::Error),
    /// The header changed or is invalid now.
    Header,
    /// The name now holds another file than the scan saw (another replica
    /// replaced or deleted it): not damage, only a changed folder.
    Replaced,
    /// Text SHA-1 differs from the name.
    TextHash {
        found: String,
    },
    Checksum {
        stored: u32,
        computed: u32,
    },
}

impl std::fmt::Display for ContentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContentError::Io(e) => write!(f, "read error: {e}"),
            ContentError::Header => write!(f, "invalid or changed header"),
            ContentError::Replaced => write!(
                f,
                "replaced or removed since the scan (another writer or evictor)"
            ),
            ContentError::TextHash { found } => {
                write!(f, "cache text hashes to {found}, not the file name")
            }
            ContentError::Checksum { stored, computed } => write!(
                f,
                "payload checksum {computed:08x} does not match the stored {stored:08x}"
            ),
        }
    }
}

/// Reads the text (checked against the name unless `e.sha` is empty) and,
/// if `with_payload`, the payload (checked against our checksum when
/// present) and the trailer. Text longer than `max_text` is refused before
/// reading. The whole read holds a shared lock on the file
/// ([`guard::lock_for_reading`]), so a cooperating evictor in another
/// replica skips it until the read is done; a file that is no longer the
/// one the scan saw is [`ContentError::Replaced`].
pub fn read_contents(
    e: &Entry,
    with_payload: bool,
    max_text: usize,
) -> Result<(KvcHeader, Contents), ContentError> {
    let mut f = guard::open_read(&e.path).map_err(ContentError::Io)?;
    match guard::lock_for_reading(&f, &e.path) {
        Ok(id) if id == e.id => {}
        Ok(_) => return Err(ContentError::Replaced),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(ContentError::Replaced),
        Err(err) => return Err(ContentError::Io(err)),
    }
    let size = f.metadata().map_err(ContentError::Io)?.len();
    let mut b = [0u8; PREFIX_BYTES as usize];
    f.read_exact(&mut b).map_err(ContentError::Io)?;
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(&b[..HEADER_BYTES]);
    let header = KvcHeader::decode(&h).ok_or(ContentError::Header)?;
    let text_bytes = u32_at(&b, HEADER_BYTES);
    let end = header
        .payload_end(text_bytes)
        .filter(|&end| end <= size && text_bytes as usize <= max_text)
        .ok_or(ContentError::Header)?;
    let mut text = vec![0u8; text_bytes as usize];
    f.read_exact(&mut text).map_err(ContentError::Io)?;
    let found = sha1_hex(&text);
    if !e.sha.is_empty() && found != e.sha {
        return Err(ContentError::TextHash { found });
    }
    let mut payload = Vec::new();
    let mut trailer = Vec::new();
    if with_payload {
        payload = vec![0u8; header.payload_bytes as usize];
        f.read_exact(&mut payload).map_err(ContentError::Io)?;
        if let Some(stored) = header.checksum {
            let computed = checksum(&text, &payload);
            if computed != stored {
                return Err(ContentError::Checksum { stored, computed });
            }
        }
        f.seek(SeekFrom::Start(end)).map_err(ContentError::Io)?;
        f.read_to_end(&mut trailer).map_err(ContentError::Io)?;
    }
    Ok((
        header,
        Contents {
            text,
            payload,
            trailer,
        },
    ))
}

/// The bytes of `path` from `start` to the end (a KTM section).
pub fn read_tail(path: &Path, start: u64) -> io::Result<Vec<u8>> {
    let mut f = guard::open_read(path)?;
    f.seek(SeekFrom::Start(start))?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}

/// Rewrites only the header in place (hit count and last-used time). The
/// 48 bytes lie in the first page, so a killed process leaves old or new.
pub fn rewrite_header(path: &Path, h: &KvcHeader) -> io::Result<()> {
    let mut f = guard::open_write(path)?;
    f.write_all(&h.encode())?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_matches_the_table() {
        let h = KvcHeader {
            quant_bits: 4,
            reason: SaveReason::Evict,
            ext_flags: EXT_TOOL_MAP | EXT_THINKING_TEXT,
            tokens: 0x0102_0304,
            hits: 7,
            ctx: 65536,
            created: 0x1122_3344_5566_7788,
            last_used: 9,
            payload_bytes: 123_456_789_012,
            checksum: None,
            arch: Arch::V4,
        };
        let b = h.encode();
        assert_eq!(&b[..8], &[b'K', b'V', b'C', 1, 4, 3, 5, 0]);
        assert_eq!(&b[8..12], &[4, 3, 2, 1]);
        assert_eq!(&b[20..24], &[0; 4]);
        assert_eq!(KvcHeader::decode(&b), Some(h.clone()));
        let with = KvcHeader {
            checksum: Some(0xdead_beef),
            ..h
        };
        assert_eq!(KvcHeader::decode(&with.encode()), Some(with.clone()));
        // The V4.1 mark names the family and still carries the checksum.
        let v41 = KvcHeader {
            arch: Arch::V41,
            ..with
        };
        let b = v41.encode();
        assert_eq!(b[7], CHECKSUM_MARK_V41);
        assert_eq!(KvcHeader::decode(&b), Some(v41));
    }

    #[test]
    fn names_and_ktm() {
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        let n = "A9993E364706816ABA3E25717850C26C9CD0D89D.kv";
        assert_eq!(
            checkpoint_stem(n).as_deref(),
            Some("a9993e364706816aba3e25717850c26c9cd0d89d")
        );
        assert_eq!(checkpoint_stem("a9993e.kv"), None);
        assert_eq!(checkpoint_stem(&format!("{n}.tmp.12")), None);
        let e = vec![
            KtmEntry {
                id: b"call_1".to_vec(),
                dsml: b"<x>".to_vec(),
            },
            KtmEntry {
                id: b"call_2".to_vec(),
                dsml: b"<y>".to_vec(),
            },
        ];
        let b = encode_ktm(&e);
        assert_eq!(b.len() as u64, encoded_ktm_len(&e));
        assert_eq!(decode_ktm(&b, 8), e);
        assert!(decode_ktm(&b, 1).is_empty());
        // A short read keeps the entries before it.
        assert_eq!(decode_ktm(&b[..b.len() - 1], 8), e[..1]);
    }

    #[test]
    fn temp_names_carry_pid_host_and_thread() {
        let sha = "a9993e364706816aba3e25717850c26c9cd0d89d";
        let fin = PathBuf::from(format!("/x/{sha}.kv"));
        let t = temp_path(&fin);
        let name = t.file_name().unwrap().to_str().unwrap();
        let p = parse_temp_name(name).unwrap();
        assert_eq!(p.checkpoint, format!("{sha}.kv"));
        assert_eq!(p.pid, std::process::id());
        assert_eq!(p.host.as_deref(), Some(host_tag()));
        // Fixed per thread, different on another thread.
        assert_eq!(temp_path(&fin), t);
        let other = std::thread::spawn(move || temp_path(&fin)).join().unwrap();
        assert_ne!(other, t);
        // ds4's name, and names that are not temp files.
        let ds4 = parse_temp_name(&format!("{sha}.kv.tmp.12")).unwrap();
        assert_eq!((ds4.pid, ds4.host), (12, None));
        for bad in [
            format!("{sha}.kv"),
            format!("{sha}.kv.tmp."),
            format!("{sha}.kv.tmp.x"),
            format!("{sha}.kv.tmp.12.h"),
            format!("{sha}.kv.tmp.12.h.n"),
            format!("{sha}.kv.tmp.12.h.1.2"),
            "abc.kv.tmp.12".to_string(),
        ] {
            assert_eq!(parse_temp_name(&bad), None, "{bad}");
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        // Seeded xorshift; headers and maps of random bytes, and valid maps
        // with random single-byte damage, decode to something or nothing.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = encode_ktm(&[KtmEntry {
            id: b"id".to_vec(),
            dsml: vec![1; 40],
        }]);
        for i in 0..20_000 {
            let mut h = [0u8; HEADER_BYTES];
            h.iter_mut().for_each(|b| *b = next() as u8);
            if i % 2 == 0 {
                h[..4].copy_from_slice(b"KVC\x01");
            }
            if let Some(d) = KvcHeader::decode(&h) {
                assert_eq!(KvcHeader::decode(&d.encode()), Some(d));
            }
            let mut m = good.clone();
            let at = (next() as usize) % m.len();
            m[at] = next() as u8;
            let cut = (next() as usize) % (m.len() + 1);
            assert!(decode_ktm(&m[..cut], 4).len() <= 1);
        }
    }
}
