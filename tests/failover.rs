//! Replicas behind nginx with one shared disk KV cache (docs/DEPLOY.md),
//! with real processes: Debian's nginx running deploy/nginx.conf (ports
//! and paths rewritten into a temp folder, run as the current user) in
//! front of two `ds4-server --demo` replicas on loopback ports that share
//! one `--kv-disk-dir`.
//!
//! * (a) 5 turns with a session header stay on one replica: `cached_tokens`
//!   grows each turn and the other replica's `/metrics` shows no request;
//! * (b) that replica is killed with SIGKILL between turns: the next turn
//!   is served by the other one from the shared checkpoint, only the suffix
//!   evaluated (usage and `/metrics` say so);
//! * (c) 8 concurrent sessions spread over both replicas, each staying on
//!   its own; without a header the first user message keeps a conversation
//!   on one replica;
//! * (d) a checkpoint being written (or left cut, or damaged) while another
//!   replica scans the folder never loads as garbage.
//!
//! Skipped, with the reason printed, only where nginx is not installed
//! (`.ci/run` installs Debian's `nginx`). Every process is killed when its
//! test ends; every wait is bounded.
//!
//! `cargo test --release --test failover -- --ignored --nocapture` runs the
//! measurement behind docs/DEPLOY.md instead (time to first token of turn 5
//! with and without affinity, and of the first turn after a failover).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{free_port, launch, metric, Server, SMALL_SAVES, START_BOUND};
use serde_json::{json, Value};

const BOUND: Duration = Duration::from_secs(60);

// ---- nginx -------------------------------------------------------------------

/// Debian's nginx, if installed (`/usr/sbin` is not on a plain user's PATH).
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d: PathBuf| d.join("nginx"))
        .find(|p| p.is_file())
}

struct Nginx {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Drop for Nginx {
    /// SIGTERM, so the master stops its workers (a SIGKILLed master leaves
    /// them running); SIGKILL if it is not gone within the bound.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

/// deploy/nginx.conf with its three addresses replaced and every path nginx
/// writes pointed into `dir`.
fn nginx_config(dir: &Path, port: u16, replicas: [u16; 2]) -> String {
    let conf = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx.conf"))
        .expect("deploy/nginx.conf");
    for a in ["127.0.0.1:8000;", "127.0.0.1:8001 ", "127.0.0.1:8002 "] {
        assert!(conf.contains(a), "deploy/nginx.conf no longer names {a}");
    }
    let d = dir.display();
    let paths = format!(
        "http {{\n    access_log {d}/access.log;\n    client_body_temp_path {d}/body;\n    \
         proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
         uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n"
    );
    conf.replace("127.0.0.1:8000;", &format!("127.0.0.1:{port};"))
        .replace("127.0.0.1:8001 ", &format!("127.0.0.1:{} ", replicas[0]))
        .replace("127.0.0.1:8002 ", &format!("127.0.0.1:{} ", replicas[1]))
        .replacen("http {\n", &paths, 1)
}

/// nginx in the foreground with its own prefix, config, pid and logs in
/// `dir`, as the current user; returns once it accepts connections.
fn start_nginx(bin: &Path, dir: &Path, replicas: [u16; 2]) -> Nginx {
    std::fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_config(dir, port, replicas)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // As root nginx would switch its workers to another user, who could not
    // use this folder: keep them as the current user.
    let globals = format!(
        "daemon off; pid {}/nginx.pid;{}",
        dir.display(),
        if root { " user root;" } else { "" }
    );
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("error.log"))
        .args(["-g", &globals])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut n = Nginx {
        child,
        addr: format!("127.0.0.1:{port}"),
        dir: dir.to_path_buf(),
    };
    let t0 = Instant::now();
    while TcpStream::connect(&n.addr).is_err() {
        if let Some(st) = n.child.try_wait().unwrap() {
            panic!("nginx exited: {st}\n{}", n.error_log());
        }
        assert!(t0.elapsed() < BOUND, "nginx never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    n
}

// ---- replicas ----------------------------------------------------------------

/// One `ds4-server --demo` replica on `port` with the shared cache `cache`
/// and the save flags `saves`. The demo model is generated once under the
/// build tree.
fn start_replica(
    name: &str,
    port: u16,
    cache: &Path,
    saves: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let base = cache.parent().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.args(["--demo", "--port", &port.to_string()])
        .args(["--ctx", "8192", "-n", "16"])
        .arg("--kv-disk-dir")
        .arg(cache)
        .args(saves)
        .env(
            "XDG_CACHE_HOME",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("failover-demo-model"),
        )
        .env("DS4_LOCK_FILE", base.join(format!("{name}.lock")))
        .env("DS4_SERVER_TEST_SCRIPTS", "1")
        .env_remove("DS4_API_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    launch(cmd, base.join(format!("{name}.log")), START_BOUND)
}

/// Two replicas sharing one fresh cache folder, and nginx in front.
struct Cluster {
    nginx: Nginx,
    replicas: Vec<Option<Server>>,
    cache: PathBuf,
}

impl Cluster {
    /// `None` (with the reason printed) where nginx is not installed.
    fn start(name: &str) -> Option<Cluster> {
        Cluster::start_with(name, SMALL_SAVES)
    }

    fn start_with(name: &str, saves: &[&str]) -> Option<Cluster> {
        let Some(bin) = nginx_binary() else {
            eprintln!(
                "skipped: nginx is not installed (Debian's package `nginx`; .ci/run installs it)"
            );
            return None;
        };
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("failover-{name}"));
        let _ = std::fs::remove_dir_all(&base);
        let cache = base.join("kv");
        std::fs::create_dir_all(&cache).unwrap();
        // One replica first: it generates the demo model the other reuses.
        let a = start_replica("a", free_port(), &cache, saves, &[]);
        let b = start_replica("b", free_port(), &cache, saves, &[]);
        let ports = [port_of(&a), port_of(&b)];
        let nginx = start_nginx(&bin, &base.join("nginx"), ports);
        Some(Cluster {
            nginx,
            replicas: vec![Some(a), Some(b)],
            cache,
        })
    }

    fn replica(&self, i: usize) -> &Server {
        self.replicas[i].as_ref().expect("replica alive")
    }

    /// Which replica an `X-DS4-Replica` value names: the last address
    /// nginx tried (`dead, survivor` after a failover).
    fn index_of(&self, upstream: &str) -> usize {
        let upstream = upstream.rsplit(", ").next().unwrap_or(upstream);
        self.replicas
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.addr == upstream))
            .unwrap_or_else(|| panic!("unknown upstream {upstream:?}"))
    }

    fn kill(&mut self, i: usize) {
        let mut s = self.replicas[i].take().unwrap();
        s.child.kill().unwrap(); // SIGKILL: no shutdown save
        s.child.wait().unwrap();
    }
}

fn port_of(s: &Server) -> u16 {
    s.addr.rsplit(':').next().unwrap().parse().unwrap()
}

// ---- requests ----------------------------------------------------------------

/// One HTTP/1.1 request; the whole response.
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("a reply within the bound");
    String::from_utf8_lossy(&out).into_owned()
}

/// The answer to one chat turn through nginx.
struct Turn {
    replica: String,
    body: Value,
}

impl Turn {
    fn prompt_tokens(&self) -> u64 {
        self.body["usage"]["prompt_tokens"].as_u64().unwrap()
    }
    fn cached(&self) -> u64 {
        self.body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    }
    fn content(&self) -> &str {
        self.body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    }
}

fn chat_body(messages: &[Value], reply: &str, stream: bool) -> String {
    json!({
        "model": "deepseek-v4-flash",
        "messages": messages,
        "max_tokens": 16,
        "thinking": {"type": "disabled"},
        "ds4_test_script": reply,
        "stream": stream,
    })
    .to_string()
}

fn turn(addr: &str, headers: &[(&str, &str)], messages: &[Value], reply: &str) -> Turn {
    let r = http(
        addr,
        "POST",
        "/v1/chat/completions",
        headers,
        &chat_body(messages, reply, false),
    );
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "{r}");
    let replica = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("x-ds4-replica")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Turn {
        replica,
        body: serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {r}")),
    }
}

/// A conversation of `turns` user turns; reply `i` is the scripted answer
/// to user turn `i` (the live KV holds exactly what the next request sends).
struct Conversation {
    messages: Vec<Value>,
    topic: String,
}

impl Conversation {
    fn new(topic: &str) -> Conversation {
        Conversation {
            messages: vec![json!({"role": "system", "content":
                "You are a careful assistant working on a software project. Answer briefly."})],
            topic: topic.to_string(),
        }
    }

    /// The next user message (about 40 tokens), pushed.
    fn ask(&mut self, i: usize) -> &[Value] {
        self.messages
            .push(json!({"role": "user", "content": format!(
                "Question {i} about {}: please look at the module that handles {} and tell me \
                 whether the change number {i} keeps every test passing, and why.",
                self.topic, self.topic
            )}));
        &self.messages
    }

    fn answered(&mut self, reply: &str) {
        self.messages
            .push(json!({"role": "assistant", "content": reply}));
    }
}

fn reply(i: usize) -> String {
    format!("Change {i} keeps the tests passing.")
}

// ---- (a) + (b) -----------------------------------------------------------------

#[test]
fn a_session_stays_on_one_replica_and_fails_over_warm() {
    let Some(mut c) = Cluster::start("affinity") else {
        return;
    };
    let nginx = c.nginx.addr.clone();
    let hdr = [("X-Claude-Code-Session-Id", "3f0c2a9e-affinity")];
    let mut conv = Conversation::new("the disk cache");
    let mut home = None;
    let mut last_cached = 0;
    let mut last_prompt = 0;
    for i in 1..=5 {
        let t = turn(&nginx, &hdr, conv.ask(i), &reply(i));
        assert_eq!(t.content(), reply(i));
        let r = c.index_of(&t.replica);
        assert_eq!(
            *home.get_or_insert(r),
            r,
            "turn {i} moved to another replica"
        );
        if i > 1 {
            assert!(
                t.cached() > last_cached,
                "turn {i}: cached {} after {last_cached}",
                t.cached()
            );
            // The live session: everything the previous turn held is reused.
            assert!(t.cached() >= last_prompt);
        }
        last_cached = t.cached();
        last_prompt = t.prompt_tokens();
        conv.answered(&reply(i));
    }
    let home = home.unwrap();
    let other = 1 - home;
    assert_eq!(c.replica(home).metric("ds4_requests_total"), 5);
    assert_eq!(c.replica(other).metric("ds4_requests_total"), 0);
    assert!(c.replica(home).metric("ds4_kv_disk_saves_total") > 0);

    // (b) SIGKILL the home replica between turns.
    c.kill(home);
    let before = get_metrics(c.replica(other));
    let t = turn(&nginx, &hdr, conv.ask(6), &reply(6));
    assert_eq!(t.content(), reply(6));
    assert_eq!(c.index_of(&t.replica), other, "served by the survivor");
    // nginx tried the dead replica first, then the next on the ring.
    assert!(t.replica.contains(", "), "{}", t.replica);
    let after = get_metrics(c.replica(other));
    let d = |name: &str| metric(&after, name) - metric(&before, name);
    assert_eq!(d("ds4_requests_total"), 1);
    assert_eq!(
        d("ds4_kv_disk_hits_total"),
        1,
        "resumed from the shared folder"
    );
    // The checkpoint covers turn 5's prompt up to the last 16-token save
    // boundary; only the rest is evaluated.
    assert!(
        t.cached() + 16 > last_prompt,
        "cached {} of turn 5's {last_prompt}",
        t.cached()
    );
    assert_eq!(
        d("ds4_prompt_tokens_evaluated_total"),
        t.prompt_tokens() - t.cached(),
        "only the suffix is evaluated"
    );
    eprintln!(
        "failover: turn 6 on the survivor, {} of {} prompt tokens from the shared folder",
        t.cached(),
        t.prompt_tokens()
    );
    // The conversation stays on the survivor for the next turn, live.
    conv.answered(&reply(6));
    let t7 = turn(&nginx, &hdr, conv.ask(7), &reply(7));
    assert_eq!(c.index_of(&t7.replica), other);
    assert!(t7.cached() >= t.prompt_tokens());
}

fn get_metrics(s: &Server) -> String {
    http(&s.addr, "GET", "/metrics", &[], "")
}

// ---- (c) -----------------------------------------------------------------------

#[test]
fn eight_concurrent_sessions_spread_over_both_replicas() {
    let Some(c) = Cluster::start("spread") else {
        return;
    };
    let nginx = c.nginx.addr.clone();
    // Session ids as the three agents send them (fixed, so the spread is
    // the same on every run).
    let headers = [
        "X-Claude-Code-Session-Id",
        "session-id",
        "x-session-affinity",
    ];
    let sessions: Vec<_> = (0..8)
        .map(|k| {
            let nginx = nginx.clone();
            let h = headers[k % 3];
            std::thread::spawn(move || {
                let id = format!("session-{k}-7d1e");
                let mut conv = Conversation::new(&format!("subsystem {k}"));
                let mut served = Vec::new();
                for i in 1..=2 {
                    let t = turn(&nginx, &[(h, &id)], conv.ask(i), &reply(i));
                    assert_eq!(t.content(), reply(i));
                    served.push((t.replica.clone(), t.cached()));
                    conv.answered(&reply(i));
                }
                served
            })
        })
        .collect();
    let mut per_replica = [0usize; 2];
    for (k, h) in sessions.into_iter().enumerate() {
        let served = h.join().unwrap();
        assert_eq!(served[0].0, served[1].0, "session {k} moved");
        per_replica[c.index_of(&served[0].0)] += 1;
    }
    eprintln!("8 sessions: {per_replica:?} per replica");
    assert!(
        per_replica.iter().all(|&n| n > 0),
        "both replicas serve: {per_replica:?}"
    );
    assert_eq!(
        c.replica(0).metric("ds4_requests_total") + c.replica(1).metric("ds4_requests_total"),
        16
    );

    // No header: the first user message keeps a conversation on one
    // replica while it grows.
    let mut conv = Conversation::new("the fallback key");
    let mut home = None;
    for i in 1..=3 {
        let t = turn(&nginx, &[], conv.ask(i), &reply(i));
        let r = c.index_of(&t.replica);
        assert_eq!(*home.get_or_insert(r), r, "headerless turn {i} moved");
        conv.answered(&reply(i));
    }
    // And requests without a key at all (GET) are balanced round robin.
    let mut seen = [false; 2];
    for _ in 0..4 {
        let r = http(&nginx, "GET", "/v1/models", &[], "");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        let up = r
            .lines()
            .find_map(|l| l.strip_prefix("X-DS4-Replica: "))
            .unwrap();
        seen[c.index_of(up.trim())] = true;
    }
    assert_eq!(seen, [true, true]);
}

// ---- (d) -----------------------------------------------------------------------

fn kv_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_checkpoint_being_written_never_loads_as_garbage() {
    let Some(mut c) = Cluster::start("writing") else {
        return;
    };
    // Replica A writes the checkpoints of a conversation's first turn.
    let a = c.replica(0).addr.clone();
    let mut conv = Conversation::new("partial files");
    let t1 = turn(&a, &[], conv.ask(1), &reply(1));
    conv.answered(&reply(1));
    conv.ask(2);
    let q2 = conv.messages.clone();
    c.kill(0);
    // The scanning replica never writes (every write fails: a full disk),
    // so the folder holds only A's files and what this test puts there.
    let b_port = port_of(c.replica(1));
    c.replicas[1] = None;
    let b = start_replica(
        "b2",
        b_port,
        &c.cache,
        SMALL_SAVES,
        &[("DS4_KV_TEST_WRITE_LIMIT", "0")],
    );
    // Another conversation between probes replaces B's live session, so each
    // probe of turn 2 goes to the folder.
    let mut other = Conversation::new("something else entirely");
    other.messages[0] = json!({"role": "system", "content": "Different system prompt."});
    other.ask(1);
    let probe = |what: &str| -> Turn {
        turn(&b.addr, &[], &other.messages, "Noted.");
        let t = turn(&b.addr, &[], &q2, &reply(2));
        assert_eq!(t.content(), reply(2), "{what}");
        t
    };
    // Turn 2 loads one of A's checkpoints: B's log names it.
    let loaded = probe("A's checkpoint");
    assert!(loaded.cached() > 0);
    let log = b.stderr_text();
    let best = PathBuf::from(
        log.lines()
            .find_map(|l| {
                l.contains("kv cache: hit ")
                    .then(|| l.split("file=").nth(1))?
            })
            .unwrap_or_else(|| panic!("no hit line in:\n{log}"))
            .trim(),
    );
    let whole = std::fs::read(&best).unwrap();
    for p in kv_files(&c.cache) {
        std::fs::remove_file(p).unwrap();
    }
    let hits0 = b.metric("ds4_kv_disk_hits_total");

    // 1. Half written under its temp name, writer alive: invisible.
    let tmp = PathBuf::from(format!(
        "{}.tmp.{}.{}.0",
        best.display(),
        std::process::id(),
        ds4::kvcache::file::host_tag()
    ));
    std::fs::write(&tmp, &whole[..whole.len() / 2]).unwrap();
    assert_eq!(probe("temp file").cached(), 0);
    // 2. Cut under the final name (a copy that died): removed, not loaded.
    std::fs::write(&best, &whole[..whole.len() / 2]).unwrap();
    assert_eq!(probe("cut file").cached(), 0);
    assert!(!best.exists(), "a cut file is removed");
    // 3. Whole length, damaged payload: the checksum refuses it.
    let mut bad = whole.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x5a;
    std::fs::write(&best, &bad).unwrap();
    assert_eq!(probe("damaged file").cached(), 0);
    assert!(!best.exists(), "a damaged file is removed");
    assert_eq!(b.metric("ds4_kv_disk_corrupt_removed_total"), 2);
    assert_eq!(b.metric("ds4_kv_disk_hits_total"), hits0);
    std::fs::remove_file(&tmp).unwrap();

    // 4. A writer rewriting it over and over (slowly, temp + rename, as a
    // replica does) while B scans and loads: every probe loads the whole
    // checkpoint or nothing.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stop2, path, bytes) = (stop.clone(), best.clone(), whole.clone());
    let writer = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let tmp = ds4::kvcache::file::temp_path(&path);
            let mut f = std::fs::File::create(&tmp).unwrap();
            for chunk in bytes.chunks(bytes.len() / 8 + 1) {
                f.write_all(chunk).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            f.sync_all().unwrap();
            drop(f);
            std::fs::rename(&tmp, &path).unwrap();
            n += 1;
        }
        n
    });
    let mut hits = 0;
    for _ in 0..6 {
        let t = probe("rewritten file");
        assert!(t.cached() == 0 || t.cached() == loaded.cached());
        assert!(loaded.cached() + 16 > t1.prompt_tokens());
        hits += usize::from(t.cached() > 0);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rewrites = writer.join().unwrap();
    eprintln!("{hits} of 6 probes loaded the checkpoint during {rewrites} rewrites");
    assert!(hits > 0, "the complete file loads");
    assert_eq!(b.metric("ds4_kv_disk_corrupt_removed_total"), 2);
    assert!(b
        .stderr_text()
        .lines()
        .all(|l| !l.contains("payload checksum") || l.contains("removed")));
}

// ---- measurement (docs/DEPLOY.md) ----------------------------------------------

/// Seconds to the first streamed content byte of one chat turn.
fn ttft(addr: &str, headers: &[(&str, &str)], messages: &[Value], reply: &str) -> f64 {
    let body = chat_body(messages, reply, true);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut first = None;
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if first.is_none() && line.starts_with("data:") && line.contains("\"content\":\"") {
            first = Some(t0.elapsed().as_secs_f64());
        }
    }
    first.expect("a streamed content delta")
}

/// The figures of docs/DEPLOY.md: median time to first token of turn 5
/// with affinity (live KV), without (round robin: turn 5 lands on the
/// other replica, which loads the shared checkpoint), without affinity and
/// without a shared folder (full prefill), and of the first turn after a
/// SIGKILL failover. `DS4_DEPLOY_TURN_WORDS` sets the length of each user
/// turn (default 400 words).
#[test]
#[ignore = "measurement for docs/DEPLOY.md; run with --ignored --nocapture"]
fn measure_affinity_and_failover() {
    let words: usize = std::env::var("DS4_DEPLOY_TURN_WORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    // ds4's save defaults, then continued saves every 512 tokens (what a
    // deployment that wants warm failover sets).
    measure("defaults", &[], words);
    measure(
        "continued saves every 512 tokens",
        &[
            "--kv-cache-continued-interval-tokens",
            "512",
            "--kv-cache-boundary-align-tokens",
            "512",
        ],
        words,
    );
}

fn measure(label: &str, saves: &[&str], words: usize) {
    let Some(mut c) = Cluster::start_with(&format!("measure-{}", saves.len()), saves) else {
        return;
    };
    let nginx = c.nginx.addr.clone();
    let long_turn = |k: usize, i: usize| -> Value {
        let mut s = format!("Session {k}, turn {i}. Here is the file under review:\n");
        for w in 0..words {
            s.push_str(["alpha ", "beta ", "gamma ", "delta ", "omega "][(w * 7 + i + k) % 5]);
        }
        json!({"role": "user", "content": s})
    };
    // Without affinity each turn lands where other conversations ran last:
    // a short unrelated request first takes the replica's live slot.
    let filler = vec![
        json!({"role": "system", "content": "Another user."}),
        json!({"role": "user", "content": "Hello there."}),
    ];
    let cache = c.cache.clone();
    let run = |k: usize,
               headers: &[(&str, &str)],
               target: &dyn Fn(usize) -> Option<String>,
               wipe: bool| {
        let mut m = vec![json!({"role": "system", "content": "You review code."})];
        let mut t5 = 0.0;
        for i in 1..=5 {
            m.push(long_turn(k, i));
            let addr = match target(i) {
                Some(a) => {
                    turn(&a, &[], &filler, "Hi.");
                    if wipe {
                        for p in kv_files(&cache) {
                            let _ = std::fs::remove_file(p);
                        }
                    }
                    a
                }
                None => nginx.clone(),
            };
            let t = ttft(&addr, headers, &m, &reply(i));
            if i == 5 {
                t5 = t;
            }
            m.push(json!({"role": "assistant", "content": reply(i)}));
        }
        t5
    };
    let a = c.replica(0).addr.clone();
    let b = c.replica(1).addr.clone();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let reps = 3;
    let with: Vec<f64> = (0..reps)
        .map(|k| {
            let id = format!("measure-{k}");
            run(k, &[("x-session-affinity", &id)], &|_| None, false)
        })
        .collect();
    // Without affinity: turns alternate between the replicas (what round
    // robin does to a conversation), so turn 5 finds its prefix only in
    // the shared folder.
    let rr: Vec<f64> = (0..reps)
        .map(|k| {
            run(
                10 + k,
                &[],
                &|i| Some(if i % 2 == 1 { a.clone() } else { b.clone() }),
                false,
            )
        })
        .collect();
    // Without affinity and without a disk cache: the checkpoints are
    // deleted before each turn, so turn 5 is a full prefill.
    let cold: Vec<f64> = (0..reps)
        .map(|k| {
            run(
                20 + k,
                &[],
                &|i| Some(if i % 2 == 1 { a.clone() } else { b.clone() }),
                true,
            )
        })
        .collect();
    // Failover: a 4-turn session on its home replica, SIGKILL, turn 5 on
    // the survivor through nginx.
    let hdr = [("x-session-affinity", "measure-failover")];
    let mut m = vec![json!({"role": "system", "content": "You review code."})];
    let mut home = None;
    for i in 1..=4 {
        m.push(long_turn(99, i));
        let t = turn(&nginx, &hdr, &m, &reply(i));
        home = Some(c.index_of(&t.replica));
        m.push(json!({"role": "assistant", "content": reply(i)}));
    }
    m.push(long_turn(99, 5));
    c.kill(home.unwrap());
    let survivor = c.replica(1 - home.unwrap());
    let before = get_metrics(survivor);
    let failover = ttft(&nginx, &hdr, &m, &reply(5));
    let after = get_metrics(survivor);
    let evaluated = metric(&after, "ds4_prompt_tokens_evaluated_total")
        - metric(&before, "ds4_prompt_tokens_evaluated_total");
    let prompt = turn(&survivor.addr, &[], &m, &reply(5)).prompt_tokens();
    let written: u64 = c
        .replicas
        .iter()
        .flatten()
        .map(|r| r.metric("ds4_kv_disk_bytes_written_total"))
        .sum();
    eprintln!("== {label}");
    eprintln!("turn-5 prompt: {prompt} tokens; {words} words per user turn; median of {reps}");
    eprintln!(
        "TTFT turn 5, affinity (live KV):            {:.3} s",
        median(with)
    );
    eprintln!(
        "TTFT turn 5, round robin + shared folder:   {:.3} s",
        median(rr)
    );
    eprintln!(
        "TTFT turn 5, round robin, no disk cache:     {:.3} s",
        median(cold)
    );
    eprintln!(
        "TTFT turn 5 right after a SIGKILL failover: {failover:.3} s \
         ({} of {prompt} prompt tokens from the folder)",
        prompt - evaluated
    );
    eprintln!(
        "checkpoints written by the survivor, all runs: {:.1} MiB",
        written as f64 / 1048576.0
    );
}
