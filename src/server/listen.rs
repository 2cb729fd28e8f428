//! The TCP side of `ds4-server`: an accept loop that serves the warp filter
//! through hyper's HTTP/1 connection driver, under the connection limits of
//! docs/SECURITY.md — a connection cap, a header-read deadline and a
//! keep-alive idle deadline. (The body-idle deadline and the body cap are
//! the filter's, in `routes`, because only the handler knows when it is
//! reading a body.)
//!
//! Why not `warp::serve` or hyper's `Server`: neither caps connections, and
//! hyper 0.14's `http1_header_read_timeout` starts its timer whenever the
//! connection waits for a request head — also on an idle keep-alive
//! connection — so it cannot give a short header deadline beside a long
//! keep-alive one. Here each connection carries a small [`Clock`] that the
//! socket wrapper, the service and the response body move between phases:
//!
//! ```text
//! accept ─► Head (header deadline from accept) ─► Busy (handler running: no
//! deadline; the handler bounds its own body reads) ─► Sending (response body
//! being written: deadline = last write + keep-alive) ─► Idle (deadline =
//! end of response + keep-alive) ─first byte─► Head (header deadline) ─► …
//! ```
//!
//! A connection past its deadline is closed without a reply (as hyper does
//! for its own header timeout). A connection over the cap gets a fixed
//! `503` with `Connection: close` and is closed before its request is read.
//! A connection that ends after a response closes with a short linger
//! ([`linger`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use warp::http::{HeaderMap, Request};
use warp::hyper::body::{HttpBody, SizeHint};
use warp::hyper::server::conn::Http;
use warp::hyper::service::{service_fn, Service};
use warp::hyper::Body;

use super::routes::{self, State};

/// Connection-level limits (flags `--header-timeout`, `--idle-timeout`,
/// `--max-connections`; defaults in docs/SECURITY.md).
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// From accept (or from the first byte of a later request) to the end of
    /// the request head.
    pub header_read: Duration,
    /// How long a keep-alive connection may sit between requests, and how
    /// long a response write may make no progress.
    pub keep_alive_idle: Duration,
    /// Open connections served at once; one more is answered `503`.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            header_read: Duration::from_secs(10),
            keep_alive_idle: Duration::from_secs(60),
            max_connections: default_max_connections(),
        }
    }
}

/// Descriptors kept free for everything that is not a client socket: the
/// model file, disk-cache files, the trace, stdio, tokio's and the GPU
/// driver's own descriptors.
const RESERVED_FDS: u64 = 64;

/// More connections than this are no use to one engine that serves one
/// request at a time (the queue holds 64 by default), and each may hold a
/// request body of up to `--max-body-bytes`.
const MAX_DEFAULT_CONNECTIONS: u64 = 256;

/// The default cap: what the descriptor limit leaves after [`RESERVED_FDS`],
/// at most [`MAX_DEFAULT_CONNECTIONS`] (half the limit when it is tiny), so
/// the process never runs out of descriptors before the cap refuses.
pub fn default_max_connections() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        // `rlim_t` is 32 bits wide on some 32-bit targets.
        #[allow(clippy::unnecessary_cast)]
        let cur = lim.rlim_cur as u64;
        cur
    } else {
        1024
    };
    let n = if soft <= 2 * RESERVED_FDS {
        soft / 2
    } else {
        soft - RESERVED_FDS
    };
    n.clamp(1, MAX_DEFAULT_CONNECTIONS) as usize
}

/// The start-up warning for a server that other hosts can reach without a
/// key (`None` on a loopback address or with a key).
pub fn exposure_warning(ip: std::net::IpAddr, keyed: bool) -> Option<String> {
    (!keyed && !ip.is_loopback()).then(|| {
        format!("warning: listening on {ip} without an API key: any host that can reach this address can connect, and only requests that name localhost as their Host are answered; set --api-key-file or DS4_API_KEY to serve the network")
    })
}

/// The reply to a connection over the cap, written without reading the request.
const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 92\r\n\
\r\n\
{\"error\":{\"message\":\"too many open connections (--max-connections)\",\"type\":\"server_error\"}}\n";

/// Pause after an accept error (out of descriptors): the listener stays
/// readable, so retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `state`'s routes on `listener` until `shutdown` resolves, then
/// stops accepting, lets every open connection finish its current request
/// (idle ones close at once) and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let cap = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(cap));
    let (stop_tx, stop_rx) = watch::channel(false);
    let svc = warp::service(routes::routes(state));
    let mut http = Http::new();
    http.http1_only(true).http1_keep_alive(true);
    tokio::pin!(shutdown);
    let mut accept_failed = false;
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    if !accept_failed {
                        eprintln!("ds4-server: accept failed: {e} (retrying)");
                        accept_failed = true;
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        accept_failed = false;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // One non-blocking write: the reply fits any socket buffer, and a
            // refused client must not hold a task or a descriptor any longer.
            let _ = stream.try_write(OVER_CAP);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(Clock::new(limits.clone()));
        let io = Timed {
            io: stream,
            clock: clock.clone(),
        };
        let mut inner = svc.clone();
        let c = clock.clone();
        let per_request = service_fn(move |req: Request<Body>| {
            c.set(Phase::Busy);
            let fut = inner.call(req);
            let c = c.clone();
            async move {
                let resp = fut.await?;
                c.set(Phase::Sending);
                Ok::<_, std::convert::Infallible>(resp.map(|body| Tracked { body, clock: c }))
            }
        });
        let mut conn = http.serve_connection(io, per_request);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut draining = false;
            let done = loop {
                tokio::select! {
                    r = futures_util::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                        break r.is_ok();
                    }
                    // Dropping the connection closes the socket.
                    _ = clock.expired() => break false,
                    _ = stop.changed(), if !draining => {
                        draining = true;
                        Pin::new(&mut conn).graceful_shutdown();
                    }
                }
            };
            if done {
                linger(conn.into_parts().io).await;
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection task holds a permit until it ends.
    let _ = slots.acquire_many(cap as u32).await;
}

/// At most this long, and this many bytes, are read and dropped after the
/// last response before the socket is closed (below).
const LINGER_TIME: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Closes a connection whose last response went out, "lingering": the write
/// side is shut first, then what the client still sends is read and dropped
/// for a moment. Closing a socket with unread bytes (the rest of a body we
/// refused from its headers) makes the kernel send a reset, and a client
/// that is still writing would see that reset instead of our answer. The
/// bounds keep a refused body from being taken in for long.
async fn linger(mut io: Timed) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if io.shutdown().await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 16 << 10];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while left > 0 {
            match io.io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reading a request head.
    Head,
    /// The handler runs (it bounds its own body reads).
    Busy,
    /// The response body is being written.
    Sending,
    /// Between requests.
    Idle,
}

/// One connection's phase and deadline (see the module comment).
struct Clock {
    limits: ServerLimits,
    state: Mutex<(Phase, Option<Instant>)>,
    /// Wakes [`Clock::expired`] when a phase change moved the deadline.
    moved: Notify,
}

impl Clock {
    fn new(limits: ServerLimits) -> Clock {
        let first = Instant::now() + limits.header_read;
        Clock {
            limits,
            state: Mutex::new((Phase::Head, Some(first))),
            moved: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Option<Instant>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, phase: Phase) {
        let deadline = match phase {
            Phase::Head => Some(Instant::now() + self.limits.header_read),
            Phase::Busy => None,
            Phase::Sending | Phase::Idle => Some(Instant::now() + self.limits.keep_alive_idle),
        };
        *self.lock() = (phase, deadline);
        self.moved.notify_one();
    }

    /// Bytes arrived: the first byte after an idle spell starts a request head.
    fn on_read(&self) {
        let idle = self.lock().0 == Phase::Idle;
        if idle {
            self.set(Phase::Head);
        }
    }

    /// Bytes left: a response that makes progress is not idle. (The deadline
    /// only moves later here, so the waiting [`Clock::expired`] needs no wake.)
    fn on_write(&self) {
        let mut s = self.lock();
        if s.0 == Phase::Sending {
            s.1 = Some(Instant::now() + self.limits.keep_alive_idle);
        }
    }

    /// Resolves once the deadline of the current phase has passed.
    async fn expired(&self) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            // Registered before the state is read, so no change is missed.
            moved.as_mut().enable();
            let deadline = self.lock().1;
            match deadline {
                Some(d) if d <= Instant::now() => return,
                Some(d) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(d) => {}
                        _ = moved => {}
                    }
                }
                None => moved.await,
            }
        }
    }
}

/// The client socket, reporting reads and writes to the connection's clock.
struct Timed {
    io: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.on_read();
        }
        r
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that moves its connection to `Idle` once hyper is done
/// with it (hyper drops a body when it has written its last byte, or when
/// the connection ends). Size hints pass through, so fixed-length bodies
/// keep their `content-length`.
struct Tracked {
    body: Body,
    clock: Arc<Clock>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.clock.set(Phase::Idle);
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = warp::hyper::Error;

    fn poll_data(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_data(cx)
    }

    fn poll_trailers(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<HeaderMap>, Self::Error>> {
        Pin::new(&mut self.body).poll_trailers(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_cap_reply_is_well_formed() {
        let text = std::str::from_utf8(OVER_CAP).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connections"));
    }

    #[test]
    fn wide_bind_without_key_warns() {
        let wide = std::net::IpAddr::from([0, 0, 0, 0]);
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        assert!(exposure_warning(wide, false)
            .unwrap()
            .contains("without an API key"));
        assert!(exposure_warning(wide, true).is_none());
        assert!(exposure_warning(lo, false).is_none());
    }

    #[test]
    fn default_cap_leaves_descriptors_free() {
        let n = default_max_connections() as u64;
        assert!((1..=MAX_DEFAULT_CONNECTIONS).contains(&n));
    }
}
