//! `ds4-server` against hostile and unlucky clients (issue 25): every case
//! found when the server was tried as an adversary, replayed — on the real
//! binary over loopback sockets where the case is about the wire. One module
//! per area: `http` limits and browser checks; `worker` the live-reuse crash,
//! panics, closed pipes; `files` the cache folder, temp and lock files;
//! `prompt` what a client can put into the prompt (chat markers in its text,
//! deeply nested DSML).

mod common;

#[path = "hostile_clients/files.rs"]
mod files;
#[path = "hostile_clients/http.rs"]
mod http;
#[path = "hostile_clients/prompt.rs"]
mod prompt;
#[path = "hostile_clients/worker.rs"]
mod worker;
