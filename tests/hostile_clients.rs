//! Hostile and unlucky clients against the real `ds4-server` binary (issue
//! 25): each module replays one family of findings.

mod common;

#[path = "hostile_clients/worker.rs"]
mod worker;
