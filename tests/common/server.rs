//! The real `ds4-server` binary for tests: the tiny model on 127.0.0.1, an
//! ephemeral port (or a chosen one), the scripted test mode, a lock file of
//! its own, killed when the handle drops. Raw HTTP helpers with read
//! timeouts, so no test waits forever on a server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ds4::testmodel::Variant;
use serde_json::Value;

pub const CTX: usize = 2048;

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A lock file of its own, so the tests' servers can run side by side.
pub fn lock_file() -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    std::env::temp_dir()
        .join(format!("ds4-test-{}-{n}.lock", std::process::id()))
        .to_string_lossy()
        .into_owned()
}

/// The server command on the tiny model with the scripted test mode.
pub fn command(extra: &[&str], port: u16) -> Command {
    let m = super::tiny_model_path(Variant::Q8);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-server"));
    cmd.env("DS4_LOCK_FILE", lock_file())
        .env("DS4_SERVER_TEST_SCRIPTS", "1")
        .args(extra)
        .args(["-m", m.to_str().unwrap(), "--port", &port.to_string()])
        .args(["--ctx", &CTX.to_string(), "-n", "64"]);
    cmd
}

/// Starts the server on an ephemeral port and reads the address from its
/// banner; stderr is dropped.
pub fn start(extra: &[&str]) -> Server {
    let mut child = command(extra, 0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "server exited early");
        if let Some(url) = line.trim().strip_prefix("ds4-server: listening on http://") {
            break url.to_string();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    Server { child, addr }
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

/// Waits (bounded) until `addr` answers `/health`; panics if the child
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

/// One raw HTTP exchange; returns the whole response text.
pub fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8(out).expect("valid UTF-8 response")
}

pub fn post(addr: &str, path: &str, body: &Value) -> String {
    let b = body.to_string();
    raw(
        addr,
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        )
        .as_bytes(),
    )
}

pub fn get(addr: &str, path: &str) -> String {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

pub fn status(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The JSON body of a non-streamed response.
pub fn json_body(resp: &str) -> Value {
    let body = &resp[resp.find("\r\n\r\n").map_or(resp.len(), |i| i + 4)..];
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}
