//! `ds4-server` against hostile and unlucky clients (issue 25): every case
//! found when the server was tried as an adversary, replayed on the real
//! binary over loopback sockets. One module per area.

mod common;

#[path = "hostile_clients/http.rs"]
mod http;
