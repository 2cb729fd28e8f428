//! `ds4-server`: OpenAI chat/completions/Responses and Anthropic messages
//! over warp + tokio (SERVER.md). Data flow of a request:
//!
//! ```text
//! TCP (listen: connection cap, header and idle deadlines)
//!   ─► HTTP (routes: Host/Origin/auth checks, body cap, routing) ─► request (wire JSON → GenRequest)
//!   ─► worker queue (bounded, FIFO) ─► worker thread (render, reuse, prefill, generate)
//!   ─► events over a channel ─► openai / anthropic / responses (JSON body or SSE)
//! ```

pub mod anthropic;
pub mod dsml;
pub mod error;
pub mod guard;
pub mod kvdisk;
pub mod listen;
pub mod metrics;
pub mod openai;
pub mod render;
pub mod request;
pub mod responses;
pub mod routes;
pub mod worker;

use worker::Final;

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
    fn done(&mut self, f: &Final) -> Vec<String>;
    /// An error after the stream started.
    fn error(&mut self, msg: &str) -> Vec<String>;
}
