//! kill -9 at many moments: a child process stores checkpoints of the tiny
//! model in a loop (new files, eviction, header updates on hits, a fixed
//! CLI path replaced each time) and is killed with SIGKILL at seeded random
//! times. Afterwards every checkpoint in the folder must load and hold
//! exactly what its text says; leftover temp files are allowed and are
//! removed by the next open.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{max_abs_diff, tiny_model, tokens};
use ds4::kvcache::{
    load_file, save_file, CacheKey, DiskCache, KvCacheConfig, SaveReason, StoreOutcome,
};
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

const DIR_ENV: &str = "DS4_KVC_CRASH_DIR";
const N_TOKENS: usize = 64;
const ROUNDS: u64 = 40;

fn session() -> Session {
    let opts = SessionOptions {
        ctx: 256,
        prefill_chunk: 16,
        ..Default::default()
    };
    Session::new(tiny_model(Variant::F32), opts).unwrap()
}

fn config(dir: &Path) -> KvCacheConfig {
    KvCacheConfig {
        kv_disk_dir: Some(dir.to_path_buf()),
        kv_disk_space_mb: 3, // about five files: eviction runs all the time
        kv_cache_min_tokens: 8,
        kv_cache_cold_max_tokens: 0,
        ..KvCacheConfig::default()
    }
}

/// The text a child stores for `n` tokens: says what the payload holds.
fn text_for(n: usize, tag: &str) -> String {
    format!("n={n} {tag}")
}

fn n_of(text: &[u8]) -> usize {
    let t = std::str::from_utf8(text).unwrap();
    t.strip_prefix("n=")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected text {t:?}"))
}

/// The child: runs only when started by the parent test below.
#[test]
#[ignore = "helper process of kill_minus_9_leaves_only_loadable_files"]
fn crash_child_saves_in_a_loop() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let cache = DiskCache::open(&config(&dir), 2)
        .unwrap()
        .unwrap()
        .with_logger(|_| {});
    let toks = tokens(N_TOKENS, 1);
    let mut s = session();
    let mut probe = session();
    println!("ready");
    for i in 0usize.. {
        let n = 8 + (i * 7) % (N_TOKENS - 8);
        s.sync(&toks[..n], &mut |_, _| {}).unwrap();
        let text = text_for(n, &format!("gen={}", i % 5));
        if let StoreOutcome::Stored { .. } = cache.store(
            &s,
            text.as_bytes(),
            CacheKey::Tokens,
            SaveReason::Continued,
            &[],
        ) {
            println!("saved {text}");
        }
        // A hit rewrites the header in place.
        let _ = cache.lookup(&mut probe, text.as_bytes());
        // The CLI path: one name, replaced every time.
        save_file(
            &dir.join("cli.kvc"),
            &s,
            text_for(n, "cli").as_bytes(),
            SaveReason::Unknown,
        )
        .unwrap();
    }
}

#[test]
fn kill_minus_9_leaves_only_loadable_files() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvcache-crash");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let toks = tokens(N_TOKENS, 1);
    let mut reference: HashMap<usize, Vec<f32>> = HashMap::new();
    let mut check = session();
    let (mut saves, mut checked) = (0usize, 0usize);
    let mut temps = HashSet::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash_child_saves_in_a_loop",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut n = 0;
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.ends_with("ready") {
                    let _ = tx.send(());
                }
                n += line.starts_with("saved ") as usize;
            }
            n
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("child did not start");
        // Seeded kill moments spread over 0..400 ms of saving.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = Duration::from_micros(x % 400_000 + round);
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        saves += reader.join().unwrap();

        for de in fs::read_dir(&dir).unwrap().flatten() {
            let name = de.file_name().to_string_lossy().into_owned();
            let path = de.path();
            if name.contains(".tmp.") {
                temps.insert(name);
                continue;
            }
            assert!(
                name == "cli.kvc" || ds4::kvcache::file::checkpoint_stem(&name).is_some(),
                "unexpected file {name}"
            );
            let (h, text) = load_file(&path, &mut check)
                .unwrap_or_else(|e| panic!("round {round}: {name} does not load: {e}"));
            let n = n_of(&text);
            assert_eq!(h.tokens as usize, n, "{name}");
            assert_eq!(check.tokens(), &toks[..n], "{name}");
            let want = reference.entry(n).or_insert_with(|| {
                let mut r = session();
                r.sync(&toks[..n], &mut |_, _| {}).unwrap();
                r.logits().to_vec()
            });
            assert!(
                max_abs_diff(want, check.logits()) < 1e-4,
                "{name}: wrong state"
            );
            checked += 1;
        }
    }
    // The next open removes the cache's temp files of dead writers (a
    // CLI file elsewhere is the user's: its temp file is left alone).
    let cache = DiskCache::open(&config(&dir), 2).unwrap().unwrap();
    let left: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp.") && !n.starts_with("cli.kvc"))
        .collect();
    assert!(left.is_empty(), "stale temp files: {left:?}");
    drop(cache);
    eprintln!(
        "kill -9: {ROUNDS} kills, {saves} completed stores seen, {} kills inside a write (temp file left), {checked} checkpoint loads verified",
        temps.len()
    );
    assert!(saves > 0 && checked > 0);
}

const FSIZE_ENV: &str = "DS4_KVC_FSIZE_DIR";

/// The child of the real-write-error test: lowers its own file-size limit
/// (RLIMIT_FSIZE; SIGXFSZ ignored, so write() fails with EFBIG from the
/// kernel), stores, raises the limit again and stores once more.
#[test]
#[ignore = "helper process of a_real_write_error_fails_the_save_cleanly"]
fn fsize_child_stores_under_a_file_size_limit() {
    let Some(dir) = std::env::var_os(FSIZE_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let cache = DiskCache::open(&config(&dir), 2).unwrap().unwrap();
    let toks = tokens(N_TOKENS, 2);
    let mut s = session();
    s.sync(&toks[..40], &mut |_, _| {}).unwrap();
    let text = text_for(40, "fsize");
    let set = |soft: libc::rlim_t| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain POSIX calls on a local struct.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut r), 0);
            r.rlim_cur = soft.min(r.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &r), 0);
        }
    };
    // SAFETY: ignoring SIGXFSZ turns the kill into an EFBIG error.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    set(100_000);
    let r = cache.store(
        &s,
        text.as_bytes(),
        CacheKey::Tokens,
        SaveReason::Shutdown,
        &[],
    );
    set(libc::RLIM_INFINITY);
    assert!(
        matches!(&r, StoreOutcome::Failed(m) if m.contains("too large")),
        "{r:?}"
    );
    let left: Vec<_> = fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "nothing left after the failed write: {left:?}"
    );
    assert_eq!(cache.metrics().snapshot().save_failures, 1);
    // The session still serves and the next save works.
    s.sync(&toks[..41], &mut |_, _| {}).unwrap();
    let r = cache.store(
        &s,
        text_for(41, "fsize").as_bytes(),
        CacheKey::Tokens,
        SaveReason::Shutdown,
        &[],
    );
    assert!(matches!(r, StoreOutcome::Stored { .. }), "{r:?}");
    println!("fsize child ok");
}

#[test]
fn a_real_write_error_fails_the_save_cleanly() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvcache-fsize");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "fsize_child_stores_under_a_file_size_limit",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FSIZE_ENV, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("fsize child ok"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut check = session();
    let files: Vec<_> = fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    let (h, _) = load_file(&files[0].path(), &mut check).unwrap();
    assert_eq!(h.tokens, 41);
}
