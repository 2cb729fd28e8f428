//! ds4 — a native inference engine for DeepSeek V4 Flash.
//!
//! The modules follow the data flow of the engine, and are declared below in
//! that order: each imports only modules declared above it.
//!
//! ```text
//! gguf file ─► quant     block formats: layouts, scalar decoders, dot products
//!           ─► gguf      mmap, bounded header parser, metadata, tensor views
//!           ─► graph     values, nodes and the buffer plan; graph::ops: the op
//!                        descriptors (geometry) and their CPU twins
//!           ─► model     config from metadata, weights bound by name, the
//!                        forward pass recorded once into a graph
//! text      ─► tokenizer byte-level BPE with the V4 split rules, stream decode
//!           ─► chat      the chat template shared by the CLI and the server
//! graph     ─► backend   one trait; cpu/ (reference + fast kernels), wgpu/, cuda/
//! logits    ─► sampler   temperature, top-k/top-p, min-p
//!           ─► constrain grammar masks (JSON schemas, llguidance) over the
//!                        tokenizer's token bytes, for the sampler
//!           ─► session   live KV state, prefix sync, snapshots, verify steps
//!           ─► speculate drafters and the adaptive draft length (issue 35)
//!           ─► generate  the decode loop: pick, stop, stream
//!           ─► kvcache   KV snapshots on disk
//!           ─► server    HTTP routes, wire formats, the worker
//! testmodel: tiny GGUF models for the tests and the demo
//! convert:   ds4-quantize: official checkpoints → ds4's GGUFs; compare, splice
//! app:       what the binaries share (flags, thread count, demo, reports)
//! ```
//!
//! The application API is the handful of types re-exported below; the
//! binaries (`src/bin/`) use these plus [`chat`], [`generate`] and the
//! helpers in [`app`]:
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

// One declaration per floor of the flow; `tools/imports.py` checks that no
// module imports one declared below it and draws docs/imports.dot.
pub mod quant;

pub mod gguf;

pub mod graph;

pub mod model;

pub mod tokenizer;

pub mod chat;

pub mod backend;

pub mod sampler;

pub mod constrain;

pub mod session;

pub mod speculate;

pub mod generate;

pub mod kvcache;

pub mod server;

pub mod testmodel;

pub mod convert;

pub mod app;

pub use backend::BackendKind;
pub use chat::ThinkMode;
pub use model::forward::Numerics;
pub use model::{ModelConfig, ModelError, ModelFile};
pub use sampler::{sample, SamplerConfig};
pub use session::{Session, SessionError, SessionOptions};
pub use tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
