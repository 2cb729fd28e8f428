//! Hostile clients (issue 25): every case found by trying the server as an
//! adversary, replayed. One module per area.

mod common;

#[path = "hostile_clients/files.rs"]
mod files;
