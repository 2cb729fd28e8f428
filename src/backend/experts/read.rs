//! Positioned reads of expert slices from the GGUF, bypassing the page
//! cache where the filesystem allows (O_DIRECT on Linux, F_NOCACHE on
//! macOS), so a streamed expert is held once, in the cache, and never
//! counted twice. Direct reads need the offset, the length and the buffer
//! aligned to the device block; every read here is widened to whole
//! [`ALIGN`] blocks into a block-aligned buffer and the slice is the part
//! the caller asked for. Where the filesystem refuses direct I/O (tmpfs,
//! some network filesystems) the same aligned reads run buffered.
//!
//! The file is also watched: [`SliceReader::check_unchanged`] compares the
//! path's size, modification time and inode with those seen at open, so a
//! GGUF replaced or rewritten while serving is refused instead of being
//! read as garbage.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Block size every direct read is aligned to (the largest logical block
/// size in common use; a multiple of 512).
pub const ALIGN: usize = 4096;

/// One aligned block of a read buffer.
#[repr(C, align(4096))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Block([u8; ALIGN]);

/// An extent `(offset, len)` widened to whole [`ALIGN`] blocks, as a
/// direct read must be.
struct Widened {
    /// The aligned file offset the read starts at.
    start: u64,
    /// Bytes before the extent in the first block.
    lead: usize,
    /// Bytes read: `lead + len` rounded up to whole blocks.
    span: usize,
}

impl Widened {
    fn new(offset: u64, len: usize) -> Widened {
        let start = offset - offset % ALIGN as u64;
        let lead = (offset - start) as usize;
        Widened {
            start,
            lead,
            span: (lead + len).div_ceil(ALIGN) * ALIGN,
        }
    }
}

/// A heap buffer whose start is [`ALIGN`]-aligned (what O_DIRECT needs).
pub struct AlignedBuf {
    blocks: Vec<Block>,
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.capacity())
    }
}

impl AlignedBuf {
    /// At least `len` zeroed bytes. Allocated zeroed (calloc: fresh pages
    /// come zero from the kernel), not written, so a new buffer costs no
    /// memset on top of its page faults.
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            blocks: bytemuck::allocation::zeroed_vec(len.div_ceil(ALIGN)),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        bytemuck::cast_slice(&self.blocks)
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.blocks)
    }

    /// Bytes held (a whole number of blocks).
    pub fn capacity(&self) -> usize {
        self.blocks.len() * ALIGN
    }
}

/// What identifies the file's contents cheaply: size, modification time,
/// inode and device (the last two only on Unix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub len: u64,
    pub modified: Option<SystemTime>,
    pub inode: u64,
    pub device: u64,
}

impl FileIdentity {
    pub fn of(meta: &std::fs::Metadata) -> FileIdentity {
        #[cfg(unix)]
        let (inode, device) = {
            use std::os::unix::fs::MetadataExt;
            (meta.ino(), meta.dev())
        };
        #[cfg(not(unix))]
        let (inode, device) = (0, 0);
        FileIdentity {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
            device,
        }
    }
}

/// A read that failed: the file, the byte offset and why.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: reading {len} bytes at offset {offset}: {source}")]
    Io {
        path: String,
        offset: u64,
        len: usize,
        source: io::Error,
    },
    #[error("{path}: short read at offset {offset}: {got} of {len} bytes (the file ends early)")]
    Short {
        path: String,
        offset: u64,
        len: usize,
        got: usize,
    },
    #[error("{path} changed on disk since it was loaded ({what}); restart with the new file")]
    Changed { path: String, what: String },
}

/// The open GGUF for expert reads.
pub struct SliceReader {
    file: File,
    path: PathBuf,
    identity: FileIdentity,
    direct: bool,
}

impl SliceReader {
    /// Opens `path` for positioned reads; direct I/O when `direct` and the
    /// filesystem allows it (probed with one aligned read), else buffered.
    pub fn open(path: &Path, direct: bool) -> io::Result<SliceReader> {
        let plain = File::open(path)?;
        let identity = FileIdentity::of(&plain.metadata()?);
        let mut r = SliceReader {
            file: plain,
            path: path.to_path_buf(),
            identity,
            direct: false,
        };
        if direct {
            if let Some(f) = open_direct(path) {
                let probe = SliceReader {
                    file: f,
                    path: r.path.clone(),
                    identity,
                    direct: true,
                };
                let n = (identity.len as usize).min(ALIGN);
                if n == 0 || probe.read(0, n).is_ok() {
                    r = probe;
                }
            }
        }
        Ok(r)
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The identity seen at open.
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// Refuses a file that was replaced or rewritten since it was opened:
    /// the path's size, modification time, inode and device must be the
    /// ones seen at open.
    pub fn check_unchanged(&self) -> Result<(), ReadError> {
        let changed = |what: String| ReadError::Changed {
            path: self.path.display().to_string(),
            what,
        };
        let now = match std::fs::metadata(&self.path) {
            Ok(m) => FileIdentity::of(&m),
            Err(e) => return Err(changed(format!("it can no longer be read: {e}"))),
        };
        let was = self.identity;
        if now.len != was.len {
            return Err(changed(format!("size {} bytes, was {}", now.len, was.len)));
        }
        if now.modified != was.modified {
            return Err(changed("modification time differs".into()));
        }
        if (now.inode, now.device) != (was.inode, was.device) {
            return Err(changed("it is a different file (inode)".into()));
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` into a fresh aligned buffer; returns the
    /// buffer and where the asked-for bytes sit in it.
    pub fn read(&self, offset: u64, len: usize) -> Result<(AlignedBuf, Range<usize>), ReadError> {
        let mut buf = AlignedBuf::zeroed(0);
        let r = self.read_into(offset, len, &mut buf)?;
        Ok((buf, r))
    }

    /// [`SliceReader::read`] into `buf`, grown when it is too small (a
    /// reused buffer saves the page faults of a fresh one).
    pub fn read_into(
        &self,
        offset: u64,
        len: usize,
        buf: &mut AlignedBuf,
    ) -> Result<Range<usize>, ReadError> {
        let w = Widened::new(offset, len);
        if buf.capacity() < w.span {
            *buf = AlignedBuf::zeroed(w.span);
        }
        self.read_widened(&w, &mut buf.as_mut_slice()[..w.span], offset, len)?;
        Ok(w.lead..w.lead + len)
    }

    /// Reads every extent `(offset, len)` into one buffer (grown when too
    /// small), each widened to whole blocks and laid out one after the
    /// other; the extents are read in parallel on the current rayon pool
    /// (one I/O in flight per extent: the queue depth a slice's three slabs
    /// give). Returns where each extent's bytes sit in the buffer. A short
    /// read names the file and the extent's offset.
    pub fn read_extents_into(
        &self,
        extents: &[(u64, usize)],
        buf: &mut AlignedBuf,
    ) -> Result<Vec<Range<usize>>, ReadError> {
        use rayon::prelude::*;
        let widened: Vec<Widened> = extents
            .iter()
            .map(|&(offset, len)| Widened::new(offset, len))
            .collect();
        let total: usize = widened.iter().map(|w| w.span).sum();
        if buf.capacity() < total {
            *buf = AlignedBuf::zeroed(total);
        }
        let mut chunks = Vec::with_capacity(widened.len());
        let mut ranges = Vec::with_capacity(widened.len());
        let mut rest = &mut buf.as_mut_slice()[..total];
        let mut at = 0;
        for (w, &(_, len)) in widened.iter().zip(extents) {
            let (chunk, tail) = rest.split_at_mut(w.span);
            chunks.push(chunk);
            ranges.push(at + w.lead..at + w.lead + len);
            rest = tail;
            at += w.span;
        }
        chunks
            .into_par_iter()
            .zip(widened.par_iter().zip(extents))
            .try_for_each(|(chunk, (w, &(offset, len)))| {
                self.read_widened(w, chunk, offset, len)
            })?;
        Ok(ranges)
    }

    /// Reads the extent `(offset, len)`, widened to `w`, into `dst` (`w.span`
    /// bytes); a short read names the file and the extent's offset.
    fn read_widened(
        &self,
        w: &Widened,
        dst: &mut [u8],
        offset: u64,
        len: usize,
    ) -> Result<(), ReadError> {
        let got = self.read_at_full(w.start, dst, w.lead + len)?;
        if got < w.lead + len {
            return Err(ReadError::Short {
                path: self.path.display().to_string(),
                offset,
                len,
                got: got.saturating_sub(w.lead),
            });
        }
        Ok(())
    }

    /// Reads into `dst` from `at` until `need` bytes are in or the file
    /// ends; returns the bytes read. Direct reads stay block-aligned: a
    /// partial read is only possible at the end of the file.
    fn read_at_full(&self, at: u64, dst: &mut [u8], need: usize) -> Result<usize, ReadError> {
        let mut done = 0;
        while done < need {
            match read_at(&self.file, &mut dst[done..], at + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(ReadError::Io {
                        path: self.path.display().to_string(),
                        offset: at + done as u64,
                        len: need - done,
                        source: e,
                    })
                }
            }
        }
        Ok(done)
    }
}

/// The disk's read bandwidth as the cache sees it, measured on the GGUF
/// itself with the cache's own reads (direct where allowed).
#[derive(Clone, Copy, Debug)]
pub struct DiskBandwidth {
    /// 8 MiB reads front to back, `threads` in flight (bytes/s).
    pub sequential: f64,
    /// `threads` readers, 4 KiB reads at random aligned offsets (bytes/s).
    pub random_4k: f64,
    pub threads: usize,
    pub direct: bool,
}

/// Measures [`DiskBandwidth`] on `path`: at most `seq_bytes` read
/// sequentially (from the start, so it runs first, before those pages could
/// be anywhere else), then `secs` seconds of 4 KiB random reads on `threads`
/// threads. With buffered reads (no direct I/O) the page cache serves what
/// it holds and the figures are the cache's, as `direct` says.
pub fn probe_disk(
    path: &Path,
    seq_bytes: u64,
    secs: f64,
    threads: usize,
) -> io::Result<DiskBandwidth> {
    let r = SliceReader::open(path, true)?;
    let len = r.identity.len;
    let threads = threads.max(1);
    // Sequential: 8 MiB reads front to back over `seq_bytes`, shared out
    // to the readers in turn (the queue depth the cache's parallel slice
    // reads have).
    let block = 8u64 << 20;
    let n = (seq_bytes.min(len) / block).max(1);
    let next = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::Instant::now();
    let done: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (r, next) = (&r, &next);
                s.spawn(move || {
                    let mut bytes = 0u64;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let at = i * block;
                        if i >= n || at >= len {
                            break bytes;
                        }
                        let want = block.min(len - at) as usize;
                        if let Ok((_, got)) = r.read(at, want) {
                            bytes += got.len() as u64;
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let sequential = done as f64 / t.elapsed().as_secs_f64().max(1e-9);
    let blocks = (len / ALIGN as u64).max(1);
    let t = std::time::Instant::now();
    let reads: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let r = &r;
                s.spawn(move || {
                    // xorshift64: offsets spread over the whole file.
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
                    let mut count = 0u64;
                    while t.elapsed().as_secs_f64() < secs {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if r.read((x % blocks) * ALIGN as u64, ALIGN).is_ok() {
                            count += 1;
                        }
                    }
                    count
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let random_4k = (reads * ALIGN as u64) as f64 / t.elapsed().as_secs_f64().max(1e-9);
    Ok(DiskBandwidth {
        sequential,
        random_4k,
        threads,
        direct: r.direct,
    })
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, at)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, at)
}

/// The file opened for reads that skip the page cache, or `None` where this
/// platform or filesystem has no such mode.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(target_os = "macos")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path).ok()?;
    // SAFETY: fcntl on a descriptor this function owns; F_NOCACHE takes an int.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
    (rc != -1).then_some(f)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("ds4-read-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn unaligned_reads_return_the_asked_bytes_direct_or_not() {
        let data: Vec<u8> = (0..3 * ALIGN + 123).map(|i| (i * 7 % 251) as u8).collect();
        let p = temp_file("slices", &data);
        for direct in [false, true] {
            let r = SliceReader::open(&p, direct).unwrap();
            for (off, len) in [(0, 10), (5, ALIGN), (ALIGN - 1, 2), (100, 2 * ALIGN + 20)] {
                let (buf, range) = r.read(off as u64, len).unwrap();
                assert_eq!(&buf.as_slice()[range], &data[off..off + len]);
            }
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_short_read_names_the_file_and_offset() {
        let p = temp_file("short", &vec![1u8; 2 * ALIGN]);
        let r = SliceReader::open(&p, true).unwrap();
        let e = r.read(ALIGN as u64 + 10, ALIGN).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ReadError::Short { .. }), "{msg}");
        assert!(
            msg.contains(&p.display().to_string()) && msg.contains("offset 4106"),
            "{msg}"
        );
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn extents_read_into_one_buffer_and_a_short_one_names_its_offset() {
        let data: Vec<u8> = (0..5 * ALIGN + 77).map(|i| (i * 13 % 251) as u8).collect();
        let p = temp_file("extents", &data);
        for direct in [false, true] {
            let r = SliceReader::open(&p, direct).unwrap();
            let ext = [(3u64, 100usize), (ALIGN as u64 + 5, 2 * ALIGN), (7, 9)];
            let mut buf = AlignedBuf::zeroed(0);
            let got = r.read_extents_into(&ext, &mut buf).unwrap();
            for (rg, &(o, n)) in got.iter().zip(&ext) {
                assert_eq!(
                    &buf.as_slice()[rg.clone()],
                    &data[o as usize..o as usize + n]
                );
            }
            // The last extent runs past the end of the file.
            let off = 4 * ALIGN as u64 + 10;
            let e = r
                .read_extents_into(&[(0, 10), (off, 2 * ALIGN)], &mut buf)
                .unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, ReadError::Short { .. }), "{msg}");
            assert!(
                msg.contains(&p.display().to_string()) && msg.contains(&format!("offset {off}")),
                "{msg}"
            );
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_rewritten_or_replaced_file_is_refused() {
        let p = temp_file("changed", &vec![1u8; ALIGN]);
        let r = SliceReader::open(&p, false).unwrap();
        r.check_unchanged().unwrap();
        // Replaced by rename: same size, a different inode.
        let q = p.with_extension("new");
        std::fs::write(&q, vec![2u8; ALIGN]).unwrap();
        std::fs::rename(&q, &p).unwrap();
        let e = r.check_unchanged().unwrap_err().to_string();
        assert!(e.contains("changed on disk"), "{e}");
        // Grown in place.
        let r = SliceReader::open(&p, false).unwrap();
        std::fs::write(&p, vec![3u8; 2 * ALIGN]).unwrap();
        let e = r.check_unchanged().unwrap_err().to_string();
        assert!(e.contains("size 8192 bytes, was 4096"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }
}
