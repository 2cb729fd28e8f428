//! ds4 — a native inference engine for DeepSeek V4 Flash.
//!
//! The modules follow the data flow of the engine:
//!
//! ```text
//! gguf file ─► gguf (mmap, bounded header parser, tensor views) ─► quant (block formats)
//!           ─► model (config from metadata, weights bound by name, forward pass recorded once)
//!           ─► graph (ops over named values) ─► ops (descriptors + CPU twins)
//!           ─► backend (cpu; wgpu and cuda to come) ─► sampler
//!           ─► session (KV state, prefix sync, snapshots) ─► chat / binaries
//! tokenizer: byte-level BPE with the V4 split rules, chat markers, streaming decode
//! ```
//!
//! The application API is the handful of types re-exported below; the
//! binaries use only these plus the CLI helpers in [`chat`]:
//!
//! ```text
//! let model = Arc::new(ModelFile::open("ds4flash.gguf")?);      // validated, nothing read
//! let tok = Tokenizer::from_gguf(&model.file)?;
//! let mut s = Session::new(model, SessionOptions::default())?;
//! s.sync(&chat::one_shot_prompt(&tok, "", "Hi", ThinkMode::None), &mut |_, _| {})?;
//! let next = sample(s.logits(), &SamplerConfig::default(), &mut rng);
//! ```
//!
//! The lower modules are public for the tools, tests and benchmarks.

pub mod backend;
pub mod bandwidth;
pub mod chat;
pub mod cli;
pub mod demo;
pub mod generate;
pub mod gguf;
pub mod graph;
pub mod kvcache;
pub mod logprobs;
pub mod model;
/// The op descriptors live under the graph that holds them.
pub use graph::ops;
pub mod quant;
pub mod report;
pub mod sampler;
pub mod server;
pub mod session;
pub mod testmodel;
pub mod threads;
pub mod tokenizer;

pub use chat::ThinkMode;
pub use model::forward::Numerics;
pub use model::{ModelConfig, ModelError, ModelFile};
pub use sampler::{sample, SamplerConfig};
pub use session::{BackendKind, Session, SessionError, SessionOptions};
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
