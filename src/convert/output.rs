//! The output file: written under a temporary name next to the final one
//! and renamed when complete, so a failure leaves nothing under the final
//! name; and the `*` patterns that pick tensors by name.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::ConvertError;

/// `true` when `name` matches `pattern`, where `*` matches any run of
/// characters (none included) and everything else matches itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// The temporary name of `out` while it is written.
pub fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_os_string();
    s.push(format!(".partial-{}", std::process::id()));
    PathBuf::from(s)
}

/// Reserves `len` bytes for `file` so a disk that cannot hold the output
/// fails before any work; file systems without the call are written as
/// they come.
fn reserve(file: &File, len: u64, path: &Path) -> Result<(), ConvertError> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain system call on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 | libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(ConvertError::Output {
            file: path.display().to_string(),
            msg: format!(
                "cannot reserve {len} bytes ({:.2} GiB) for the output: {}",
                len as f64 / (1u64 << 30) as f64,
                std::io::Error::from_raw_os_error(e)
            ),
        }),
    }
}

/// Creates `path` (which must not exist), `len` bytes long, with `header`
/// at its start.
pub fn create_partial(path: &Path, header: &[u8], len: u64) -> Result<File, ConvertError> {
    let bad = |msg: String| ConvertError::Output {
        file: path.display().to_string(),
        msg,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| bad(format!("cannot create: {e}")))?;
    let ready = reserve(&file, len, path).and_then(|()| {
        file.write_all_at(header, 0)
            .map_err(|e| bad(format!("cannot write the header: {e}")))?;
        file.set_len(len)
            .map_err(|e| bad(format!("cannot size the file: {e}")))
    });
    // Created but not usable (a full disk, a file-size limit): nothing is
    // left behind.
    if let Err(e) = ready {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

/// Syncs the finished file and renames it to its final name.
pub fn finish(file: File, partial: &Path, out: &Path) -> Result<(), ConvertError> {
    let bad = |msg: String| ConvertError::Output {
        file: partial.display().to_string(),
        msg,
    };
    file.sync_all()
        .map_err(|e| bad(format!("cannot sync: {e}")))?;
    drop(file);
    std::fs::rename(partial, out)
        .map_err(|e| bad(format!("cannot rename to {}: {e}", out.display())))
}

/// A progress bar over output bytes (its message: the tensor being written).
pub fn progress_bar(total: u64, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:32}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob(
            "blk.*.ffn_*_exps.weight",
            "blk.12.ffn_down_exps.weight"
        ));
        assert!(!glob(
            "blk.*.ffn_*_exps.weight",
            "blk.12.ffn_down_shexp.weight"
        ));
        assert!(glob("*", "anything"));
        assert!(glob("output.weight", "output.weight"));
        assert!(!glob("output.weight", "output_norm.weight"));
        assert!(!glob("a*a", "a"));
    }
}
