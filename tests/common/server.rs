//! The real `ds4-server` binary for tests: started on 127.0.0.1 with an
//! ephemeral port, the tiny model, the scripted test mode and a lock file of
//! its own (so servers run side by side); killed when dropped. Plus raw
//! HTTP/1.1 exchanges over `TcpStream`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;
use ds4::{BackendKind, Tokenizer};
use serde_json::Value;

/// A session on the tiny model as `start(&["--backend", "cpu"])` serves it
/// (the test servers' context, the fast CPU backend), and its tokenizer:
/// the engine whose numbers a server's answers must equal.
pub fn cpu_engine() -> (Session, Tokenizer) {
    let model = super::tiny_model(Variant::Q8);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let opts = SessionOptions {
        ctx: CTX,
        backend: BackendKind::Cpu,
        ..Default::default()
    };
    (Session::new(model, opts).unwrap(), tok)
}

/// Context of the test servers unless `--ctx` is given.
pub const CTX: usize = 2048;

pub struct Server {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    stderr: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

impl Server {
    /// Takes over a server the test started itself (its stderr went
    /// elsewhere, so `stderr_text` is empty).
    pub fn adopt(child: Child, addr: String) -> Server {
        Server {
            child,
            addr,
            stderr: temp_path("stderr"),
        }
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// A fresh path in the temporary folder, unique in this process.
pub fn temp_path(what: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    std::env::temp_dir().join(format!("ds4-test-{}-{n}.{what}", std::process::id()))
}

/// A lock file of its own, so the tests' servers can run side by side.
pub fn lock_file() -> String {
    temp_path("lock").to_string_lossy().into_owned()
}

/// Starts the server with `args` (after `-m TINY --port 0 -n 64`, and
/// `--ctx 2048` unless `args` sets it) and `env`; returns once it listens.
pub fn start_server(args: &[&str], env: &[(&str, &str)], lock: &str) -> Server {
    start_server_unset(args, env, &[], lock)
}

/// [`start_server`] with the variables in `unset` removed from its
/// environment.
pub fn start_server_unset(
    args: &[&str],
    env: &[(&str, &str)],
    unset: &[&str],
    lock: &str,
) -> Server {
    let m = super::tiny_model_path(Variant::Q8);
    let stderr = temp_path("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("DS4_LOCK_FILE", lock)
        .env("DS4_SERVER_TEST_SCRIPTS", "1")
        .env_remove("DS4_API_KEY")
        .args(args)
        .args(["-m", m.to_str().unwrap(), "--port", "0", "-n", "64"]);
    if !args.contains(&"--ctx") {
        cmd.args(["--ctx", &CTX.to_string()]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let _ = child.wait();
            panic!(
                "server exited early: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        if let Some(url) = line.trim().strip_prefix("ds4-server: listening on http://") {
            break url.to_string();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    Server {
        child,
        addr,
        stderr,
    }
}

/// One raw HTTP exchange; returns the whole response text.
pub fn raw(addr: &str, bytes: &[u8], close_write: bool) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(bytes).unwrap();
    if close_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8(out).expect("valid UTF-8 response")
}

/// The status code of a raw response (0 when there is none).
pub fn status(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The value of header `name` (any case) in a raw response.
pub fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The server command on the tiny model with the scripted test mode, a lock
/// file of its own and no inherited key, for tests that start the process
/// themselves (pipes, chosen ports).
pub fn command(extra: &[&str], port: u16) -> Command {
    let m = super::tiny_model_path(Variant::Q8);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("DS4_LOCK_FILE", lock_file())
        .env("DS4_SERVER_TEST_SCRIPTS", "1")
        .env_remove("DS4_API_KEY")
        .args(extra)
        .args(["-m", m.to_str().unwrap(), "--port", &port.to_string()])
        .args(["--ctx", &CTX.to_string(), "-n", "64"]);
    cmd
}

/// Starts the server with `extra` flags and a lock file of its own.
pub fn start(extra: &[&str]) -> Server {
    start_server(extra, &[], &lock_file())
}

/// A port that was free a moment ago (for servers whose banner the test
/// cannot read).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (bounded) until `addr` accepts connections; panics if the child
/// exits first.
pub fn wait_ready(child: &mut Child, addr: &str) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("server exited early: {st}");
        }
        if TcpStream::connect(addr).is_ok() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A JSON POST from a loopback client (passes the browser guards).
pub fn post(addr: &str, path: &str, body: &Value) -> String {
    let b = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    );
    raw(addr, req.as_bytes(), false)
}

pub fn get(addr: &str, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    raw(addr, req.as_bytes(), false)
}

/// The JSON body of a non-streamed response.
pub fn json_body(resp: &str) -> Value {
    let body = &resp[resp.find("\r\n\r\n").map_or(resp.len(), |i| i + 4)..];
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

/// Disk-cache save thresholds for tests: a short chat gets a checkpoint
/// every 16 tokens.
pub const SMALL_SAVES: &[&str] = &[
    "--kv-cache-min-tokens",
    "16",
    "--kv-cache-boundary-align-tokens",
    "16",
    "--kv-cache-continued-interval-tokens",
    "16",
];

/// How long a launched server may take to print its banner.
pub const START_BOUND: Duration = Duration::from_secs(60);

/// Spawns `cmd` (stdout piped, stderr to `log`) and returns once it prints
/// its listening banner; panics with the log if it exits first or takes
/// longer than `bound`. For tests that build their own command line (a
/// cache folder, chosen ports, `--demo`).
pub fn launch(mut cmd: Command, log: PathBuf, bound: Duration) -> Server {
    cmd.stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = cmd.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if let Some(a) = line.trim().strip_prefix("ds4-server: listening on http://") {
                let _ = tx.send(a.to_string());
                // Keep draining so the server never blocks on a full pipe.
                let _ = std::io::copy(&mut out, &mut std::io::sink());
                return;
            }
        }
    });
    let mut s = Server {
        child,
        addr: String::new(),
        stderr: log,
    };
    match rx.recv_timeout(bound) {
        Ok(a) => s.addr = a,
        Err(_) => panic!(
            "start-up did not complete within {bound:?}; log:\n{}",
            s.stderr_text()
        ),
    }
    s
}

impl Server {
    /// SIGTERM, then a bounded wait for a clean exit; returns the log.
    pub fn terminate(mut self) -> String {
        self.stop(libc::SIGTERM, Duration::from_secs(60));
        self.stderr_text()
    }

    /// Sends `signal` (SIGTERM or SIGINT), then waits at most `bound` for
    /// the server to exit, and asserts it exited cleanly.
    pub fn stop(&mut self, signal: libc::c_int, bound: Duration) {
        let name = if signal == libc::SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "server exit status {st}");
                return;
            }
            assert!(t0.elapsed() < bound, "no exit after {name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One counter or gauge of `/metrics` (integer part).
    pub fn metric(&self, name: &str) -> u64 {
        metric(&get(&self.addr, "/metrics"), name)
    }
}

/// One value of a `/metrics` text.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let v = l.strip_prefix(name)?.strip_prefix(' ')?;
            v.split('.').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}
