//! Hostile files (issue 25 item 6, docs/SECURITY.md § Files): what another
//! process or user can leave in the disk KV cache folder or at the lock
//! path. A FIFO named like a checkpoint (start-up and requests complete in
//! bounded time); a symlink named like a checkpoint (never followed, loaded,
//! rewritten or deleted through); a symlink pre-created at the temp path or
//! the final path (the write refuses or replaces the link; the target is
//! untouched); a folder others can write (refused, naming the folder and
//! the fix); a symlink or foreign folder at the lock path (refused, target
//! untouched); `--kv-cache-require-checksum` (an unmarked file is skipped,
//! a marked one loads). Servers bind 127.0.0.1 and are killed when a test
//! ends.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::process::run_bounded;
use crate::common::server::launch;
use crate::common::{tiny_model, tiny_model_path, tokens};
use ds4::kvcache::file::{self, temp_path};
use ds4::kvcache::{CacheKey, DiskCache, KvCacheConfig, LookupOutcome, SaveReason, StoreOutcome};
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

/// Start-up of the tiny-model server, and any one request on it, must end
/// well inside this (a few seconds on a loaded 2-core CI machine; today's
/// FIFO hang never ends).
const BOUND: Duration = Duration::from_secs(60);

fn fresh_dir(name: &str) -> PathBuf {
    let d = crate::common::fresh_dir("hostile-files", name);
    fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn chown(p: &Path, uid: u32) {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the group is left as it is.
    assert_eq!(
        unsafe { libc::chown(c.as_ptr(), uid, u32::MAX) },
        0,
        "chown"
    );
}

fn config(dir: &Path) -> KvCacheConfig {
    KvCacheConfig {
        kv_disk_dir: Some(dir.to_path_buf()),
        kv_cache_min_tokens: 4,
        kv_cache_cold_max_tokens: 0,
        ..KvCacheConfig::default()
    }
}

/// Opens the cache on another thread and fails the test if that takes
/// longer than `BOUND` (a hang would otherwise hang the test binary).
fn open_bounded(cfg: &KvCacheConfig) -> DiskCache {
    let cfg = cfg.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(DiskCache::open(&cfg, 2));
    });
    let r = rx
        .recv_timeout(BOUND)
        .expect("DiskCache::open did not return in time");
    r.unwrap().unwrap()
}

fn session(n: usize, seed: u64) -> Session {
    let opts = SessionOptions {
        ctx: 128,
        prefill_chunk: 16,
        ..Default::default()
    };
    let mut s = Session::new(tiny_model(Variant::F32), opts).unwrap();
    if n > 0 {
        s.sync(&tokens(n, seed), &mut |_, _| {}).unwrap();
    }
    s
}

fn stored_sha(c: &DiskCache, s: &Session, text: &[u8]) -> String {
    match c.store(s, text, CacheKey::Tokens, SaveReason::Cold, &[]) {
        StoreOutcome::Stored { sha, .. } => sha,
        o => panic!("store: {o:?}"),
    }
}

#[test]
fn a_fifo_named_like_a_checkpoint_is_skipped_by_the_library() {
    let dir = fresh_dir("fifo-lib");
    let name = format!("{}.kv", file::sha1_hex(b"fifo"));
    mkfifo(&dir.join(&name));
    let c = open_bounded(&config(&dir));
    assert!(c.scan().is_empty());
    // A FIFO swapped in after the directory read: the open itself neither
    // blocks nor accepts it.
    let t0 = Instant::now();
    let e = file::probe(&dir.join(&name), "x").unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // A lookup whose prompt the FIFO's name would match still misses, and
    // a store beside it works.
    let mut s = session(0, 1);
    assert_eq!(c.lookup(&mut s, b"fifo and more"), LookupOutcome::Miss);
    let s = session(8, 1);
    stored_sha(&c, &s, b"fifo text");
    assert_eq!(c.scan().len(), 1);
    assert!(fs::symlink_metadata(dir.join(&name))
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_symlink_named_like_a_checkpoint_is_not_followed_rewritten_or_deleted_through() {
    let outside = fresh_dir("symlink-outside");
    let dir = fresh_dir("symlink-cache");
    // A valid checkpoint written elsewhere, and a link to it in the cache
    // folder under its own name: today's code would load it and rewrite
    // its header (hit count) through the link.
    let text = b"a checkpoint outside the cache folder".to_vec();
    let sha = {
        let o = open_bounded(&config(&outside));
        stored_sha(&o, &session(8, 2), &text)
    };
    let target = outside.join(format!("{sha}.kv"));
    let before = fs::read(&target).unwrap();
    let link = dir.join(format!("{sha}.kv"));
    symlink(&target, &link).unwrap();

    let c = open_bounded(&config(&dir));
    assert!(c.scan().is_empty(), "a symlink is not a checkpoint");
    let mut s = session(0, 2);
    let mut prompt = text.clone();
    prompt.extend_from_slice(b" and the next turn");
    assert_eq!(c.lookup(&mut s, &prompt), LookupOutcome::Miss);
    assert!(s.tokens().is_empty());
    // Eviction under a zero budget deletes nothing it did not scan.
    assert!(c.evict_within(0, None).is_empty());
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&target).unwrap(), before, "target untouched");
    // The safe open refuses the link itself.
    let e = file::probe(&link, &sha).unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
}

#[test]
fn a_symlink_at_the_temp_path_makes_the_write_refuse_and_leaves_the_target() {
    let dir = fresh_dir("temp-link");
    let victim_dir = fresh_dir("temp-link-victim");
    let victim = victim_dir.join("precious");
    fs::write(&victim, b"do not overwrite").unwrap();
    let c = open_bounded(&config(&dir));
    let text = b"stored under a booby-trapped temp name";
    let fin = dir.join(format!("{}.kv", file::sha1_hex(text)));
    // The store runs in this process: the temp name carries our pid.
    let tmp = temp_path(&fin);
    symlink(&victim, &tmp).unwrap();
    let s = session(8, 3);
    let StoreOutcome::Failed(why) = c.store(&s, text, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!("the store must refuse")
    };
    assert!(why.contains("not a regular file"), "{why}");
    assert_eq!(fs::read(&victim).unwrap(), b"do not overwrite");
    assert!(!fin.exists(), "no checkpoint published");
    assert!(
        fs::symlink_metadata(&tmp).unwrap().file_type().is_symlink(),
        "the link is left for the operator, not removed"
    );

    // A regular leftover at the temp name (a dead writer that had our
    // pid) is replaced, and the store succeeds.
    fs::remove_file(&tmp).unwrap();
    fs::write(&tmp, b"leftover").unwrap();
    stored_sha(&c, &s, text);
    assert!(!tmp.exists());
    let md = fs::metadata(&fin).unwrap();
    assert_eq!(md.mode() & 0o777, 0o600, "checkpoints are private");

    // A symlink at the final name is replaced by the rename, not written
    // through.
    let text2 = b"stored over a link at the final name";
    let fin2 = dir.join(format!("{}.kv", file::sha1_hex(text2)));
    symlink(&victim, &fin2).unwrap();
    stored_sha(&c, &s, text2);
    assert!(fs::symlink_metadata(&fin2).unwrap().file_type().is_file());
    assert_eq!(fs::read(&victim).unwrap(), b"do not overwrite");
}

#[test]
fn a_folder_others_can_write_is_refused_with_the_folder_and_the_fix() {
    for (mode, fix) in [(0o777, "chmod o-w"), (0o1777, "chmod o-w")] {
        let dir = fresh_dir("world-writable");
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        let Err(e) = DiskCache::open(&config(&dir), 2) else {
            panic!("mode {mode:o} accepted")
        };
        let m = e.to_string();
        let canon = fs::canonicalize(&dir).unwrap();
        assert!(m.contains(&canon.display().to_string()), "{m}");
        assert!(m.contains(fix) && m.contains("every user"), "{m}");
    }
    // Another user's folder: only root can make one here, so this part
    // runs only as root (CI containers often are).
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        for mode in [0o755, 0o775] {
            let dir = fresh_dir("foreign");
            chown(&dir, 4242);
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            let Err(e) = DiskCache::open(&config(&dir), 2) else {
                panic!("a folder of uid 4242 accepted")
            };
            assert!(e.to_string().contains("belongs to uid 4242"), "{e}");
        }
    }
    // Group-writable and ours (umask 002, or a group we chose) is accepted.
    let dir = fresh_dir("group-writable");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    assert!(DiskCache::open(&config(&dir), 2).unwrap().is_some());
    // A folder the cache creates itself is private.
    let dir = fresh_dir("created").join("sub");
    DiskCache::open(&config(&dir), 2).unwrap().unwrap();
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn require_checksum_skips_an_unmarked_file_and_loads_a_marked_one() {
    let dir = fresh_dir("require-checksum");
    let c = open_bounded(&config(&dir));
    let short = b"the marked prefix".to_vec();
    let mut long = short.clone();
    long.extend_from_slice(b", and a longer unmarked one");
    let s_short = session(6, 4);
    let s_long = session(10, 5);
    let sha_short = stored_sha(&c, &s_short, &short);
    let sha_long = stored_sha(&c, &s_long, &long);
    // Clear the mark as ds4 does when it rewrites a header: byte 7 and
    // bytes 20..24 back to zero.
    let p = dir.join(format!("{sha_long}.kv"));
    let mut raw = fs::read(&p).unwrap();
    raw[7] = 0;
    raw[20..24].fill(0);
    fs::write(&p, &raw).unwrap();
    let mut prompt = long.clone();
    prompt.extend_from_slice(b" and the question");

    // Default: the unmarked file is read unchecked, like ds4's.
    let mut s = session(0, 0);
    let LookupOutcome::Hit(h) = c.lookup(&mut s, &prompt) else {
        panic!("the unmarked file loads by default")
    };
    assert_eq!(h.sha, sha_long);

    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let l2 = logs.clone();
    let strict = DiskCache::open(
        &KvCacheConfig {
            kv_cache_require_checksum: true,
            ..config(&dir)
        },
        2,
    )
    .unwrap()
    .unwrap()
    .with_logger(move |m| l2.lock().unwrap().push(m.to_string()));
    let mut s = session(0, 0);
    let LookupOutcome::Hit(h) = strict.lookup(&mut s, &prompt) else {
        panic!("the marked prefix loads")
    };
    assert_eq!((h.sha.as_str(), h.tokens), (sha_short.as_str(), 6));
    assert_eq!(s.tokens(), s_short.tokens());
    let logs = logs.lock().unwrap().join("\n");
    assert!(
        logs.contains(&sha_long) && logs.contains("no checksum mark"),
        "{logs}"
    );
    // The unmarked file is kept (ds4 may still use it), only not loaded...
    assert!(p.exists());
    // ...until this server stores the same text: then it is replaced by a
    // marked file instead of counting as already stored.
    assert!(matches!(
        strict.store(&s_long, &long, CacheKey::Tokens, SaveReason::Evict, &[]),
        StoreOutcome::Stored { .. }
    ));
    assert_eq!(fs::read(&p).unwrap()[7], 0xC5, "marked now");
    let mut s = session(0, 0);
    let LookupOutcome::Hit(h) = strict.lookup(&mut s, &prompt) else {
        panic!("the replaced file loads")
    };
    assert_eq!(h.sha, sha_long);
    // Back to unmarked for the last case.
    let mut raw = fs::read(&p).unwrap();
    raw[7] = 0;
    raw[20..24].fill(0);
    fs::write(&p, &raw).unwrap();
    // Only the unmarked one matching: a miss.
    let mut s = session(0, 0);
    fs::remove_file(dir.join(format!("{sha_short}.kv"))).unwrap();
    assert_eq!(strict.lookup(&mut s, &prompt), LookupOutcome::Miss);
}

// ---- the real server ------------------------------------------------------

fn server_cmd(lock: &Path, extra: &[&str]) -> Command {
    let m = tiny_model_path(Variant::Q8);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.args([
        "-m",
        m.to_str().unwrap(),
        "--port",
        "0",
        "--ctx",
        "256",
        "-n",
        "2",
    ])
    .args(extra)
    .env("DS4_LOCK_FILE", lock);
    cmd
}

fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("reply within the bound");
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_server_starts_and_serves_with_a_fifo_named_like_a_checkpoint() {
    let dir = fresh_dir("fifo-server");
    let fifo = dir.join(format!("{}.kv", file::sha1_hex(b"x")));
    mkfifo(&fifo);
    // And one named like a temp file of a dead writer.
    mkfifo(&dir.join(format!("{}.kv.tmp.999999999", file::sha1_hex(b"y"))));
    let cmd = server_cmd(
        &dir.with_extension("lock"),
        &[
            "--kv-disk-dir",
            dir.to_str().unwrap(),
            "--kv-cache-min-tokens",
            "4",
            "--kv-cache-require-checksum",
        ],
    );
    let srv = launch(cmd, dir.with_extension("log"), BOUND);
    let t0 = Instant::now();
    let body = serde_json::json!({
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
    })
    .to_string();
    let r = http(&srv.addr, "POST", "/v1/chat/completions", &body);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(t0.elapsed() < BOUND);
    let log = srv.stderr_text();
    // The cache logs the folder's resolved path.
    let named = fs::canonicalize(&dir)
        .unwrap()
        .join(fifo.file_name().unwrap());
    assert!(
        log.contains("a FIFO, not a regular file") && log.contains(&named.display().to_string()),
        "{log}"
    );
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

fn run_to_exit(cmd: Command) -> Output {
    run_bounded(cmd, BOUND, "the server")
}

#[test]
fn the_server_refuses_a_world_writable_cache_folder() {
    let dir = fresh_dir("server-world");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let o = run_to_exit(server_cmd(
        &dir.with_extension("lock"),
        &["--kv-disk-dir", dir.to_str().unwrap()],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    let canon = fs::canonicalize(&dir).unwrap();
    assert!(
        err.contains(&canon.display().to_string()) && err.contains("chmod o-w"),
        "{err}"
    );
}

#[test]
fn a_symlink_at_the_lock_path_is_refused_and_its_target_untouched() {
    let dir = fresh_dir("lock-link");
    let victim = dir.join("victim");
    fs::write(&victim, b"precious contents").unwrap();
    let lock = dir.join("ds4.lock");
    symlink(&victim, &lock).unwrap();
    let o = run_to_exit(server_cmd(&lock, &[]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("symlink") && err.contains("ds4.lock"), "{err}");
    // Today's open followed the link and truncated the target to the pid.
    assert_eq!(fs::read(&victim).unwrap(), b"precious contents");

    // A FIFO there is refused too, without blocking.
    fs::remove_file(&lock).unwrap();
    mkfifo(&lock);
    let o = run_to_exit(server_cmd(&lock, &[]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
}

/// The default lock (no `DS4_LOCK_FILE`) lives in a per-user 0700 folder
/// of the temporary directory (`TMPDIR` here, so the test owns it).
fn default_lock_cmd(tmp: &Path) -> Command {
    let mut c = server_cmd(Path::new("unused"), &[]);
    c.env_remove("DS4_LOCK_FILE").env("TMPDIR", tmp);
    c
}

#[test]
fn the_default_lock_is_per_user_private_and_still_exclusive() {
    let tmp = fresh_dir("lock-default");
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let folder = tmp.join(format!("ds4-{me}"));

    // A symlink planted under our folder name is refused, not followed.
    let elsewhere = fresh_dir("lock-default-elsewhere");
    symlink(&elsewhere, &folder).unwrap();
    let o = run_to_exit(default_lock_cmd(&tmp));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a symlink") && err.contains("DS4_LOCK_FILE"),
        "{err}"
    );
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    fs::remove_file(&folder).unwrap();

    // A folder others can write is refused.
    fs::create_dir(&folder).unwrap();
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o777)).unwrap();
    let o = run_to_exit(default_lock_cmd(&tmp));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("mode 0777"), "{err}");
    fs::remove_dir(&folder).unwrap();

    // Another user's folder under our name (root only can stage it).
    if me == 0 {
        fs::create_dir(&folder).unwrap();
        fs::set_permissions(&folder, fs::Permissions::from_mode(0o700)).unwrap();
        chown(&folder, 4242);
        let o = run_to_exit(default_lock_cmd(&tmp));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("uid 4242"), "{err}");
        fs::remove_dir(&folder).unwrap();
    }

    // The ordinary case: the folder is made 0700, the lock file 0600, and
    // a second server of the same user exits 2 while the first runs (the
    // single-instance rule of SERVER.md §1, unchanged).
    let first = launch(
        default_lock_cmd(&tmp),
        tmp.with_extension("first.log"),
        BOUND,
    );
    assert_eq!(fs::metadata(&folder).unwrap().mode() & 0o777, 0o700);
    let lock = folder.join("ds4.lock");
    assert_eq!(fs::metadata(&lock).unwrap().mode() & 0o777, 0o600);
    assert_eq!(
        fs::read_to_string(&lock).unwrap().trim(),
        first.child.id().to_string()
    );
    let o = run_to_exit(default_lock_cmd(&tmp));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("another ds4 process holds"), "{err}");
    drop(first);
}
