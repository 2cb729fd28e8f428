//! `ds4-server`: OpenAI chat/completions/Responses and Anthropic messages
//! over warp + tokio (SERVER.md). Data flow of a request:
//!
//! ```text
//! TCP (listen: connection cap, header and idle deadlines)
//!   ─► HTTP (routes: Host/Origin/auth checks, body cap, routing) ─► request (wire JSON → GenRequest)
//!   ─► worker queue (bounded, FIFO) ─► worker thread (render, reuse, prefill, generate)
//!   ─► events over a channel ─► openai / anthropic / responses (JSON body or SSE)
//! ```
//!
//! The worker's pieces: `core` (what the engine thread keeps and a job's
//! phases, shared by the serial `worker` and the slot scheduler `slots`),
//! `finish` (the finish phase), `job` (the job / event contract and the
//! disk-cache hook), `health` (liveness and caught panics for `/health`),
//! `plan` (the live-reuse decision), `memory` (tool memory, bindings, ids),
//! `stream` (the token observer) with `scan` (its incremental DSML
//! detection), `trace` (`--trace`).

pub mod anthropic;
mod core;
pub mod dsml;
pub mod error;
mod finish;
pub mod guard;
pub mod health;
pub mod job;
pub mod kvdisk;
pub mod listen;
pub mod logprobs;
mod memory;
pub mod metrics;
pub mod openai;
pub mod page;
pub mod plan;
pub mod render;
pub mod render_v41;
pub mod replay;
pub mod request;
pub mod responses;
pub mod routes;
mod scan;
pub mod scoring;
pub mod slotdisk;
pub mod slots;
mod stream;
pub mod strict;
pub mod tokenize;
mod trace;
pub mod worker;

use job::Final;

/// One API's SSE projection of a job's events.
pub trait StreamFormat: Send {
    /// After the prompt was accepted (before prefill).
    fn start(&mut self, prompt: usize, cached: usize) -> Vec<String>;
    fn reasoning(&mut self, r: &str) -> Vec<String>;
    fn text(&mut self, t: &str) -> Vec<String>;
    /// A live tool call: header, argument fragment, end (chat, Anthropic).
    fn tool_start(&mut self, _index: usize, _id: &str, _name: &str) -> Vec<String> {
        Vec::new()
    }
    fn tool_args(&mut self, _index: usize, _args: &str) -> Vec<String> {
        Vec::new()
    }
    fn tool_end(&mut self, _index: usize) -> Vec<String> {
        Vec::new()
    }
    /// Scored tokens: kept by the formats that show them, attached to the
    /// next text chunk (or the last chunk).
    fn logprobs(&mut self, _entries: Vec<logprobs::TokenLogprob>) -> Vec<String> {
        Vec::new()
    }
    fn done(&mut self, f: &Final) -> Vec<String>;
    /// An error after the stream started.
    fn error(&mut self, msg: &str) -> Vec<String>;
}
