//! A live sequence: the KV state on a backend, the tokens it holds and the
//! logits of its last token. `sync` reuses the longest matching prefix and
//! evaluates only the rest; snapshots save and restore the whole state in
//! ds4's session payload layout (KVCACHE.md §4.3).

mod batch;
mod draft;
mod dspark;
mod mtp;
mod net;
mod observe;
mod snapshot;
mod speculate;
mod v4;
mod v41;

use std::sync::Arc;

use thiserror::Error;

use crate::backend::{self, Backend, BackendError, BackendKind, BackendOptions, GraphHandle};
use crate::graph::{Graph, StepParams, ValueId, ValueName};
use crate::model::any_model::AnyModel;
use crate::model::family::Arch;
use crate::model::forward::Numerics;
use crate::model::logits::Logits;
use crate::model::v41::engram_reader::EngramStats;
use crate::model::ModelFile;
use draft::TargetStep;

pub use batch::{Batch, SlotWork};
pub use draft::DraftModel;
pub use observe::{ObservedStep, Observer, StepObserver};
pub use snapshot::{SNAPSHOT_MAGIC, V41_SNAPSHOT_MAGIC};
pub use speculate::{Verified, MAX_VERIFY_ROWS};
pub use v41::DEFAULT_ENGRAM_CACHE_ROWS;

/// ds4's prefill chunk (tokens per batched step).
pub const DEFAULT_PREFILL_CHUNK: usize = 2048;

#[derive(Debug, Error)]
pub enum SessionError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the prompt has {tokens} tokens but the context is {ctx} (use a larger --ctx)")]
    ContextFull { tokens: usize, ctx: usize },
    #[error("empty prompt: there is nothing to evaluate")]
    Empty,
    #[error("token id {id} is outside the vocabulary ({vocab} tokens)")]
    BadToken { id: u32, vocab: usize },
    #[error("no value named {0} in the graph (see docs/ARCHITECTURE.md for names)")]
    UnknownValue(String),
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// A batch step or slot the batch cannot take (unknown or repeated slot).
    #[error("batch: {0}")]
    Batch(String),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// Reading the Engram rows of a V4.1 model failed.
    #[error("engram rows: {0}")]
    Engram(String),
    /// A speculative verify step this session cannot take (issue 35).
    #[error("speculative decoding: {0}")]
    Speculation(String),
    /// The step observer ([`SessionOptions::observer`]) failed.
    #[error("{0}")]
    Observer(String),
}

#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub numerics: Numerics,
    pub backend: BackendKind,
    /// How the backend opens (adapter, kernel path, caps); the binaries
    /// take it from [`BackendOptions::from_env`], tests set fields.
    pub backend_options: BackendOptions,
    /// Values readable with [`Session::dump`] after each step.
    pub dump: Vec<ValueName>,
    /// V4.1: hot Engram rows the session's reader keeps
    /// ([`DEFAULT_ENGRAM_CACHE_ROWS`]); ignored for V4.
    pub engram_cache_rows: usize,
    /// The draft model the session runs beside the target (`--mtp`,
    /// `--dspark`; V4 with the drafter's file attached): the session keeps
    /// its rings and what it drafts from ([`Session::model_draft`]).
    pub drafter: DraftModel,
    /// Sees the kept values of every target step (imatrix collection);
    /// the graphs keep what it names ([`StepObserver::targets`]).
    pub observer: Option<Observer>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ctx: 32768,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            numerics: Numerics::Model,
            backend: BackendKind::CpuRef,
            backend_options: BackendOptions::default(),
            dump: Vec::new(),
            engram_cache_rows: DEFAULT_ENGRAM_CACHE_ROWS,
            drafter: DraftModel::None,
            observer: None,
        }
    }
}

/// The model family's net for `model`, as `opts` asks (context, numerics,
/// the Engram cache): the one place a session names the families.
fn open_net(model: &AnyModel, opts: &SessionOptions) -> Result<Box<dyn net::Net>, SessionError> {
    Ok(match model {
        AnyModel::V4(m) => Box::new(v4::V4Net::open(
            m.clone(),
            opts.ctx,
            opts.numerics,
            opts.drafter,
        )?),
        AnyModel::V41(m) => Box::new(v41::V41Net::open(
            m.clone(),
            opts.ctx,
            opts.engram_cache_rows,
            opts.numerics,
            opts.drafter,
        )?),
    })
}

/// What every target graph keeps readable: the `--dump` values and what
/// the draft model drafts from.
fn keep_values(dump: &[ValueName], drafter: Option<&draft::Drafter>) -> Vec<ValueName> {
    let mut keep = dump.to_vec();
    keep.extend(drafter.map(|m| m.targets()).unwrap_or_default());
    keep
}

/// What a `sync` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncStats {
    pub reused: usize,
    pub evaluated: usize,
}

pub struct Session {
    model: AnyModel,
    /// The model family's graphs, state layout, host feed and payload.
    net: Box<dyn net::Net>,
    backend: Box<dyn Backend>,
    opts: SessionOptions,
    decode: GraphHandle,
    prefill: GraphHandle,
    /// Graph with logits at every position, built on first use.
    scoring: Option<GraphHandle>,
    /// The speculative verify graph and its undo plan, built on first use.
    verifier: Option<speculate::Verifier>,
    /// The draft model, when the session runs one (`opts.drafter`); boxed,
    /// as most sessions run none.
    drafter: Option<Box<draft::Drafter>>,
    last: GraphHandle,
    /// The recorded graphs with the handles the backend gave them.
    graphs: Vec<(GraphHandle, Arc<Graph>)>,
    /// What `backend::open` picked, in one line.
    backend_notice: String,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

impl Session {
    pub fn new(model: Arc<ModelFile>, opts: SessionOptions) -> Result<Session, SessionError> {
        Self::open_any(&AnyModel::V4(model), opts)
    }

    /// A session over a model of either family.
    pub fn open_any(model: &AnyModel, opts: SessionOptions) -> Result<Session, SessionError> {
        match Self::with_backend(model, opts.clone()) {
            // `auto` falls back to the CPU when the GPU it picked cannot load
            // the graphs (a limit, a missing feature), saying so in one line.
            Err(SessionError::Backend(e)) if opts.backend == BackendKind::Auto => {
                let cpu = SessionOptions {
                    backend: BackendKind::Cpu,
                    ..opts
                };
                let mut s = Self::with_backend(model, cpu)?;
                s.backend_notice =
                    format!("backend: cpu (auto; the GPU could not load the model: {e})");
                Ok(s)
            }
            r => r,
        }
    }

    fn with_backend(model: &AnyModel, opts: SessionOptions) -> Result<Session, SessionError> {
        let net = open_net(model, &opts)?;
        let opened = backend::open(
            opts.backend,
            model.weight_file(),
            net.state_layout().clone(),
            &opts.backend_options,
        )?;
        let mut backend = opened.backend;
        let drafter = net.open_drafter(backend.as_mut())?.map(Box::new);
        let keep = keep_values(&opts.dump, drafter.as_deref());
        let chunk = opts.prefill_chunk.clamp(1, opts.ctx.max(1));
        let mut graphs = Vec::new();
        let mut load =
            |backend: &mut Box<dyn Backend>, g: Graph| -> Result<GraphHandle, SessionError> {
                let g = Arc::new(g);
                let h = backend.load_graph(g.clone())?;
                graphs.push((h, g));
                Ok(h)
            };
        let obs = opts.observer.as_ref();
        let decode_graph = observe::record(net.as_ref(), obs, 1, Logits::Last, &keep);
        // A misspelt --dump name fails here, before any prefill work.
        if let Some(d) = opts.dump.iter().find(|d| decode_graph.find(d).is_none()) {
            return Err(SessionError::UnknownValue(d.to_string()));
        }
        let decode = load(&mut backend, decode_graph)?;
        let prefill = if chunk > 1 {
            let g = observe::record(net.as_ref(), obs, chunk, Logits::Last, &keep);
            load(&mut backend, g)?
        } else {
            decode
        };
        Ok(Session {
            model: model.clone(),
            net,
            backend,
            opts: SessionOptions {
                prefill_chunk: chunk,
                ..opts
            },
            decode,
            prefill,
            scoring: None,
            verifier: None,
            drafter,
            last: decode,
            graphs,
            backend_notice: opened.notice,
            tokens: Vec::new(),
            logits: Vec::new(),
        })
    }

    /// The model this session runs.
    pub fn model(&self) -> &AnyModel {
        &self.model
    }

    /// Which model family this session runs.
    pub fn arch(&self) -> Arch {
        self.model.arch()
    }

    pub fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }

    /// Routed-expert quant bits for KVC headers (4 iff layer 0's routed
    /// gate experts are Q4_K, else 2; KVCACHE.md §4.1).
    pub fn routed_quant_bits(&self) -> u8 {
        self.model.routed_quant_bits()
    }

    /// What the Engram reader did (V4.1 sessions only).
    pub fn engram_stats(&self) -> Option<EngramStats> {
        self.net.engram_stats()
    }

    /// The name of the backend this session runs on (`cpu`, `wgpu`,
    /// `cuda`; `auto` resolved).
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// One line saying which backend and device run this session.
    pub fn backend_notice(&self) -> &str {
        &self.backend_notice
    }

    /// The routed-expert cache when experts are streamed (`--ssd-streaming`).
    pub fn expert_cache(&self) -> Option<std::sync::Arc<crate::backend::experts::ExpertCache>> {
        self.backend.expert_cache()
    }

    pub fn ctx(&self) -> usize {
        self.opts.ctx
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits after the last evaluated token (empty before any).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Bytes of KV state this session holds on its backend.
    pub fn state_bytes(&self) -> usize {
        self.net.state_layout().bytes()
    }

    /// Every state buffer of the session, whole, in layout order (tests
    /// compare complete states, stale rows included).
    pub fn read_states(&self) -> Result<Vec<Vec<f32>>, SessionError> {
        let n = self.net.state_layout().states.len();
        (0..n)
            .map(|i| Ok(self.backend.read_state(crate::graph::StateId(i as u32))?))
            .collect()
    }

    pub fn reset(&mut self) {
        self.net.reset();
        if let Some(m) = self.drafter.as_mut() {
            m.clear();
        }
        self.backend.reset_states();
        self.tokens.clear();
        self.logits.clear();
    }

    fn check(&self, tokens: &[u32]) -> Result<(), SessionError> {
        let vocab = self.n_vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(SessionError::BadToken { id, vocab });
        }
        if tokens.len() > self.opts.ctx {
            return Err(SessionError::ContextFull {
                tokens: tokens.len(),
                ctx: self.opts.ctx,
            });
        }
        Ok(())
    }

    /// Brings the session to exactly `tokens`: keeps the longest prefix it
    /// already holds if the state can continue from it, else starts over.
    /// `progress(done, total)` is called after each prefill chunk.
    pub fn sync(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<SyncStats, SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Empty);
        }
        self.check(tokens)?;
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // Compressor frontiers cannot be rewound, so only a session whose
        // whole content is a prefix of the request continues.
        let reuse = if common == self.tokens.len() && common < tokens.len() {
            common
        } else {
            0
        };
        if common == tokens.len() && common == self.tokens.len() {
            return Ok(SyncStats {
                reused: common,
                evaluated: 0,
            });
        }
        if reuse == 0 {
            self.reset();
        }
        let todo = &tokens[reuse..];
        self.eval_tokens(todo, progress)?;
        Ok(SyncStats {
            reused: reuse,
            evaluated: todo.len(),
        })
    }

    /// Appends one token and computes the logits after it.
    pub fn eval(&mut self, token: u32) -> Result<(), SessionError> {
        self.check(&[token])?;
        if self.tokens.len() + 1 > self.opts.ctx {
            return Err(SessionError::ContextFull {
                tokens: self.tokens.len() + 1,
                ctx: self.opts.ctx,
            });
        }
        self.run(self.decode, &[token]).map(drop)
    }

    /// Appends `tokens` (prefill chunks, or one decode step) and computes
    /// the logits after the last of them.
    pub(crate) fn sync_more(&mut self, tokens: &[u32]) -> Result<(), SessionError> {
        self.check(tokens)?;
        self.eval_tokens(tokens, &mut |_, _| {})
    }

    fn eval_tokens(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(), SessionError> {
        if self.tokens.len() + tokens.len() > self.opts.ctx {
            return Err(SessionError::ContextFull {
                tokens: self.tokens.len() + tokens.len(),
                ctx: self.opts.ctx,
            });
        }
        let chunk = self.opts.prefill_chunk;
        let total = tokens.len();
        let mut done = 0;
        for c in tokens.chunks(chunk) {
            let g = if c.len() == 1 {
                self.decode
            } else {
                self.prefill
            };
            self.run(g, c)?;
            done += c.len();
            progress(done, total);
        }
        Ok(())
    }

    /// One step of `g` over `tokens`; keeps the last row of logits and
    /// returns every row the graph produced (one per token for scoring).
    fn run(&mut self, g: GraphHandle, tokens: &[u32]) -> Result<Vec<f32>, SessionError> {
        let params = StepParams {
            pos0: self.tokens.len(),
            n_tokens: tokens.len(),
        };
        // The ids are known: what the host feeds (V4.1's Engram rows) is
        // written now, before the step runs.
        let graph = self.graph(g).clone();
        if let Err(e) = self.net.feed(self.backend.as_mut(), g, &graph, tokens) {
            self.reset();
            return Err(e);
        }
        if let Err(e) = self.backend.run(g, tokens, params) {
            // A failed step leaves the state undefined: start over next time.
            self.reset();
            return Err(e.into());
        }
        // The draft model and the observer read the step's kept values.
        let step = TargetStep {
            backend: self.backend.as_ref(),
            g,
            graph: &graph,
            pos0: params.pos0,
            n: tokens.len(),
        };
        let seen = (self.drafter.as_mut().map_or(Ok(()), |m| m.record(&step))).and_then(|()| {
            self.opts
                .observer
                .as_ref()
                .map_or(Ok(()), |o| o.observe(&step))
        });
        if let Err(e) = seen {
            self.reset();
            return Err(e);
        }
        self.tokens.extend_from_slice(tokens);
        self.last = g;
        let graph_logits = self.logits_value(g);
        let all = self.backend.read_value(g, graph_logits)?;
        let v = self.n_vocab();
        self.logits = all[all.len() - v..].to_vec();
        Ok(all)
    }

    fn graph(&self, g: GraphHandle) -> &Arc<Graph> {
        // Handles come only from this session's own `load_graph` calls.
        &self
            .graphs
            .iter()
            .find(|(h, _)| *h == g)
            .expect("graph handle of this session")
            .1
    }

    fn logits_value(&self, g: GraphHandle) -> ValueId {
        self.graph(g).logits
    }

    /// Evaluates `tokens` from an empty state and returns the logits at every
    /// position (`tokens.len() × vocab`), for validation and perplexity.
    pub fn score(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Empty);
        }
        self.check(tokens)?;
        self.reset();
        self.score_more(tokens)
    }

    /// Evaluates `tokens` after the ones this session holds and returns the
    /// logits at each of them (`tokens.len() × vocab`): [`Session::score`]
    /// in pieces, so that a long prompt can be scored a part at a time.
    pub fn score_more(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Empty);
        }
        self.check(tokens)?;
        if self.tokens.len() + tokens.len() > self.opts.ctx {
            return Err(SessionError::ContextFull {
                tokens: self.tokens.len() + tokens.len(),
                ctx: self.opts.ctx,
            });
        }
        let g = match self.scoring {
            Some(g) => g,
            None => {
                let graph = observe::record(
                    self.net.as_ref(),
                    self.opts.observer.as_ref(),
                    self.opts.prefill_chunk,
                    Logits::All,
                    &self.keep_values(),
                );
                let graph = Arc::new(graph);
                let h = self.backend.load_graph(graph.clone())?;
                self.graphs.push((h, graph));
                self.scoring = Some(h);
                h
            }
        };
        let mut out = Vec::with_capacity(tokens.len() * self.n_vocab());
        for c in tokens.chunks(self.opts.prefill_chunk) {
            out.extend(self.run(g, c)?);
        }
        Ok(out)
    }

    /// What every target graph keeps readable ([`keep_values`]).
    fn keep_values(&self) -> Vec<ValueName> {
        keep_values(&self.opts.dump, self.drafter.as_deref())
    }

    /// Reads back a named value (`NAME@LAYER`) of the last step, all live rows.
    pub fn dump(&self, name: &ValueName) -> Result<Vec<f32>, SessionError> {
        let id = self
            .graph(self.last)
            .find(name)
            .ok_or_else(|| SessionError::UnknownValue(name.to_string()))?;
        Ok(self.backend.read_value(self.last, id)?)
    }
}
