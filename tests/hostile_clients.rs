//! Hostile clients (issue 25): every case found by trying the server as an
//! adversary and as an unlucky agent, replayed. One module per area:
//! `files` the cache folder, temp and lock files; `prompt` what a client can
//! put into the prompt (chat markers in its text, deeply nested DSML).

mod common;

#[path = "hostile_clients/files.rs"]
mod files;
#[path = "hostile_clients/prompt.rs"]
mod prompt;
