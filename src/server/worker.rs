//! The one engine thread: it owns the session (one live KV slot), the tool
//! memory and every reuse decision, takes jobs strictly in arrival order from
//! a bounded queue and sends each job's output back over the job's channel.
//! HTTP handlers never touch the engine, so engine work never blocks tokio.
//!
//! A job runs in four phases, `admit → prefill → decode → finish`, under
//! `catch_unwind`: a panic fails that job alone and resets the session.
//! The pieces live beside it: the job contract in `job.rs`, the reuse
//! decision in `plan.rs`, the tool memory and bindings in `memory.rs`, the
//! token observer in `stream.rs`, `--trace` in `trace.rs`, liveness and
//! caught panics in `health.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::dsml::{self, Parsed};
use super::error::ApiError;
use super::health::{panic_message, AliveGuard, WorkerHealth};
use super::job::{Event, Final, FinishReason, Job, KvCacheHook, OutCall, Usage, VisibleKind, Work};
use super::logprobs::TokenLogprob;
use super::memory::{
    id_rng, random_hex, same_set, trailing_tool_run, ProtocolBinding, ToolMemory, VisibleBinding,
};
use super::metrics::Metrics;
use super::plan;
use super::render;
use super::request::{Api, GenRequest, Role};
use super::scoring::{self, JobLogprobs};
use super::stream::{Stream, WithCache};
use super::trace::{self, Trace};
use crate::chat::template::EOS;
use crate::constrain::GrammarEngine;
use crate::generate::{self, Constrained, Finish, Sampled, Scripted, TokenPicker};
use crate::kvcache::{NoToolIds, ToolIds};
use crate::sampler::Rng;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// Settings of the worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Test mode: outputs for requests that carry no script, used in order
    /// (to drive real agents through a known conversation).
    pub queued_scripts: Vec<String>,
    pub default_tokens: usize,
    /// `--trace FILE`: a human-readable record of every request (SERVER.md §11).
    pub trace: Option<std::path::PathBuf>,
    pub exact_replay: bool,
    pub tool_memory_max_ids: usize,
    /// Test hook (`--debug-panic-on-prompt`): a job whose rendered prompt
    /// contains this text panics after it was accepted, so tests can show
    /// that a panicking job fails alone.
    pub debug_panic_on_prompt: Option<String>,
}

/// The queue side handed to the HTTP layer.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Work>,
    metrics: Arc<Metrics>,
    health: Arc<WorkerHealth>,
    /// Jobs that may wait for the engine (`--queue`). The depth counts a
    /// job from its submission until it starts (the serial worker takes
    /// it, or it takes a KV slot), so the bound holds also while the slot
    /// scheduler holds admitted jobs of its own.
    bound: usize,
}

impl Queue {
    /// Enqueues a job; a full queue is `503` with `Retry-After`.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let before = self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        let sent = if before >= self.bound {
            Err(TrySendError::Full(Work::Gen(Box::new(job))))
        } else {
            self.tx.try_send(Work::Gen(Box::new(job)))
        };
        match sent {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
                let mut err = match e {
                    TrySendError::Full(_) => {
                        ApiError::new(503, "server busy: request queue is full")
                    }
                    TrySendError::Disconnected(_) => ApiError::new(503, "server shutting down"),
                };
                err.retry_after = Some(1);
                Err(err)
            }
        }
    }

    /// The worker's liveness and panic record.
    pub fn health(&self) -> &WorkerHealth {
        &self.health
    }

    /// Lets the queued jobs finish, gives the cache its shutdown call and
    /// stops the worker (blocking).
    pub fn shutdown(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Work::Shutdown(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

/// Starts the worker thread; `bound` is the queue length.
pub fn start(
    sess: Session,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    metrics: Arc<Metrics>,
    bound: usize,
    cache: Box<dyn KvCacheHook>,
) -> Queue {
    metrics.slots.store(1, Ordering::Relaxed);
    spawn(metrics, bound, move |rx, core_parts| {
        let core = core_parts.into_core(tok, cfg, cache);
        Worker {
            sess,
            core,
            live: Bindings::default(),
        }
        .run(rx)
    })
}

/// What the engine thread gets from [`spawn`] besides its queue.
pub(super) struct CoreParts {
    metrics: Arc<Metrics>,
    health: Arc<WorkerHealth>,
}

impl CoreParts {
    pub(super) fn into_core(
        self,
        tok: Arc<Tokenizer>,
        cfg: WorkerConfig,
        cache: Box<dyn KvCacheHook>,
    ) -> Core {
        let trace = Trace::open(cfg.trace.as_deref());
        Core::new(tok, cfg, self.metrics, cache, trace, self.health)
    }
}

/// Starts the engine thread `body` on a queue of `bound` jobs (the serial
/// worker here, the slot scheduler in `slots.rs`); `/health` sees the
/// thread alive until `body` returns or unwinds.
pub(super) fn spawn(
    metrics: Arc<Metrics>,
    bound: usize,
    body: impl FnOnce(Receiver<Work>, CoreParts) + Send + 'static,
) -> Queue {
    let bound = bound.max(1);
    let (tx, rx) = std::sync::mpsc::sync_channel(bound);
    let health = Arc::new(WorkerHealth::default());
    health.alive.store(true, Ordering::SeqCst);
    let guard = AliveGuard(health.clone());
    let parts = CoreParts {
        metrics: metrics.clone(),
        health: health.clone(),
    };
    std::thread::Builder::new()
        .name("ds4-worker".into())
        .spawn(move || {
            let _guard = guard;
            body(rx, parts)
        })
        .expect("spawning the worker thread");
    Queue {
        tx,
        metrics,
        health,
        bound,
    }
}

/// The tool ids the disk cache stores beside a prefix: the remembered ids
/// under exact replay, none otherwise. Over the two fields, not [`Core`], so
/// the cache (another field) can stay borrowed mutably beside it.
pub(super) fn tool_ids<'a>(cfg: &WorkerConfig, memory: &'a ToolMemory) -> &'a dyn ToolIds {
    if cfg.exact_replay {
        memory
    } else {
        &NoToolIds
    }
}

/// Everything the engine thread keeps besides the KV state: shared by the
/// serial worker (one `Session`) and the slot scheduler (`slots.rs`, one
/// `Batch` of N slots).
pub(super) struct Core {
    pub(super) tok: Arc<Tokenizer>,
    pub(super) cfg: WorkerConfig,
    pub(super) metrics: Arc<Metrics>,
    pub(super) memory: ToolMemory,
    pub(super) cache: Box<dyn KvCacheHook>,
    pub(super) trace: Trace,
    /// Ids and unseeded sampling of the current request (`id_rng`).
    pub(super) ids: Rng,
    pub(super) request_seq: u64,
    pub(super) health: Arc<WorkerHealth>,
    /// llguidance's tables for our vocabulary, built by the first request
    /// with a response format or strict tools (structured output).
    pub(super) grammar: Option<Arc<GrammarEngine>>,
}

/// What one KV slot remembers about the turn it holds (SERVER.md §9): the
/// thinking-visible and protocol bindings, valid at their `live_len`.
#[derive(Default)]
pub(super) struct Bindings {
    pub(super) thinking_visible: Option<VisibleBinding>,
    pub(super) protocol: Option<ProtocolBinding>,
}

struct Worker {
    sess: Session,
    core: Core,
    live: Bindings,
}

/// A request past admission: its rendered prompt and its own tokens.
pub(super) struct Admitted {
    pub(super) req: GenRequest,
    pub(super) events: UnboundedSender<Event>,
    pub(super) text: String,
    pub(super) full: Vec<u32>,
    pub(super) t0: Instant,
    /// Its request number and its id generator (`id_rng(seq)`).
    pub(super) seq: u64,
    pub(super) ids: Rng,
}

impl Admitted {
    /// Once the prompt (`prompt` effective tokens, `cached` of them reused)
    /// is in the KV slot.
    pub(super) fn prefilled(self, prompt: usize, cached: usize, lp: JobLogprobs) -> Prefilled {
        Prefilled {
            lp,
            t_prefill: self.t0.elapsed(),
            req: self.req,
            events: self.events,
            text: self.text,
            prompt,
            cached,
            t0: self.t0,
            seq: self.seq,
            ids: self.ids,
        }
    }
}

/// A request whose prompt is in the KV slot.
pub(super) struct Prefilled {
    pub(super) req: GenRequest,
    pub(super) events: UnboundedSender<Event>,
    pub(super) text: String,
    /// Effective prompt tokens.
    pub(super) prompt: usize,
    pub(super) cached: usize,
    pub(super) t0: Instant,
    pub(super) t_prefill: Duration,
    pub(super) seq: u64,
    pub(super) ids: Rng,
    /// Echo and log-probabilities (`scoring.rs`).
    pub(super) lp: JobLogprobs,
}

/// What generation produced.
pub(super) struct Decoded {
    tokens: usize,
    finish: Finish,
    thinking: bool,
    pub(super) stop_hit: bool,
    raw: String,
    saw_close: bool,
    live_ids: Vec<String>,
    live_closed: Vec<bool>,
    /// The grammar (response format, strict tools) was still open at the
    /// end: the output is not a complete match, so the finish is `length`.
    grammar_open: bool,
    /// The generated tokens scored, when log-probabilities were asked for.
    logprobs: Vec<TokenLogprob>,
}

/// Whether a Responses / Anthropic request ends with results of calls it
/// does not replay: only the live session knows them (SERVER.md §9).
fn needs_live_tool_state(req: &GenRequest) -> bool {
    let Some((_, ids)) = trailing_tool_run(req).filter(|_| req.api != Api::Chat) else {
        return false;
    };
    let replayed: Vec<&str> = req
        .messages
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
        .collect();
    ids.iter().any(|i| !replayed.contains(&i.as_str()))
}

impl Core {
    pub(super) fn new(
        tok: Arc<Tokenizer>,
        cfg: WorkerConfig,
        metrics: Arc<Metrics>,
        cache: Box<dyn KvCacheHook>,
        trace: Trace,
        health: Arc<WorkerHealth>,
    ) -> Core {
        Core {
            tok,
            cfg,
            metrics,
            memory: ToolMemory::default(),
            cache,
            trace,
            ids: id_rng(0),
            request_seq: 0,
            health,
            grammar: None,
        }
    }

    /// Live-reuse rules 1-6 (KVCACHE.md §2; the names are ds4's trace
    /// `cache_source` values) against one slot's live tokens and bindings:
    /// the effective prompt, the cached count and the rule, or `Err(full)`
    /// when nothing live is reusable.
    pub(super) fn plan_live(
        &mut self,
        req: &GenRequest,
        text: &str,
        full: Vec<u32>,
        live: &[u32],
        b: &Bindings,
    ) -> Result<(Vec<u32>, usize, &'static str), Vec<u32>> {
        if live.is_empty() {
            return Err(full);
        }
        if let Some(pb) = b
            .protocol
            .as_ref()
            .filter(|pb| pb.live_len == live.len() && pb.api == req.api)
        {
            // Rule 1: the Responses visible transcript is a strict prefix.
            let rest = pb.visible.as_ref().and_then(|v| {
                plan::strict_continuation(text, v.as_bytes()).and_then(|n| text.get(n..))
            });
            if let Some(rest) = rest {
                let mut eff = live.to_vec();
                eff.extend(self.tok.encode_chat(rest));
                return Ok((eff, live.len(), "responses-visible"));
            }
            // Rules 2 and 3: the request ends with the results of exactly
            // the calls the live session made: append only the tail.
            if let Some((first, ids)) = trailing_tool_run(req) {
                if same_set(&ids, &pb.ids) {
                    let tail = if self.cfg.exact_replay {
                        render::render_tail(&req.messages[first..], req, &mut self.memory)
                    } else {
                        render::render_tail(&req.messages[first..], req, &mut render::NoReplay)
                    };
                    let mut eff = live.to_vec();
                    eff.extend(self.tok.encode_chat(&tail));
                    let source = if req.api == Api::Messages {
                        "anthropic-tool-output"
                    } else {
                        "responses-tool-output"
                    };
                    return Ok((eff, live.len(), source));
                }
            }
        }
        let thinking_visible = b
            .thinking_visible
            .as_ref()
            .filter(|tb| req.chat_style() && tb.live_len == live.len())
            .map(|tb| tb.text.as_str());
        let view = plan::Live {
            tokens: live,
            thinking_visible,
        };
        let tok = self.tok.clone();
        match plan::plan_live(&view, text, &full, || tok.decode(live)) {
            plan::LivePlan::Tokens => {
                let n = live.len();
                Ok((full, n, "memory-token"))
            }
            // `from` is a character boundary (plan.rs); `get` keeps a
            // slicing mistake from ever taking the worker down.
            plan::LivePlan::Append { from, source } => match text.get(from..) {
                Some(rest) => {
                    let mut eff = live.to_vec();
                    eff.extend(self.tok.encode_chat(rest));
                    Ok((eff, live.len(), source))
                }
                None => Err(full),
            },
            plan::LivePlan::Cold => Err(full),
        }
    }

    /// Before rendering: the ids of the request's tool calls and results
    /// that the tool memory lacks are looked up in the disk checkpoints' KTM
    /// maps (KVCACHE.md §7), so that a restarted server renders those calls
    /// with their exact sampled bytes again.
    fn prefetch_tool_ids(&mut self, req: &GenRequest) {
        let missing = missing_tool_ids(req, &self.memory);
        if missing.is_empty() {
            return;
        }
        let found = self.cache.prefetch_tool_ids(&|id: &[u8]| {
            std::str::from_utf8(id).is_ok_and(|id| missing.contains(id))
        });
        if !found.is_empty() {
            self.memory.restore(found, self.cfg.tool_memory_max_ids);
        }
    }

    /// Admission: render, check the tool ids the request answers, tokenize,
    /// check the context. `live` are the bindings of every slot (a tool
    /// result may answer a call any live slot made).
    pub(super) fn admit(&mut self, job: Job, ctx: usize, live: &[&Bindings]) -> Option<Admitted> {
        let Job { req, events } = job;
        let t0 = Instant::now();
        self.ids = id_rng(self.request_seq);
        if self.cfg.exact_replay {
            self.prefetch_tool_ids(&req);
        }
        let text = if self.cfg.exact_replay {
            render::render(&req, &mut self.memory)
        } else {
            render::render(&req, &mut render::NoReplay)
        };
        if let Some(e) = self.unknown_tool_result(&req, live) {
            let _ = events.send(Event::Rejected(e));
            return None;
        }
        // Completions echo and token-id prompts: the client's own tokens.
        let (text, full) = match scoring::raw_prompt(&req, &self.tok) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                let full = self.tok.encode_chat(&text);
                (text, full)
            }
            Err(e) => {
                let _ = events.send(Event::Rejected(e));
                return None;
            }
        };
        if full.len() >= ctx {
            let param = match req.api {
                Api::Chat | Api::Messages => "messages",
                Api::Completions => "prompt",
                Api::Responses => "input",
            };
            let e = ApiError::context(full.len(), ctx, param, req.api == Api::Messages);
            let _ = events.send(Event::Rejected(e));
            return None;
        }
        Some(Admitted {
            req,
            events,
            text,
            full,
            t0,
            seq: self.request_seq,
            ids: self.ids.clone(),
        })
    }

    /// Tool results must answer a call that is replayed in the input or
    /// that this server made (SERVER.md §9.1, §9.2).
    fn unknown_tool_result(&self, req: &GenRequest, live: &[&Bindings]) -> Option<ApiError> {
        if req.api != Api::Messages && req.api != Api::Responses {
            return None;
        }
        let replayed: Vec<&str> = req
            .messages
            .iter()
            .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
            .collect();
        let known = |id: &String| {
            replayed.contains(&id.as_str())
                || self.memory.contains(id)
                || live.iter().any(|b| {
                    b.protocol
                        .as_ref()
                        .is_some_and(|p| p.ids.iter().any(|x| x == id))
                })
        };
        let id = req
            .messages
            .iter()
            .filter(|m| m.role != Role::Assistant)
            .flat_map(|m| m.tool_result_ids.iter())
            .find(|id| !known(id))?;
        let msg = if req.api == Api::Messages {
            format!("Anthropic continuation state is not available for tool_use_id {id}; retry by replaying the full messages history")
        } else {
            format!("Responses continuation state is not available for call_id {id}; retry by replaying the full input history")
        };
        Some(ApiError::invalid(&msg))
    }

    /// After the plan: the trace, the 409 for lost live tool state, the
    /// `--debug-panic-on-prompt` hook, the `Accepted` event and the
    /// metrics. False when the job was rejected.
    pub(super) fn accept(
        &mut self,
        a: &Admitted,
        eff: usize,
        cached: usize,
        source: &'static str,
        live_before: usize,
    ) -> bool {
        let decision = trace::Decision {
            seq: a.seq,
            prompt_tokens: a.full.len(),
            effective_tokens: eff,
            cached,
            live_before,
            source,
        };
        self.trace.request(&a.req, &decision, &a.text);
        if cached == 0 && needs_live_tool_state(&a.req) {
            let msg = if a.req.api == Api::Messages {
                "Anthropic continuation state is not available; retry by replaying the full messages history"
            } else {
                "Responses continuation state is not available; retry by replaying the full input history"
            };
            let _ = a.events.send(Event::Rejected(ApiError::new(409, msg)));
            return false;
        }
        self.debug_panic_hook(&a.text, &a.events, eff, cached);
        let _ = a.events.send(Event::Accepted {
            prompt_tokens: eff,
            cached,
        });
        let m = &self.metrics;
        m.requests.fetch_add(1, Ordering::Relaxed);
        m.prompt_tokens.fetch_add(eff as u64, Ordering::Relaxed);
        if cached > 0 {
            m.prefix_hits.fetch_add(1, Ordering::Relaxed);
            m.reused_tokens.fetch_add(cached as u64, Ordering::Relaxed);
        }
        true
    }

    /// `--debug-panic-on-prompt`: the job is accepted (so a stream has
    /// started), then panics.
    fn debug_panic_hook(
        &self,
        text: &str,
        events: &UnboundedSender<Event>,
        prompt: usize,
        cached: usize,
    ) {
        let Some(marker) = &self.cfg.debug_panic_on_prompt else {
            return;
        };
        if text.contains(marker.as_str()) {
            let _ = events.send(Event::Accepted {
                prompt_tokens: prompt,
                cached,
            });
            panic!("debug panic: the prompt contains {marker:?}");
        }
    }

    /// The token limit of a request whose effective prompt is `prompt`.
    pub(super) fn max_new(&self, req: &GenRequest, ctx: usize, prompt: usize) -> usize {
        req.max_tokens
            .map(|n| n.max(0) as usize)
            .unwrap_or(self.cfg.default_tokens)
            .min(ctx.saturating_sub(prompt))
    }

    /// The request's picker: its script, the next queued script, or the
    /// sampler seeded by the request (or by `ids`, the request's own
    /// generator, when it gives no seed), under the request's response
    /// format or strict tools when it has them ([`Core::constrained`]).
    pub(super) fn picker(
        &mut self,
        req: &GenRequest,
        ids: &mut Rng,
        thinking: bool,
    ) -> Result<Box<dyn TokenPicker>, String> {
        let queued = if req.script.is_none() && !self.cfg.queued_scripts.is_empty() {
            Some(self.cfg.queued_scripts.remove(0))
        } else {
            None
        };
        match req.script.as_ref().or(queued.as_ref()) {
            Some(s) => Ok(Box::new(Scripted::from_text(&self.tok, s))),
            None => {
                let sampled = Sampled {
                    cfg: req.sampler,
                    rng: Rng::new(req.seed.unwrap_or_else(|| ids.next_u64())),
                };
                self.constrained(sampled, req, thinking)
            }
        }
    }

    /// The sampler, under the request's response format (the answer after
    /// `</think>` when the turn thinks) or its strict tools' DSML grammar
    /// (from the block's first `｜DSML｜`, or the whole answer when a call
    /// is forced); plain when it has neither.
    fn constrained(
        &mut self,
        sampled: Sampled,
        req: &GenRequest,
        thinking: bool,
    ) -> Result<Box<dyn TokenPicker>, String> {
        let specials = *self.tok.specials();
        let mut gates = if thinking {
            vec![specials.think_close]
        } else {
            Vec::new()
        };
        let (g, required) = match (&req.output, &req.tool_grammar) {
            (Some(g), _) => (g.clone(), true),
            (None, Some(t)) if req.tools_active() => {
                if !t.forced {
                    gates.push(specials.dsml);
                }
                (
                    crate::constrain::OutputGrammar::Lark(t.lark(specials.dsml, req.dialect)),
                    t.forced,
                )
            }
            _ => return Ok(Box::new(sampled)),
        };
        let engine = match &self.grammar {
            Some(e) => e.clone(),
            None => {
                let e = Arc::new(GrammarEngine::new(&self.tok).map_err(|e| e.to_string())?);
                self.grammar = Some(e.clone());
                e
            }
        };
        let c = engine.constraint(&g).map_err(|e| e.to_string())?;
        Ok(Box::new(Constrained::new(
            sampled,
            c,
            gates,
            required,
            specials.eos,
        )))
    }

    /// The stream observer's results and the decode metrics.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decoded(
        &self,
        obs: &mut Stream,
        tokens: usize,
        finish: Finish,
        thinking: bool,
        grammar_open: bool,
        logprobs: Vec<TokenLogprob>,
        gen_s: f64,
        prefill_s: f64,
    ) -> Decoded {
        obs.flush();
        let d = Decoded {
            tokens,
            finish,
            thinking,
            stop_hit: obs.stop_hit,
            raw: String::from_utf8_lossy(&obs.raw).into_owned(),
            saw_close: obs.split.saw_close(),
            live_ids: std::mem::take(&mut obs.live_ids),
            live_closed: std::mem::take(&mut obs.live_closed),
            grammar_open,
            logprobs,
        };
        let m = &self.metrics;
        m.generated_tokens
            .fetch_add(d.tokens as u64, Ordering::Relaxed);
        m.record_speed(d.tokens, gen_s, prefill_s);
        d
    }

    /// Finish: the finish reason, the DSML parse and the call ids, the
    /// bindings the next request on this slot may reuse (`live_len` is the
    /// slot's length now), the trace and the log line.
    pub(super) fn finish(
        &mut self,
        p: Prefilled,
        mut d: Decoded,
        b: &mut Bindings,
        live_len: usize,
    ) {
        let Prefilled {
            req,
            events,
            text,
            prompt,
            cached,
            t0,
            seq,
            mut ids,
            lp,
            ..
        } = p;
        let mut fin = Final {
            finish: match d.finish {
                Finish::Eos | Finish::Stopped if d.grammar_open => FinishReason::Length,
                Finish::Eos => FinishReason::Stop,
                Finish::Length => FinishReason::Length,
                Finish::Stopped if d.stop_hit => FinishReason::Stop,
                Finish::Stopped => FinishReason::ToolCalls,
                Finish::Cancelled => FinishReason::Error,
            },
            text: match &lp.echo {
                Some(echo) => format!("{echo}{}", d.raw),
                None => d.raw.clone(),
            },
            reasoning: None,
            content: d.raw.clone(),
            calls: Vec::new(),
            saw_think_close: d.saw_close,
            usage: Usage {
                prompt,
                cached,
                completion: d.tokens,
            },
            logprobs: lp.finish(d.logprobs.clone(), d.raw.len(), self.tok.specials().eos),
        };
        if d.finish == Finish::Cancelled {
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if req.chat_style() {
            let raw_block = self.parse_calls(&req, &mut d, &mut fin, &mut ids);
            // SERVER.md §9.3: remember the visible transcript of a plain
            // thinking turn so the next request keeps the hidden reasoning.
            let tool_context = req.tools_active()
                || req
                    .messages
                    .iter()
                    .any(|m| !m.tool_calls.is_empty() || m.role == Role::Tool);
            if d.thinking
                && !tool_context
                && fin.saw_think_close
                && matches!(fin.finish, FinishReason::Stop)
                && !d.stop_hit
            {
                let base = text.strip_suffix("<think>").unwrap_or(&text);
                b.thinking_visible = Some(VisibleBinding {
                    text: format!("{base}</think>{}{EOS}", fin.content),
                    live_len,
                });
            }
            self.bind_protocol(
                b, live_len, &req, &text, &fin, raw_block, d.thinking, d.stop_hit,
            );
        }
        let elapsed = t0.elapsed().as_secs_f64();
        self.trace.result(seq, &fin, elapsed);
        crate::log_line!(
            "ds4-server: request {} {:?} stream={} prompt={} cached={} generated={} finish={:?} calls={} {:.2}s",
            seq,
            req.api,
            req.stream as u8,
            fin.usage.prompt,
            fin.usage.cached,
            fin.usage.completion,
            fin.finish,
            fin.calls.len(),
            elapsed
        );
        let _ = events.send(Event::Done(Box::new(fin)));
    }

    /// The DSML block of a chat-style answer into calls with ids (the ids
    /// shown live are kept), remembered for exact replay; returns the raw
    /// sampled block.
    fn parse_calls(
        &mut self,
        req: &GenRequest,
        d: &mut Decoded,
        fin: &mut Final,
        ids: &mut Rng,
    ) -> Option<String> {
        let p: Parsed = dsml::parse_output(&d.raw, d.thinking);
        let raw_block = p.raw_dsml.clone();
        fin.reasoning = p.reasoning.filter(|r| !r.is_empty());
        fin.content = p.content.clone();
        if p.failed {
            if p.unterminated && fin.finish != FinishReason::Length {
                fin.finish = FinishReason::Error;
            } else if req.tools_active() && fin.finish == FinishReason::ToolCalls {
                fin.finish = FinishReason::Stop;
            }
        } else if !p.calls.is_empty() {
            fin.finish = FinishReason::ToolCalls;
            let prefix = if req.api == Api::Messages {
                "toolu_"
            } else {
                "call_"
            };
            let block = Arc::new(p.raw_dsml.clone().unwrap_or_default());
            for (i, c) in p.calls.into_iter().enumerate() {
                // The ids shown live are the ids of the parsed calls.
                let live = d.live_ids.get(i).cloned();
                let streamed = d.live_closed.get(i).copied().unwrap_or(false);
                let id = live.unwrap_or_else(|| loop {
                    let id = format!("{prefix}{}", random_hex(16, ids));
                    if !self.memory.contains(&id) {
                        break id;
                    }
                });
                if self.cfg.exact_replay {
                    self.memory
                        .insert(&id, block.clone(), self.cfg.tool_memory_max_ids);
                }
                fin.calls.push(OutCall {
                    id,
                    name: c.name,
                    arguments: c.arguments,
                    streamed,
                });
            }
        } else if fin.finish == FinishReason::ToolCalls {
            fin.finish = FinishReason::Stop;
        }
        raw_block
    }

    /// Records the Responses / Anthropic protocol state of a finished turn.
    #[allow(clippy::too_many_arguments)]
    fn bind_protocol(
        &mut self,
        b: &mut Bindings,
        live_len: usize,
        req: &GenRequest,
        prompt_text: &str,
        fin: &Final,
        raw_block: Option<String>,
        thinking: bool,
        stop_hit: bool,
    ) {
        if matches!(fin.finish, FinishReason::Error | FinishReason::Length) || stop_hit {
            return;
        }
        let ids: Vec<String> = fin.calls.iter().map(|c| c.id.clone()).collect();
        match req.api {
            Api::Responses => {
                let mut v = prompt_text.to_string();
                if thinking {
                    if req.reasoning_summary && !fin.calls.is_empty() {
                        v.push_str(fin.reasoning.as_deref().unwrap_or(""));
                    }
                    v.push_str("</think>");
                }
                v.push_str(&fin.content);
                if !fin.calls.is_empty() {
                    let block = if self.cfg.exact_replay {
                        raw_block.unwrap_or_default()
                    } else {
                        let calls: Vec<super::request::ToolCall> = fin
                            .calls
                            .iter()
                            .map(|c| super::request::ToolCall {
                                id: c.id.clone(),
                                name: c.name.clone(),
                                arguments: c.arguments.clone(),
                            })
                            .collect();
                        render::canonical_dsml_for(req, &calls)
                    };
                    v.push_str(&block);
                }
                v.push_str(EOS);
                b.protocol = Some(ProtocolBinding {
                    api: Api::Responses,
                    ids,
                    visible: Some(v),
                    live_len,
                });
            }
            Api::Messages if !ids.is_empty() => {
                b.protocol = Some(ProtocolBinding {
                    api: Api::Messages,
                    ids,
                    visible: None,
                    live_len,
                });
            }
            _ => {}
        }
    }
}

/// The ids of a request's tool calls and results that `memory` lacks.
pub(super) fn missing_tool_ids(
    req: &GenRequest,
    memory: &ToolMemory,
) -> std::collections::HashSet<String> {
    req.messages
        .iter()
        .flat_map(|m| {
            m.tool_calls
                .iter()
                .map(|c| c.id.as_str())
                .chain(m.tool_result_ids.iter().map(String::as_str))
        })
        .filter(|id| !id.is_empty() && !memory.contains(id))
        .map(str::to_string)
        .collect()
}

/// The visible transcript remembered at exactly the live length `n`.
pub(super) fn visible_at(b: &Bindings, n: usize) -> Option<(String, VisibleKind)> {
    if let Some(v) = b
        .protocol
        .as_ref()
        .filter(|p| p.live_len == n)
        .and_then(|p| p.visible.clone())
    {
        return Some((v, VisibleKind::Responses));
    }
    b.thinking_visible
        .as_ref()
        .filter(|t| t.live_len == n)
        .map(|t| (t.text.clone(), VisibleKind::Thinking))
}

impl Worker {
    fn run(mut self, rx: Receiver<Work>) {
        while let Ok(work) = rx.recv() {
            let job = match work {
                Work::Gen(job) => *job,
                Work::Shutdown(ack) => {
                    let visible = visible_at(&self.live, self.sess.tokens().len());
                    let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
                    let c = &mut self.core;
                    let tools = tool_ids(&c.cfg, &c.memory);
                    c.cache.shutdown(&self.sess, &c.tok, v, tools);
                    let _ = ack.send(());
                    break;
                }
            };
            self.core.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                // The client left while queued: nothing to do.
                continue;
            }
            self.core.request_seq += 1;
            let m = self.core.metrics.clone();
            m.active_slots.store(1, Ordering::Relaxed);
            self.run_job(job);
            if let Some(st) = self.sess.engram_stats() {
                m.record_engram(st);
            }
            m.active_slots.store(0, Ordering::Relaxed);
        }
    }

    /// One job under `catch_unwind`: a panic fails this job alone (500, or
    /// an error event once streaming), the session is reset because its KV
    /// may be half-written, and the worker takes the next job.
    fn run_job(&mut self, job: Job) {
        let events = job.events.clone();
        let seq = self.core.request_seq;
        let outcome = catch_unwind(AssertUnwindSafe(|| self.serve(job)));
        let msg = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(msg)) => msg,
            Err(payload) => {
                let msg = panic_message(&*payload);
                self.forget_live_state();
                self.core.health.record_panic(msg.clone(), seq);
                crate::log_line!(
                    "ds4-server: request {seq} failed: the worker panicked ({msg}); the session was reset"
                );
                format!("internal error: the server failed on this request ({msg}); its session was reset")
            }
        };
        let _ = events.send(Event::Failed(msg));
    }

    /// After a panic nothing live can be trusted: the KV slot is treated as
    /// cold and the bindings that describe it go.
    fn forget_live_state(&mut self) {
        self.live = Bindings::default();
        if catch_unwind(AssertUnwindSafe(|| self.sess.reset())).is_err() {
            crate::log_line!("ds4-server: resetting the session panicked too");
        }
    }

    /// Rules 1-6 on the live session, then rules 7 and 8: a disk
    /// checkpoint through the cache hook, or nothing.
    fn plan(
        &mut self,
        req: &GenRequest,
        text: &str,
        full: Vec<u32>,
    ) -> (Vec<u32>, usize, &'static str) {
        let live = self.sess.tokens().to_vec();
        let full = match self.core.plan_live(req, text, full, &live, &self.live) {
            Ok(p) => return p,
            Err(full) => full,
        };
        let visible = visible_at(&self.live, live.len());
        let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
        let c = &mut self.core;
        let tools = tool_ids(&c.cfg, &c.memory);
        match c.cache.resume(&mut self.sess, &c.tok, text, v, tools) {
            Some(hit) => {
                if c.cfg.exact_replay {
                    c.memory.restore(hit.tool_map, c.cfg.tool_memory_max_ids);
                }
                (hit.effective, hit.cached, "disk-text")
            }
            None => (full, 0, "none"),
        }
    }

    /// One request: four phases. Each returns `None` when the job ended
    /// early (rejected, or a generation error already reported).
    fn serve(&mut self, job: Job) -> Result<(), String> {
        let ctx = self.sess.ctx();
        let Some(a) = self.core.admit(job, ctx, &[&self.live]) else {
            return Ok(());
        };
        let Some(mut p) = self.prefill(a)? else {
            return Ok(());
        };
        let Some(d) = self.decode(&mut p) else {
            return Ok(());
        };
        let live_len = self.sess.tokens().len();
        self.core.finish(p, d, &mut self.live, live_len);
        Ok(())
    }

    /// Prefill: the reuse plan, the 409 for lost live tool state, the trace,
    /// the metrics, then the KV brought to the effective prompt.
    fn prefill(&mut self, a: Admitted) -> Result<Option<Prefilled>, String> {
        let ctx = self.sess.ctx();
        let live_before = self.sess.tokens().len();
        let (eff, cached, source) = if a.req.scoring.raw_prompt() {
            (a.full.clone(), 0, "none")
        } else {
            self.plan(&a.req, &a.text, a.full.clone())
        };
        let (eff, cached, source) = if eff.len() >= ctx {
            (a.full.clone(), 0, "none")
        } else {
            (eff, cached, source)
        };
        if !self.core.accept(&a, eff.len(), cached, source, live_before) {
            return Ok(None);
        }
        // Any binding not used by this request is cleared.
        self.live = Bindings::default();
        let c = &mut self.core;
        let tools = tool_ids(&c.cfg, &c.memory);
        let mut lp = JobLogprobs::new(&a.req);
        let stats = match lp.prefill(&a.req, &mut self.sess, &c.tok, &eff, &a.events) {
            Some(scored) => scored,
            None => c
                .cache
                .prefill(&mut self.sess, &c.tok, &eff, cached, &mut |_, _| {}, tools),
        }
        .map_err(|e| e.to_string())?;
        c.metrics
            .evaluated_prompt_tokens
            .fetch_add(stats.evaluated as u64, Ordering::Relaxed);
        Ok(Some(a.prefilled(eff.len(), cached, lp)))
    }

    /// Decode: the picker (script or sampler), the stream observer and the
    /// generation loop; `None` after a generation error (already reported).
    fn decode(&mut self, p: &mut Prefilled) -> Option<Decoded> {
        let req = &p.req;
        let thinking = req.chat_style() && req.mode.thinks();
        let max_new = self.core.max_new(req, self.sess.ctx(), p.prompt);
        // The request's id generator seeds an unseeded sampler first, then
        // mints the call ids (finish), as one stream.
        let mut picker = match self.core.picker(req, &mut p.ids, thinking) {
            Ok(picker) => picker,
            Err(e) => {
                let _ = p.events.send(Event::Failed(e));
                return None;
            }
        };
        let c = &mut self.core;
        let tools = tool_ids(&c.cfg, &c.memory);
        let mut stream = Stream::new(req, thinking, p.events.clone(), c.tok.clone(), p.seq);
        let mut obs = WithCache {
            stream: &mut stream,
            cache: &mut *c.cache,
            tools,
            tok: &c.tok,
        };
        let mut picker =
            p.lp.recorder(&mut *picker, c.tok.clone(), thinking, p.events.clone());
        let t1 = Instant::now();
        let outcome = generate::generate(&mut self.sess, &c.tok, max_new, &mut picker, &mut obs);
        let gen_s = t1.elapsed().as_secs_f64();
        let (tokens, finish) = match outcome {
            Ok(o) => (o.tokens, o.finish),
            Err(e) => {
                self.sess.reset();
                let _ = p.events.send(Event::Failed(e.to_string()));
                return None;
            }
        };
        let grammar_open = picker.unfinished();
        let logprobs = std::mem::take(&mut picker.scorer.entries);
        let d = self.core.decoded(
            &mut stream,
            tokens.len(),
            finish,
            thinking,
            grammar_open,
            logprobs,
            gen_s,
            p.t_prefill.as_secs_f64(),
        );
        if d.stop_hit {
            // The KV holds tokens past the cut: it no longer matches the text.
            self.sess.reset();
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::{parse_chat, ParseContext};

    #[test]
    fn a_full_queue_is_503_with_retry_after() {
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let metrics = Arc::new(Metrics::default());
        let q = Queue {
            tx,
            metrics: metrics.clone(),
            health: Arc::new(WorkerHealth::default()),
            bound: 1,
        };
        let pc = ParseContext {
            ctx: 100,
            allow_script: false,
        };
        let job = || Job {
            req: parse_chat(br#"{"messages":[]}"#, pc).unwrap(),
            events: tokio::sync::mpsc::unbounded_channel().0,
        };
        assert!(q.submit(job()).is_ok());
        let e = q.submit(job()).unwrap_err();
        assert_eq!((e.status, e.retry_after), (503, Some(1)));
        assert_eq!(metrics.queue_depth.load(Ordering::SeqCst), 1);
    }
}
