//! The lock that keeps one ds4 engine per user and machine (SERVER.md §1):
//! `ds4-server` takes it at start-up, before the model loads. Its folder
//! and file are opened so that another local user cannot hold it for ever
//! or turn it into a write elsewhere (docs/SECURITY.md, "Files").

use std::path::PathBuf;

/// The folder of the default lock file: `ds4-<uid>` in the temporary
/// directory, mode 0700. Per user because a lock file in a folder every
/// user writes (`/tmp/ds4.lock`, as SERVER.md §1 has it) lets another user
/// hold the lock for ever, or plant a symlink there that the open would
/// follow and truncate. Not in the cache folder: the lock guards the
/// machine's memory and GPU, servers without a cache take it too, and an
/// exclusive lock there would stop replicas ever sharing one cache folder.
pub fn lock_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("ds4-{me}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("lock folder {}: {e}", dir.display())),
    }
    // lstat: a symlink planted under our name is refused, not followed.
    let md = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !md.is_dir() || md.uid() != me || md.mode() & 0o022 != 0 {
        return Err(format!(
            "lock folder {} is not a folder of this user (uid {me}) writable only by it \
             (found {}, uid {}, mode {:04o}); remove it or set DS4_LOCK_FILE",
            dir.display(),
            if md.file_type().is_symlink() {
                "a symlink"
            } else if md.is_dir() {
                "a folder"
            } else {
                "a file"
            },
            md.uid(),
            md.mode() & 0o7777
        ));
    }
    Ok(dir)
}

/// One ds4 engine per user and machine (SERVER.md §1, made per user; see
/// [`lock_dir`]): an exclusive `flock` on `ds4.lock` in [`lock_dir`]
/// (`path`, from `DS4_LOCK_FILE`, overrides), holding our pid. The file is
/// opened without following a symlink and without blocking on a FIFO, and
/// must be a regular file. The returned file keeps the lock until the
/// process ends.
pub fn take_lock(path: Option<PathBuf>) -> Result<std::fs::File, String> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = match path {
        Some(p) => p,
        None => lock_dir()?.join("ds4.lock"),
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        // Read too: a FIFO opened write-only without a reader fails with
        // ENXIO, read-write opens it, so the type check below names it.
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => format!(
                "lock file {} is a symlink; refusing to follow it (remove it)",
                path.display()
            ),
            _ => format!("lock file {}: {e}", path.display()),
        })?;
    let md = f
        .metadata()
        .map_err(|e| format!("lock file {}: {e}", path.display()))?;
    if !md.is_file() {
        return Err(format!(
            "lock file {} is not a regular file; remove it",
            path.display()
        ));
    }
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "another ds4 process holds {} (set DS4_LOCK_FILE to run a second one)",
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}
