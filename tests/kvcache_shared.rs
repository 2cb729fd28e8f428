//! One `--kv-disk-dir` shared by several replicas (docs/DEPLOY.md,
//! KVCACHE.md § Shared folder): each replica is its own `DiskCache` on the
//! same folder here (separate opens, so the advisory locks conflict exactly
//! as between processes). Two writers of one prefix at once leave one valid
//! file; a replica loads another's checkpoint bit-identically; the budget
//! counts the folder; two evictors at once remove what one would; an
//! evictor skips a file another replica is reading; loads racing evictions
//! and rewrites never load garbage; a killed writer's leftovers never load;
//! a replica that cannot write keeps serving and logs once.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, SystemTime};

use common::kvcache::{file_names as names, random_words, sync_prefix, tokenizer};
use common::rng::Rng;
use ds4::kvcache::file::{self, KvcHeader, NewCheckpoint, SaveReason};
use ds4::kvcache::guard;
use ds4::kvcache::{CacheKey, DiskCache, KvCacheConfig, LookupOutcome, StoreOutcome};
use ds4::session::Session;
use ds4::tokenizer::Tokenizer;

const CTX: usize = 512;

fn session() -> Session {
    common::kvcache::session(CTX)
}

fn fresh_dir(name: &str) -> PathBuf {
    common::fresh_dir("kvcache-shared", name)
}

fn config(dir: &Path) -> KvCacheConfig {
    common::disk_cache_config(dir, 400)
}

type Log = Arc<Mutex<Vec<String>>>;

/// One replica's cache on `dir`, its log lines collected.
fn replica(cfg: &KvCacheConfig) -> (DiskCache, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let c = DiskCache::open(cfg, 2)
        .unwrap()
        .unwrap()
        .with_logger(move |m| l.lock().unwrap().push(m.to_string()));
    (c, log)
}

fn folder_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".kv"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// An ASCII prompt of many words (every token boundary a character one).
fn prompt(seed: u64) -> String {
    let words = [
        "cache", "replica", "folder", "prefix", "nginx", "lock", "evict",
    ];
    let mut s = String::from("<｜begin▁of▁sentence｜>You are a careful assistant.<｜User｜>");
    s.push_str(&random_words(&words, 120, &mut Rng(seed | 1)));
    s
}

/// What the replica tests start from: the tokenizer, a fresh shared folder
/// `name` and its cache config, the prompt of `seed` and its tokens.
struct Shared {
    tok: Tokenizer,
    dir: PathBuf,
    cfg: KvCacheConfig,
    text: String,
    p: Vec<u32>,
}

fn shared(name: &str, seed: u64) -> Shared {
    let tok = tokenizer();
    let dir = fresh_dir(name);
    let cfg = config(&dir);
    let text = prompt(seed);
    let p = tok.encode_chat(&text);
    Shared {
        tok,
        dir,
        cfg,
        text,
        p,
    }
}

/// A session holding the first `n` tokens of `p`, and their text.
fn prefix_session(tok: &Tokenizer, p: &[u32], n: usize) -> (Session, Vec<u8>) {
    let mut s = session();
    let text = sync_prefix(&mut s, tok, p, n);
    (s, text)
}

#[test]
fn two_replicas_saving_the_same_prefix_at_once_leave_one_valid_file() {
    let Shared {
        tok, dir, cfg, p, ..
    } = shared("same-prefix", 1);
    const ROUNDS: usize = 6;
    let barrier = Arc::new(Barrier::new(2));
    let both_wrote = Arc::new(Mutex::new(0usize));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (cache, _) = replica(&cfg);
            let (b, p, both) = (barrier.clone(), p.clone(), both_wrote.clone());
            std::thread::spawn(move || {
                let tok = tokenizer();
                let mut s = session();
                for r in 0..ROUNDS {
                    let n = 40 + 8 * r;
                    s.sync(&p[..n], &mut |_, _| {}).unwrap();
                    let t = tok.decode(&p[..n]);
                    b.wait();
                    let out = cache.store(&s, &t, CacheKey::Tokens, SaveReason::Cold, &[]);
                    assert!(
                        matches!(
                            out,
                            StoreOutcome::Stored { .. } | StoreOutcome::AlreadyStored { .. }
                        ),
                        "{out:?}"
                    );
                    if matches!(out, StoreOutcome::Stored { .. }) {
                        *both.lock().unwrap() += 1;
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // One file per prefix, no temp file left, each one loads whole.
    let files = names(&dir);
    assert_eq!(files.len(), ROUNDS, "{files:?}");
    assert!(files.iter().all(|n| file::checkpoint_stem(n).is_some()));
    let (reader, _) = replica(&cfg);
    for r in 0..ROUNDS {
        let n = 40 + 8 * r;
        let (want, t) = prefix_session(&tok, &p, n);
        let mut s = session();
        let LookupOutcome::Hit(hit) = reader.lookup(&mut s, &t) else {
            panic!("round {r}: no hit")
        };
        assert_eq!(hit.tokens, n);
        assert_eq!(s.tokens(), want.tokens());
        assert_eq!(s.logits(), want.logits(), "round {r}: state differs");
    }
    let wrote = *both_wrote.lock().unwrap();
    eprintln!("{wrote} stores of {} wrote a file", 2 * ROUNDS);

    // The race forced: both writers past the "already stored" check, their
    // writes of one checkpoint released together, many times.
    let (s, t) = prefix_session(&tok, &p, 100);
    let payload = s.save_snapshot().unwrap();
    let path = dir.join(format!("{}.kv", file::sha1_hex(&t)));
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let (b, path, t, payload) = (barrier.clone(), path.clone(), t.clone(), payload.clone());
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let c = NewCheckpoint {
                        header: KvcHeader {
                            quant_bits: 2,
                            reason: SaveReason::Cold,
                            ext_flags: 0,
                            tokens: 100,
                            hits: 0,
                            ctx: CTX as u32,
                            created: NOW,
                            last_used: NOW,
                            payload_bytes: payload.len() as u64,
                            checksum: Some(file::checksum(&t, &payload)),
                            arch: ds4::model::Arch::V4,
                        },
                        text: &t,
                        payload: &payload,
                        tool_map: &[],
                    };
                    b.wait();
                    file::write_atomic(&path, &c, None).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(names(&dir).len(), ROUNDS + 1, "{:?}", names(&dir));
    let mut into = session();
    let LookupOutcome::Hit(hit) = reader.lookup(&mut into, &t) else {
        panic!("the raced file does not load")
    };
    assert_eq!(hit.tokens, 100);
    assert_eq!(into.logits(), s.logits());
}

#[test]
fn a_replica_loads_another_replicas_checkpoint_exactly_as_its_own() {
    let Shared {
        tok, cfg, text, p, ..
    } = shared("cross-load", 2);
    let (a, _) = replica(&cfg);
    let (b, _) = replica(&cfg);
    let (s, t) = prefix_session(&tok, &p, 64);
    assert!(matches!(
        a.store(&s, &t, CacheKey::Tokens, SaveReason::Continued, &[]),
        StoreOutcome::Stored { .. }
    ));
    let mut own = session();
    let mut other = session();
    let LookupOutcome::Hit(h_own) = a.lookup(&mut own, text.as_bytes()) else {
        panic!()
    };
    let LookupOutcome::Hit(h_other) = b.lookup(&mut other, text.as_bytes()) else {
        panic!()
    };
    assert_eq!(h_own, h_other, "the same hit, field by field");
    assert_eq!(own.tokens(), other.tokens());
    assert_eq!(own.logits(), other.logits());
    assert_eq!(other.logits(), s.logits(), "the writer's exact state");
    // Both continue identically from the loaded state.
    own.sync(&p[..90], &mut |_, _| {}).unwrap();
    other.sync(&p[..90], &mut |_, _| {}).unwrap();
    assert_eq!(own.logits(), other.logits());
}

/// A synthetic checkpoint (eviction reads only headers and sizes).
fn synthetic(dir: &Path, text: &str, tokens: u32, used: u64, payload: usize) -> String {
    common::synthetic_checkpoint(dir, CTX, text, tokens, 0, used, payload)
}

const NOW: u64 = 1_800_000_000;

#[test]
fn the_budget_counts_the_folder_not_one_replicas_writes() {
    let dir = fresh_dir("budget");
    let cfg = config(&dir);
    let (a, _) = replica(&cfg);
    let (mut b, _) = replica(&cfg);
    b.set_now(Some(NOW));
    // Replica A's three files; B writes one more; B's eviction under room
    // for three must delete one of A's (B wrote only one file itself).
    for (i, t) in ["a1", "a2", "a3"].iter().enumerate() {
        synthetic(&dir, t, 10 + i as u32, NOW - 60, 100_000);
    }
    drop(a);
    let mine = synthetic(&dir, "b1", 50, NOW, 100_000);
    let budget = folder_bytes(&dir) - 1;
    let gone = b.evict_within(budget, Some(&mine));
    assert_eq!(gone.len(), 1);
    assert_eq!(
        gone[0].sha,
        file::sha1_hex(b"a1"),
        "the lowest score of A's"
    );
    assert!(folder_bytes(&dir) <= budget);
    assert!(names(&dir).contains(&format!("{mine}.kv")));
}

#[test]
fn two_evictors_at_once_remove_what_one_would() {
    for round in 0..4u64 {
        let dir = fresh_dir(&format!("two-evictors-{round}"));
        let twin = fresh_dir(&format!("two-evictors-{round}-alone"));
        for d in [&dir, &twin] {
            for i in 0..16u32 {
                // Distinct scores: tokens vary, sizes equal.
                synthetic(
                    d,
                    &format!("f{round}-{i}"),
                    10 + (i * 7) % 16,
                    NOW - 60,
                    50_000,
                );
            }
        }
        let budget = folder_bytes(&dir) / 3;
        // One evictor alone, on an identical folder.
        let (mut alone, _) = replica(&config(&twin));
        alone.set_now(Some(NOW));
        alone.evict_within(budget, None);
        let want = names(&twin);
        // Two at once on the shared one.
        let barrier = Arc::new(Barrier::new(2));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (mut c, _) = replica(&config(&dir));
                c.set_now(Some(NOW));
                let b = barrier.clone();
                std::thread::spawn(move || {
                    b.wait();
                    c.evict_within(budget, None).len()
                })
            })
            .collect();
        let removed: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(names(&dir), want, "round {round}");
        assert_eq!(removed, 16 - want.len(), "each file deleted once");
        assert!(folder_bytes(&dir) <= budget);
    }
}

#[test]
fn an_evictor_skips_a_file_another_replica_is_reading() {
    let dir = fresh_dir("reading");
    let cfg = config(&dir);
    let sha = synthetic(&dir, "being read", 20, NOW, 200_000);
    let path = dir.join(format!("{sha}.kv"));
    let (mut evictor, log) = replica(&cfg);
    evictor.set_now(Some(NOW));
    // Another replica mid-read: its descriptor holds the shared lock.
    let reading = guard::open_read(&path).unwrap();
    guard::lock_for_reading(&reading, &path).unwrap();
    assert!(evictor.evict_within(0, None).is_empty());
    assert!(path.exists(), "a file being read is never deleted");
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("another process is reading it")));
    drop(reading);
    assert_eq!(evictor.evict_within(0, None).len(), 1);
    assert!(!path.exists());
}

#[test]
fn loads_racing_evictions_and_rewrites_never_load_garbage() {
    let Shared {
        tok, cfg, text, p, ..
    } = shared("race", 3);
    let lens = [32usize, 48, 64];
    let refs: Vec<(Vec<u32>, Vec<f32>)> = lens
        .iter()
        .map(|&n| {
            let (s, _) = prefix_session(&tok, &p, n);
            (s.tokens().to_vec(), s.logits().to_vec())
        })
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Writer/evictor replica: stores the three prefixes over and over and
    // evicts everything between rounds.
    let (w, _) = replica(&cfg);
    let (pw, stop_w) = (p.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let tok = tokenizer();
        let mut rounds = 0;
        while !stop_w.load(std::sync::atomic::Ordering::Relaxed) {
            for &n in &lens {
                let (s, t) = prefix_session(&tok, &pw, n);
                w.store(&s, &t, CacheKey::Tokens, SaveReason::Cold, &[]);
            }
            w.evict_within(0, None);
            rounds += 1;
        }
        rounds
    });
    let (r, _) = replica(&cfg);
    let (mut hits, mut misses) = (0, 0);
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        let mut s = session();
        match r.lookup(&mut s, text.as_bytes()) {
            LookupOutcome::Hit(h) => {
                let i = lens.iter().position(|&n| n == h.tokens).unwrap();
                assert_eq!(s.tokens(), &refs[i].0[..]);
                assert_eq!(s.logits(), &refs[i].1[..], "a loaded state is whole");
                hits += 1;
            }
            LookupOutcome::Miss => misses += 1,
            LookupOutcome::Failed {
                reason,
                invalidated,
                ..
            } => {
                // A file gone under the read is a miss, never damage.
                assert!(!invalidated, "{reason}");
                assert!(!reason.contains("checksum") && !reason.contains("hashes"));
                misses += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    eprintln!(
        "{hits} hits, {misses} misses while the other replica wrote and evicted {rounds} rounds"
    );
    assert_eq!(r.metrics().snapshot().corrupt_removed, 0);
    assert!(hits > 0 && rounds > 0);
}

/// A pid that no process has now (a child that has exited).
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn a_killed_writers_leftovers_are_never_loaded() {
    let Shared {
        tok,
        dir,
        cfg,
        text,
        p,
    } = shared("killed", 4);
    let (s, t) = prefix_session(&tok, &p, 60);
    // A complete file written elsewhere, then cut: as a killed writer
    // leaves its temp file, and as a copy cut short leaves a final name.
    let src = fresh_dir("killed-src");
    let (w, _) = replica(&config(&src));
    let StoreOutcome::Stored { sha, .. } = w.store(&s, &t, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!()
    };
    let whole = fs::read(src.join(format!("{sha}.kv"))).unwrap();
    let half = &whole[..whole.len() / 2];
    let host = file::host_tag();
    let dead = dead_pid();
    let here_dead = format!("{sha}.kv.tmp.{dead}.{host}.0");
    let ds4_dead = format!("{sha}.kv.tmp.{dead}");
    let other_fresh = format!("{sha}.kv.tmp.{dead}.0badc0de.3");
    let other_old = format!("{sha}.kv.tmp.{dead}.0badc0de.4");
    for n in [&here_dead, &ds4_dead, &other_fresh, &other_old] {
        fs::write(dir.join(n), half).unwrap();
    }
    let old = SystemTime::now() - Duration::from_secs(2 * 3600);
    fs::File::options()
        .write(true)
        .open(dir.join(&other_old))
        .unwrap()
        .set_modified(old)
        .unwrap();
    // A final name holding a cut file (valid header, short body).
    let cut_sha = file::sha1_hex(&t[..t.len() - 1]);
    fs::write(dir.join(format!("{cut_sha}.kv")), half).unwrap();

    let (r, _) = replica(&cfg);
    // Opening removed the dead writers' temps of this host (and ds4's) and
    // the other host's old one; the other host's fresh one is its writer's.
    let left = names(&dir);
    assert!(left.contains(&other_fresh), "{left:?}");
    for n in [&here_dead, &ds4_dead, &other_old] {
        assert!(!left.contains(n), "{n} still there: {left:?}");
    }
    let mut into = session();
    assert_eq!(r.lookup(&mut into, text.as_bytes()), LookupOutcome::Miss);
    assert!(into.tokens().is_empty());
    assert!(!dir.join(format!("{cut_sha}.kv")).exists());
    assert_eq!(r.metrics().snapshot().corrupt_removed, 1);
}

#[test]
fn a_replica_that_cannot_write_keeps_serving_and_logs_once() {
    let Shared {
        tok,
        dir,
        cfg,
        text,
        p,
    } = shared("cannot-write", 5);
    let (mut c, log) = replica(&cfg);
    let (s, t) = prefix_session(&tok, &p, 40);
    assert!(matches!(
        c.store(&s, &t, CacheKey::Tokens, SaveReason::Cold, &[]),
        StoreOutcome::Stored { .. }
    ));
    // A full disk: every store fails, one log line, loads keep working.
    c.set_write_limit(Some(0));
    for n in [50, 60, 70] {
        let (s, t) = prefix_session(&tok, &p, n);
        assert!(matches!(
            c.store(&s, &t, CacheKey::Tokens, SaveReason::Continued, &[]),
            StoreOutcome::Failed(_)
        ));
        let mut into = session();
        assert!(matches!(
            c.lookup(&mut into, text.as_bytes()),
            LookupOutcome::Hit(_)
        ));
    }
    let count = |what: &str| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(what))
            .count()
    };
    assert_eq!(count("store failed"), 1, "{:?}", log.lock().unwrap());
    assert_eq!(c.metrics().snapshot().save_failures, 3);
    assert!(c.writes_failing());
    c.set_write_limit(None);
    let (s, t) = prefix_session(&tok, &p, 80);
    assert!(matches!(
        c.store(&s, &t, CacheKey::Tokens, SaveReason::Continued, &[]),
        StoreOutcome::Stored { .. }
    ));
    assert_eq!(count("work again"), 1);

    // A read-only folder: the permission bits for a plain user; for root
    // (whom mode bits do not stop) a read-only mount, if there is one.
    let Some(ro) = read_only_folder(&dir) else {
        eprintln!("read-only half skipped: running as root and no read-only mount to use");
        return;
    };
    let mut ro_cfg = config(&ro);
    ro_cfg.kv_cache_min_tokens = 16;
    let (c, log) = replica(&ro_cfg);
    for n in [50, 60] {
        let (s, t) = prefix_session(&tok, &p, n);
        assert!(matches!(
            c.store(&s, &t, CacheKey::Tokens, SaveReason::Continued, &[]),
            StoreOutcome::Failed(_)
        ));
    }
    let lines = log.lock().unwrap().clone();
    assert_eq!(
        lines.iter().filter(|l| l.contains("store failed")).count(),
        1,
        "{lines:?}"
    );
    if ro == dir {
        // The files already there still load (their header update fails
        // quietly: the folder is known to be unwritable).
        let mut into = session();
        assert!(matches!(
            c.lookup(&mut into, text.as_bytes()),
            LookupOutcome::Hit(_)
        ));
        let mut perm = fs::metadata(&dir).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o700);
        fs::set_permissions(&dir, perm).unwrap();
    }
}

/// `dir` made read-only (a plain user), else an existing folder on a
/// read-only mount that root owns and only root can write (root).
fn read_only_folder(dir: &Path) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let mut perm = fs::metadata(dir).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o500);
        fs::set_permissions(dir, perm).unwrap();
        return Some(dir.to_path_buf());
    }
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let (at, opts) = (f.get(1)?, f.get(3)?);
        if !opts.split(',').any(|o| o == "ro") {
            return None;
        }
        let p = PathBuf::from(at);
        let md = fs::metadata(&p).ok()?;
        use std::os::unix::fs::MetadataExt;
        (md.is_dir() && md.uid() == 0 && md.mode() & 0o022 == 0).then_some(p)
    })
}

/// The figures of KVCACHE.md § Shared folder: what the reader's lock and
/// the evictor's checks cost beside the load they protect.
#[test]
#[ignore = "measurement for docs/KVCACHE.md; run with --ignored --nocapture"]
fn measure_lock_cost() {
    let Shared {
        tok, dir, cfg, p, ..
    } = shared("lock-cost", 6);
    let (c, _) = replica(&cfg);
    let (s, t) = prefix_session(&tok, &p, 120);
    let StoreOutcome::Stored { sha, bytes } =
        c.store(&s, &t, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!()
    };
    let path = dir.join(format!("{sha}.kv"));
    const N: u32 = 20_000;
    let t0 = std::time::Instant::now();
    for _ in 0..N {
        let f = guard::open_read(&path).unwrap();
        std::hint::black_box(&f);
    }
    let open = t0.elapsed() / N;
    let t0 = std::time::Instant::now();
    for _ in 0..N {
        let f = guard::open_read(&path).unwrap();
        guard::lock_for_reading(&f, &path).unwrap();
    }
    let locked = t0.elapsed() / N;
    let mut into = session();
    let t0 = std::time::Instant::now();
    for _ in 0..20 {
        assert!(matches!(c.lookup(&mut into, &t), LookupOutcome::Hit(_)));
    }
    let load = t0.elapsed() / 20;
    // Evictor: a checked delete against a plain one, on small files.
    let files: Vec<(PathBuf, guard::FileId)> = (0..2000)
        .map(|i| {
            let p = dir.join(format!("{}.kv", file::sha1_hex(format!("{i}").as_bytes())));
            fs::write(&p, b"x").unwrap();
            let id = guard::FileId::at(&p).unwrap();
            (p, id)
        })
        .collect();
    let t0 = std::time::Instant::now();
    for (p, id) in &files[..1000] {
        assert_eq!(
            guard::remove_unread(p, *id).unwrap(),
            guard::Removal::Removed
        );
    }
    let checked = t0.elapsed() / 1000;
    let t0 = std::time::Instant::now();
    for (p, _) in &files[1000..] {
        fs::remove_file(p).unwrap();
    }
    let plain = t0.elapsed() / 1000;
    eprintln!(
        "open {open:?}; open + shared lock + identity check {locked:?} \
         (lock overhead {:?}); lookup + load of a {bytes}-byte, 120-token checkpoint {load:?}; \
         evictor delete: checked {checked:?}, plain {plain:?}",
        locked.saturating_sub(open)
    );
}
