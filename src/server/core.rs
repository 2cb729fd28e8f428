//! The engine thread's core, shared by the serial worker (`worker.rs`, one
//! `Session`) and the slot scheduler (`slots.rs`, one `Batch` of N slots):
//! [`Core`] keeps everything besides the KV state (the tokenizer, the
//! settings, the tool memory, the disk-cache hook, `--trace`, the grammar
//! engine), and a job passes through its phases as [`Admitted`] (rendered,
//! tokenized, its context checked) and [`Prefilled`] (its prompt in a KV
//! slot). Admission, the live-reuse rules 1-6, acceptance and the picker
//! live here; what generation produced (`Decoded`) and the finish phase are
//! `finish.rs`. What one KV slot remembers about its turn is [`Bindings`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::health::WorkerHealth;
use super::job::{Event, Job, KvCacheHook, VisibleKind};
use super::memory::{
    id_rng, same_set, trailing_tool_run, ProtocolBinding, ToolMemory, VisibleBinding,
};
use super::metrics::Metrics;
use super::plan;
use super::render;
use super::request::{Api, GenRequest, Role};
use super::scoring::{self, JobLogprobs};
use super::trace::{self, Trace};
use crate::constrain::GrammarEngine;
use crate::generate::{Constrained, Sampled, Scripted, TokenPicker};
use crate::kvcache::{NoToolIds, ToolIds};
use crate::sampler::Rng;
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
