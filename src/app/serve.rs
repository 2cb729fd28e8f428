//! `ds4-server`'s process edge: a small tokio runtime, SIGINT and SIGTERM
//! (the first drains the queue, a second exits at once), the banner with
//! ready-to-paste client settings, then [`crate::server::listen::serve`].

use std::net::SocketAddr;
use std::sync::Arc;

use crate::server::listen::{self, ServerLimits};
use crate::server::routes::State;

/// Listens on `addr` and serves until SIGINT or SIGTERM (a second one
/// exits at once), on a small tokio runtime. `key_source` names where the
/// API key came from, `None` when there is none.
pub fn serve(
    addr: SocketAddr,
    state: Arc<State>,
    limits: ServerLimits,
    key_source: Option<&str>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let keyed = key_source.is_some();
    rt.block_on(async move {
        // Handlers are installed here, before the banner, so a signal that
        // arrives right after start-up still shuts down cleanly.
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("signal: {e}"))?;
        let mut term = signal(SignalKind::terminate()).map_err(|e| format!("signal: {e}"))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let bound = listener
            .local_addr()
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        if let Some(source) = key_source {
            eprintln!("ds4-server: API key required (from {source})");
        }
        if let Some(w) = listen::exposure_warning(addr.ip(), keyed) {
            eprintln!("ds4-server: {w}");
        }
        let shutdown = async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            // A second signal does not wait for the drain.
            tokio::spawn(async move {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                std::process::exit(130);
            });
        };
        print_banner(bound, keyed);
        listen::serve(listener, state, limits, shutdown).await;
        Ok::<(), String>(())
    })
}

/// The URL and ready-to-paste client settings (docs/CLIENTS.md).
fn print_banner(addr: SocketAddr, keyed: bool) {
    let url = format!("http://{addr}");
    let key = if keyed { "<your API key>" } else { "ds4" };
    // Nobody may be reading stdout: a failed write is dropped.
    super::cli::stdout_line(format_args!("ds4-server: listening on {url}"));
    super::cli::stdout_line(format_args!("  Claude Code: ANTHROPIC_BASE_URL={url} ANTHROPIC_AUTH_TOKEN={key} ANTHROPIC_MODEL=deepseek-v4-flash claude"));
    super::cli::stdout_line(format_args!(
        "  Codex CLI:   OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={key} codex -m deepseek-v4-flash"
    ));
    super::cli::stdout_line(format_args!(
        "  opencode:    provider baseURL {url}/v1, model deepseek-v4-flash (docs/CLIENTS.md)"
    ));
}
