//! What the binaries share and the library's flow does not need: argument
//! parsing and exit codes ([`cli`]), the flags the binaries share
//! ([`flags`]), the CPU thread count ([`threads`]), the `--demo` model
//! ([`demo`]), the `--info` report ([`report`]), the server's one-engine
//! lock ([`lock`]) and process edge ([`serve`]), the speculator the flags
//! ask for ([`spec`]), and ds4's own terminal
//! side: the printing generator ([`terminal`]), the REPL ([`repl`]) and the
//! `--dump-logprobs` writer ([`logprobs`]), the `--imatrix-*` collector
//! ([`imatrix`]), and the backend self-check of
//! `ds4-bench --check` ([`selfcheck`]). Nothing below `app` imports it.

pub mod cli;
pub mod demo;
pub mod flags;
pub mod imatrix;
pub mod lock;
pub mod logprobs;
pub mod repl;
pub mod report;
pub mod selfcheck;
pub mod serve;
pub mod spec;
pub mod terminal;
pub mod threads;
