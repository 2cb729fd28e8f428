//! ds4 — a native inference engine for DeepSeek V4 Flash.
//!
//! The crate follows the data flow of the engine:
//!
//! ```text
//! gguf file ─► gguf (mmap, header, tensor views) ─► quant (block formats)
//!           ─► model (config from metadata, weights bound by name)
//!           ─► tokenizer (byte-level BPE, chat markers)
//! ```
//!
//! The binaries (`ds4`, `ds4-server`, `ds4-bench`) and the tools only use the
//! public API re-exported here.

pub mod backend;
pub mod bandwidth;
pub mod chat;
pub mod gguf;
pub mod graph;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sampler;
pub mod session;
pub mod testmodel;
pub mod tokenizer;
