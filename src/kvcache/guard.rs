//! The file-system rules of the cache folder (docs/SECURITY.md § Files): who
//! may write the folder, and how a file in it is opened. Everything here
//! exists because the folder's contents decide what state a session loads:
//! a file another user planted there is a forged model state, a FIFO named
//! like a checkpoint blocks a plain `open` for ever, and a symlink turns a
//! header rewrite or a temp-file write into a write somewhere else.
//!
//! * [`check_folder`]: refuse a folder others can write (at open).
//! * [`open_read`] / [`open_write`]: an existing checkpoint, never through a
//!   symlink, never blocking, and only if it is a regular file.
//! * [`create_temp`]: a new temp file, `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Why the cache folder is refused; the message names the fix.
pub fn check_folder(dir: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !md.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let mode = md.mode() & 0o7777;
        let d = dir.display();
        // World-writable is refused even with the sticky bit (a /tmp-like
        // folder): sticky only stops others deleting our files, not adding
        // theirs under a checkpoint name we would load.
        if mode & 0o002 != 0 {
            return Err(format!(
                "the disk KV cache folder {d} is writable by every user (mode {mode:04o}): \
                 anyone could plant a checkpoint this server would load; \
                 run `chmod o-w {d}` or give --kv-disk-dir a folder of your own"
            ));
        }
        // Another user's folder is theirs to fill (root excepted: root can
        // replace our files anywhere).
        if md.uid() != me && md.uid() != 0 {
            return Err(format!(
                "the disk KV cache folder {d} belongs to uid {}, not to this user (uid {me}): \
                 its owner could plant checkpoints this server would load; \
                 give --kv-disk-dir a folder you own",
                md.uid()
            ));
        }
        // Group write is accepted only on a folder we own: with a
        // user-private group (umask 002) it is the default, and sharing a
        // folder with a group we chose (replicas) is deliberate. On a folder
        // someone else owns, the group is not ours to vouch for.
        if mode & 0o020 != 0 && md.uid() != me {
            return Err(format!(
                "the disk KV cache folder {d} is group-writable (mode {mode:04o}) and owned by uid {}: \
                 members of its group could plant checkpoints; \
                 run `chmod g-w {d}` or give --kv-disk-dir a folder you own",
                md.uid()
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Flags for opening an existing checkpoint: never through a symlink (the
/// scan does not follow them, so neither may a later open of the same name),
/// and never blocking (a FIFO swapped in after the scan would otherwise hang
/// the worker until someone writes to it).
fn existing_flags(o: &mut OpenOptions) {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(o, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    #[cfg(not(unix))]
    let _ = o;
}

fn regular_only(path: &Path, f: File) -> io::Result<File> {
    if f.metadata()?.is_file() {
        Ok(f)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ))
    }
}

/// A symlink met by `O_NOFOLLOW` reads as `ELOOP`; say what it means.
fn name_symlink(path: &Path, e: io::Error) -> io::Error {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::ELOOP) {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a symlink; not following it", path.display()),
        );
    }
    let _ = path;
    e
}

/// Opens an existing checkpoint for reading (see [`existing_flags`]).
pub fn open_read(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    existing_flags(&mut o);
    regular_only(path, o.open(path).map_err(|e| name_symlink(path, e))?)
}

/// Opens an existing checkpoint for an in-place header rewrite.
pub fn open_write(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true);
    existing_flags(&mut o);
    regular_only(path, o.open(path).map_err(|e| name_symlink(path, e))?)
}

fn create_new(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    o.open(path)
}

/// Creates the temp file a checkpoint is written to: a new file, mode
/// 0600, never an existing name and never through a symlink. A regular file
/// already there is a leftover of a dead writer whose pid we now have (the
/// name holds the pid); it is removed and the create tried once more.
/// Anything else there (a symlink, a FIFO) is refused: writing must not go
/// through it, and it is not ours to delete.
pub fn create_temp(path: &Path) -> io::Result<File> {
    match create_new(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let md = std::fs::symlink_metadata(path)?;
            if !md.file_type().is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a regular file ({}); not writing through it",
                        path.display(),
                        kind_name(&md.file_type())
                    ),
                ));
            }
            std::fs::remove_file(path)?;
            create_new(path)
        }
        r => r.map_err(|e| name_symlink(path, e)),
    }
}

/// A word for a file type in error messages.
pub fn kind_name(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if t.is_symlink() {
        "a symlink"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Which file a name held when it was looked at (device and inode): a
/// folder shared by several replicas changes under a scan, and a delete or
/// read decided on one file must not land on its replacement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub fn of(md: &std::fs::Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId {
                dev: md.dev(),
                ino: md.ino(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = md;
            FileId::default()
        }
    }

    /// The file `path` names now (not following a symlink).
    pub fn at(path: &Path) -> io::Result<FileId> {
        Ok(FileId::of(&std::fs::symlink_metadata(path)?))
    }
}

/// Takes a shared advisory lock (`flock`, which Linux carries to the server
/// on NFS) on an open checkpoint for as long as `f` is open, and returns
/// which file `path` names now. Readers share; an evictor
/// ([`remove_unread`]) needs the lock exclusively and skips a file it cannot
/// get. Never blocks: a file whose exclusive lock is held is being deleted,
/// and reads as `NotFound`.
pub fn lock_for_reading(f: &File, path: &Path) -> io::Result<FileId> {
    match f.try_lock_shared() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is being deleted", path.display()),
            ))
        }
        // A file system without working locks (some FUSE mounts, NFS
        // without a lock manager: ENOLCK): read unlocked, as before locks,
        // rather than lose every load.
        Err(std::fs::TryLockError::Error(_)) => {}
    }
    // Checked after the lock: a name deleted between the open and the lock
    // no longer names this file, and the caller treats it as gone.
    let now = FileId::at(path)?;
    if now == FileId::of(&f.metadata()?) {
        Ok(now)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} was replaced while being opened", path.display()),
        ))
    }
}

/// What [`remove_unread`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Already gone, or being deleted by another replica's evictor.
    Gone,
    /// Kept: another process holds it open for reading.
    Busy,
    /// Kept: the name now holds another file than `expected`.
    Replaced,
}

/// Deletes the checkpoint at `path` if it is still the file `expected` and
/// no reader holds it: opens it, takes its lock exclusively without
/// waiting, checks the name still holds the locked file, unlinks, and lets
/// the lock go with the descriptor. A reader that opens the name after the
/// unlink finds nothing; one that opened it just before finds the name gone
/// once it has its lock ([`lock_for_reading`]).
pub fn remove_unread(path: &Path, expected: FileId) -> io::Result<Removal> {
    let f = match open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Gone),
        Err(e) => return Err(e),
    };
    match f.try_lock() {
        Ok(()) => {}
        // Held: by readers (a shared lock is still to be had), or by
        // another evictor about to delete it (not even a shared one is),
        // which frees its bytes as surely as we would.
        Err(std::fs::TryLockError::WouldBlock) => {
            return match f.try_lock_shared() {
                Err(std::fs::TryLockError::WouldBlock) => Ok(Removal::Gone),
                // A shared lock is to be had now. Either readers hold the
                // file, or the holder was an evictor that has unlinked it
                // and let go between our two tries: then the name no longer
                // holds this file, and its bytes are freed as surely as if
                // we had deleted it. Calling that case `Busy` made a second
                // evictor delete one file too many.
                _ => {
                    let mine = FileId::of(&f.metadata()?);
                    match FileId::at(path) {
                        Ok(now) if now == mine => Ok(Removal::Busy),
                        Ok(_) => Ok(Removal::Gone),
                        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Removal::Gone),
                        Err(e) => Err(e),
                    }
                }
            };
        }
        // No working locks here (see `lock_for_reading`): delete unlocked.
        Err(std::fs::TryLockError::Error(_)) => {}
    }
    let mine = FileId::of(&f.metadata()?);
    match FileId::at(path) {
        Ok(now) if now == mine && mine == expected => {}
        Ok(_) => return Ok(Removal::Replaced),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Gone),
        Err(e) => return Err(e),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(Removal::Removed),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Removal::Gone),
        Err(e) => Err(e),
    }
}
