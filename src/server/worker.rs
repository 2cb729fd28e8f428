//! The one engine thread: it owns the session (one live KV slot), the tool
//! memory and every reuse decision, takes jobs strictly in arrival order from
//! a bounded queue and sends each job's output back over the job's channel.
//! HTTP handlers never touch the engine, so engine work never blocks tokio.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::dsml::{self, Parsed};
use super::error::ApiError;
use super::metrics::Metrics;
use super::render::{self, ReplayLookup, EOS};
use super::request::{Api, GenRequest, Role};
use crate::generate::{
    self, Finish, Observer, Piece, Sampled, Scripted, Step, ThinkSplit, TokenPicker,
};
use crate::kvcache::{KtmEntry, NoToolIds, ToolIds};
use crate::sampler::Rng;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// Token counts of one response (SERVER.md §4.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: usize,
    pub cached: usize,
    pub completion: usize,
}

impl Usage {
    pub fn cache_write(&self) -> usize {
        self.prompt - self.cached.min(self.prompt)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// Already sent whole as live events (header, fragments, end).
    pub streamed: bool,
}

/// The end of a job.
#[derive(Clone, Debug)]
pub struct Final {
    pub finish: FinishReason,
    /// Raw generated text (stop sequences cut), for completions.
    pub text: String,
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<OutCall>,
    /// Whether `</think>` was generated.
    pub saw_think_close: bool,
    pub usage: Usage,
}

/// What a job sends back, in this order: `Accepted` (or `Rejected`), then
/// deltas, then `Done` (or `Failed`).
#[derive(Clone, Debug)]
pub enum Event {
    Accepted {
        prompt_tokens: usize,
        cached: usize,
    },
    Rejected(ApiError),
    Reasoning(String),
    Text(String),
    /// A tool call recognised live (chat and Anthropic): its header, then
    /// argument fragments, then its end.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        args: String,
    },
    ToolEnd {
        index: usize,
    },
    Done(Box<Final>),
    Failed(String),
}

pub struct Job {
    pub req: GenRequest,
    pub events: UnboundedSender<Event>,
}

/// What the queue carries.
enum Work {
    Gen(Job),
    /// Ends the worker after the jobs queued before it; acknowledged once
    /// the cache had its shutdown call.
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// Which remembered transcript a visible cache key is (KVCACHE.md §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisibleKind {
    Responses,
    Thinking,
}

/// A disk hit: the effective prompt, the cached count and the checkpoint's
/// KTM tool-id map (for the tool memory, KVCACHE.md §7 step 5).
pub struct DiskResumed {
    pub effective: Vec<u32>,
    pub cached: usize,
    pub tool_map: Vec<KtmEntry>,
}

/// Where a disk KV cache hooks into the worker (KVCACHE.md §2 rule 7 and
/// §5's save moments). The shape follows `kvcache::SaveMoments`; the
/// defaults are "no cache", so without one the server behaves as with
/// `--kv-disk-dir` unset. Every call that may store a checkpoint gets the
/// worker's tool memory (`tools`), whose ids for the tool calls in the
/// checkpoint's text go into its KTM map (§4.5).
pub trait KvCacheHook: Send {
    /// Rules 1-6 found nothing: save the live session (evict), then bring
    /// it to the longest stored prefix of `rendered`. Returns the effective
    /// prompt and the cached count on a hit. `visible` is the transcript
    /// remembered at the live length, if any.
    fn resume(
        &mut self,
        _sess: &mut Session,
        _tok: &Tokenizer,
        _rendered: &str,
        _visible: Option<(&[u8], VisibleKind)>,
        _tools: &dyn ToolIds,
    ) -> Option<DiskResumed> {
        None
    }
    /// Replaces `Session::sync` (cold and continued saves on the way).
    fn prefill(
        &mut self,
        sess: &mut Session,
        _tok: &Tokenizer,
        prompt: &[u32],
        _cached: usize,
        progress: &mut dyn FnMut(usize, usize),
        _tools: &dyn ToolIds,
    ) -> Result<crate::session::SyncStats, crate::session::SessionError> {
        sess.sync(prompt, progress)
    }
    /// Before each decode step (continued saves); not called inside the
    /// DSML block of a request with tools.
    fn before_decode(&mut self, _sess: &Session, _tok: &Tokenizer, _tools: &dyn ToolIds) {}
    /// Clean shutdown, after the last request (§5.4).
    fn shutdown(
        &mut self,
        _sess: &Session,
        _tok: &Tokenizer,
        _visible: Option<(&[u8], VisibleKind)>,
        _tools: &dyn ToolIds,
    ) {
    }
    /// Tool-id prefetch (§7, last paragraph): the (id, DSML block) pairs
    /// stored in any checkpoint's KTM map whose id `wanted` accepts. Called
    /// before a request is rendered, for ids the tool memory lacks.
    fn prefetch_tool_ids(&mut self, _wanted: &dyn Fn(&[u8]) -> bool) -> Vec<KtmEntry> {
        Vec::new()
    }
}

/// No disk cache.
pub struct NoCache;

impl KvCacheHook for NoCache {}

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
}

/// The queue side handed to the HTTP layer.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Work>,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// Enqueues a job; a full queue is `503` with `Retry-After`.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(Work::Gen(job)) {
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
    let (tx, rx) = std::sync::mpsc::sync_channel(bound.max(1));
    let m = metrics.clone();
    let trace = cfg
        .trace
        .as_ref()
        .and_then(|p| match std::fs::File::create(p) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("ds4-server: --trace {}: {e}", p.display());
                None
            }
        });
    std::thread::Builder::new()
        .name("ds4-worker".into())
        .spawn(move || {
            Worker {
                sess,
                tok,
                cfg,
                metrics: m,
                memory: ToolMemory::default(),
                cache,
                thinking_visible: None,
                protocol: None,
                trace,
                request_seq: 0,
            }
            .run(rx)
        })
        .expect("spawning the worker thread");
    Queue { tx, metrics }
}

/// Tool id → the exact sampled DSML block (SERVER.md §7), bounded, LRU.
#[derive(Default)]
struct ToolMemory {
    map: HashMap<String, (Arc<String>, u64)>,
    tick: u64,
}

impl ToolMemory {
    fn insert(&mut self, id: &str, block: Arc<String>, max: usize) {
        self.tick += 1;
        self.map.insert(id.to_string(), (block, self.tick));
        if self.map.len() > max {
            // Drop the least recently used tenth at once (amortised O(1)).
            let mut ticks: Vec<u64> = self.map.values().map(|v| v.1).collect();
            ticks.sort_unstable();
            let cut = ticks[(self.map.len() - max + max / 10).min(ticks.len() - 1)];
            self.map.retain(|_, v| v.1 > cut);
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    /// Adds pairs read back from a checkpoint's KTM map; equal blocks share
    /// one allocation, as blocks sampled together do. A block that is not
    /// UTF-8 cannot have been sampled by this server and is skipped.
    fn restore(&mut self, entries: Vec<KtmEntry>, max: usize) -> usize {
        let mut blocks: HashMap<Vec<u8>, Arc<String>> = HashMap::new();
        let mut n = 0;
        for e in entries {
            let (Ok(id), Some(block)) = (
                String::from_utf8(e.id),
                match blocks.get(&e.dsml) {
                    Some(b) => Some(b.clone()),
                    None => String::from_utf8(e.dsml.clone()).ok().map(|b| {
                        let b = Arc::new(b);
                        blocks.insert(e.dsml, b.clone());
                        b
                    }),
                },
            ) else {
                continue;
            };
            self.insert(&id, block, max);
            n += 1;
        }
        n
    }
}

/// The KTM map of a checkpoint is written from this memory (KVCACHE.md §4.5).
impl ToolIds for ToolMemory {
    fn for_each_tool_id(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (id, (block, _)) in &self.map {
            f(id.as_bytes(), block.as_bytes());
        }
    }
}

impl ReplayLookup for ToolMemory {
    fn block_for(&mut self, ids: &[&str]) -> Option<String> {
        let first = self.map.get(ids[0])?.0.clone();
        for id in ids {
            let (b, _) = self.map.get(*id)?;
            if !Arc::ptr_eq(b, &first) && **b != *first {
                return None;
            }
        }
        self.tick += 1;
        for id in ids {
            if let Some(e) = self.map.get_mut(*id) {
                e.1 = self.tick;
            }
        }
        Some(first.to_string())
    }
}

/// The thinking-visible binding of SERVER.md §9.3.
struct VisibleBinding {
    text: String,
    live_len: usize,
}

/// Protocol state of the last Responses / Anthropic turn (SERVER.md §9.1,
/// §9.2): the call ids it made, the live length then, and for Responses the
/// visible transcript a client that replays its input will render.
struct ProtocolBinding {
    api: Api,
    ids: Vec<String>,
    visible: Option<String>,
    live_len: usize,
}

/// Trailing tool outputs of a request and the id set they answer
/// (SERVER.md §9.1 b, §9.2); None when the request does not end with them.
fn trailing_tool_run(req: &GenRequest) -> Option<(usize, Vec<String>)> {
    let msgs = &req.messages;
    let is_result = |m: &super::request::Message| match req.api {
        Api::Messages => m.role == Role::User && !m.tool_result_ids.is_empty(),
        _ => m.role == Role::Tool,
    };
    let mut start = msgs.len();
    while start > 0 && (is_result(&msgs[start - 1]) || msgs[start - 1].role == Role::System) {
        start -= 1;
    }
    let run = &msgs[start..];
    if !run.iter().any(is_result) {
        return None;
    }
    let mut ids: Vec<String> = run
        .iter()
        .flat_map(|m| m.tool_result_ids.iter().cloned())
        .collect();
    if req.api == Api::Responses {
        // The set comes from the assistant message right before the run.
        if let Some(prev) = start.checked_sub(1).map(|i| &msgs[i]) {
            if prev.role != Role::Assistant || prev.tool_calls.is_empty() {
                return None;
            }
            ids = prev.tool_calls.iter().map(|c| c.id.clone()).collect();
        }
    }
    let first = run.iter().position(is_result).map_or(start, |p| start + p);
    Some((first, ids))
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

struct Worker {
    sess: Session,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    metrics: Arc<Metrics>,
    memory: ToolMemory,
    cache: Box<dyn KvCacheHook>,
    thinking_visible: Option<VisibleBinding>,
    protocol: Option<ProtocolBinding>,
    trace: Option<std::fs::File>,
    request_seq: u64,
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time.
fn utc_stamp(t: u64) -> String {
    let (days, secs) = ((t / 86400) as i64, t % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// 16 random bytes as 32 hex chars (`/dev/urandom`, time-mixed fallback).
fn random_hex(n: usize, rng: &mut Rng) -> String {
    use std::io::Read;
    let mut bytes = vec![0u8; n];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        for b in &mut bytes {
            *b = rng.next_u64() as u8;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_seed(seq: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (t << 32) ^ (seq << 1) ^ (&seq as *const u64 as u64)
}

impl Worker {
    fn run(mut self, rx: Receiver<Work>) {
        while let Ok(work) = rx.recv() {
            let job = match work {
                Work::Gen(job) => job,
                Work::Shutdown(ack) => {
                    let visible = self.visible_at_live();
                    let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
                    let tools: &dyn ToolIds = if self.cfg.exact_replay {
                        &self.memory
                    } else {
                        &NoToolIds
                    };
                    self.cache.shutdown(&self.sess, &self.tok, v, tools);
                    let _ = ack.send(());
                    break;
                }
            };
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                // The client left while queued: nothing to do.
                continue;
            }
            self.request_seq += 1;
            let events = job.events.clone();
            if let Err(msg) = self.serve(job) {
                let _ = events.send(Event::Failed(msg));
            }
        }
    }

    /// The effective prompt, the cached count and the rule that matched
    /// (KVCACHE.md §2; the names are ds4's trace `cache_source` values).
    fn plan(
        &mut self,
        req: &GenRequest,
        text: &str,
        full: Vec<u32>,
    ) -> (Vec<u32>, usize, &'static str) {
        let live = self.sess.tokens().to_vec();
        if live.is_empty() {
            return self.plan_cold(text, full);
        }
        if let Some(b) = self
            .protocol
            .as_ref()
            .filter(|b| b.live_len == live.len() && b.api == req.api)
        {
            // Rule 1: the Responses visible transcript is a strict prefix.
            if let Some(v) = &b.visible {
                if text.len() > v.len() && text.starts_with(v.as_str()) {
                    let mut eff = live.clone();
                    eff.extend(self.tok.encode_chat(&text[v.len()..]));
                    return (eff, live.len(), "responses-visible");
                }
            }
            // Rules 2 and 3: the request ends with the results of exactly
            // the calls the live session made: append only the tail.
            if let Some((first, ids)) = trailing_tool_run(req) {
                if same_set(&ids, &b.ids) {
                    let tail = if self.cfg.exact_replay {
                        render::render_tail(&req.messages[first..], req, &mut self.memory)
                    } else {
                        render::render_tail(&req.messages[first..], req, &mut render::NoReplay)
                    };
                    let mut eff = live.clone();
                    eff.extend(self.tok.encode_chat(&tail));
                    let source = if req.api == Api::Messages {
                        "anthropic-tool-output"
                    } else {
                        "responses-tool-output"
                    };
                    return (eff, live.len(), source);
                }
            }
        }
        if full.len() >= live.len() && full[..live.len()] == live[..] {
            return (full, live.len(), "memory-token");
        }
        let extend = |prefix_len: usize| {
            let mut eff = live.clone();
            eff.extend(self.tok.encode_chat(&text[prefix_len..]));
            eff
        };
        if req.chat_style() {
            if let Some(b) = &self.thinking_visible {
                if b.live_len == live.len()
                    && text.len() > b.text.len()
                    && text.starts_with(&b.text)
                {
                    let n = b.text.len();
                    return (extend(n), live.len(), "thinking-visible");
                }
            }
        }
        let decoded = self.tok.decode(&live);
        if text.as_bytes().starts_with(&decoded) {
            let n = decoded.len();
            return (extend(n), live.len(), "memory-text");
        }
        self.plan_cold(text, full)
    }

    /// Before rendering: the ids of the request's tool calls and results
    /// that the tool memory lacks are looked up in the disk checkpoints' KTM
    /// maps (KVCACHE.md §7), so that a restarted server renders those calls
    /// with their exact sampled bytes again.
    fn prefetch_tool_ids(&mut self, req: &GenRequest) {
        let missing: std::collections::HashSet<&str> = req
            .messages
            .iter()
            .flat_map(|m| {
                m.tool_calls
                    .iter()
                    .map(|c| c.id.as_str())
                    .chain(m.tool_result_ids.iter().map(String::as_str))
            })
            .filter(|id| !id.is_empty() && !self.memory.contains(id))
            .collect();
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

    /// The visible transcript remembered at exactly the live length.
    fn visible_at_live(&self) -> Option<(String, VisibleKind)> {
        let n = self.sess.tokens().len();
        if let Some(v) = self
            .protocol
            .as_ref()
            .filter(|b| b.live_len == n)
            .and_then(|b| b.visible.clone())
        {
            return Some((v, VisibleKind::Responses));
        }
        self.thinking_visible
            .as_ref()
            .filter(|b| b.live_len == n)
            .map(|b| (b.text.clone(), VisibleKind::Thinking))
    }

    /// Rules 7 and 8: a disk checkpoint through the cache hook, or nothing.
    fn plan_cold(&mut self, text: &str, full: Vec<u32>) -> (Vec<u32>, usize, &'static str) {
        let visible = self.visible_at_live();
        let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
        let tools: &dyn ToolIds = if self.cfg.exact_replay {
            &self.memory
        } else {
            &NoToolIds
        };
        match self.cache.resume(&mut self.sess, &self.tok, text, v, tools) {
            Some(hit) => {
                if self.cfg.exact_replay {
                    self.memory
                        .restore(hit.tool_map, self.cfg.tool_memory_max_ids);
                }
                (hit.effective, hit.cached, "disk-text")
            }
            None => (full, 0, "none"),
        }
    }

    fn serve(&mut self, job: Job) -> Result<(), String> {
        let Job { req, events } = job;
        let t0 = Instant::now();
        let mut rng = Rng::new(now_seed(self.request_seq));
        if self.cfg.exact_replay {
            self.prefetch_tool_ids(&req);
        }
        let text = if self.cfg.exact_replay {
            render::render(&req, &mut self.memory)
        } else {
            render::render(&req, &mut render::NoReplay)
        };
        // Tool results must answer a call that is replayed in the input or
        // that this server made (SERVER.md §9.1, §9.2).
        if req.api == Api::Messages || req.api == Api::Responses {
            let replayed: Vec<&str> = req
                .messages
                .iter()
                .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
                .collect();
            for m in req.messages.iter().filter(|m| m.role != Role::Assistant) {
                for id in &m.tool_result_ids {
                    let live = self
                        .protocol
                        .as_ref()
                        .is_some_and(|b| b.ids.iter().any(|x| x == id));
                    if !replayed.contains(&id.as_str()) && !self.memory.contains(id) && !live {
                        let msg = if req.api == Api::Messages {
                            format!("Anthropic continuation state is not available for tool_use_id {id}; retry by replaying the full messages history")
                        } else {
                            format!("Responses continuation state is not available for call_id {id}; retry by replaying the full input history")
                        };
                        let _ = events.send(Event::Rejected(ApiError::invalid(&msg)));
                        return Ok(());
                    }
                }
            }
        }
        let full = self.tok.encode_chat(&text);
        let ctx = self.sess.ctx();
        if full.len() >= ctx {
            let param = match req.api {
                Api::Chat | Api::Messages => "messages",
                Api::Completions => "prompt",
                Api::Responses => "input",
            };
            let e = ApiError::context(full.len(), ctx, param, req.api == Api::Messages);
            let _ = events.send(Event::Rejected(e));
            return Ok(());
        }
        let full_len = full.len();
        let live_before = self.sess.tokens().len();
        let (eff, cached, source) = self.plan(&req, &text, full);
        let (eff, cached, source) = if eff.len() >= ctx {
            (self.tok.encode_chat(&text), 0, "none")
        } else {
            (eff, cached, source)
        };
        if let Some(f) = self.trace.as_mut() {
            use std::io::Write;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let kind = if req.api == Api::Completions {
                "completion"
            } else {
                "chat"
            };
            let mode = match req.mode {
                crate::chat::ThinkMode::None => "none",
                crate::chat::ThinkMode::High => "high",
                crate::chat::ThinkMode::Max => "max",
            };
            let _ = write!(
                f,
                "\n===== request {} {} =====\nkind: {kind}\nmodel: {}\nstream: {}\ntools: {}\nthink_mode: {mode}\n\
                 prompt_tokens: {}\neffective_prompt_tokens: {}\ncached_tokens: {cached}\nmax_tokens: {}\n\
                 temperature: {:.3}\ntop_k: {}\ntop_p: {:.3}\nmin_p: {:.3}\nseed: {}\nstream_include_usage: {}\n\
                 \n--- cache decision ---\nlive_tokens_before: {}\ncache_source: {source}\ncached_tokens: {cached}\n\
                 \n--- raw request json ---\n{}\n\n--- rendered prompt ---\n{text}\n",
                self.request_seq,
                utc_stamp(now),
                req.model,
                req.stream as u8,
                req.tools_active() as u8,
                full_len,
                eff.len(),
                req.max_tokens.map_or("default".to_string(), |n| n.to_string()),
                req.sampler.temperature,
                req.sampler.top_k,
                req.sampler.top_p,
                req.sampler.min_p,
                req.seed.unwrap_or(0),
                req.include_usage as u8,
                live_before,
                String::from_utf8_lossy(&req.raw),
            );
        }
        // A request that needs live tool state which no longer matches: 409.
        if let Some((_, ids)) = trailing_tool_run(&req).filter(|_| req.api != Api::Chat) {
            let replayed: Vec<&str> = req
                .messages
                .iter()
                .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
                .collect();
            let live_only = ids.iter().any(|i| !replayed.contains(&i.as_str()));
            if live_only && cached == 0 {
                let msg = if req.api == Api::Messages {
                    "Anthropic continuation state is not available; retry by replaying the full messages history"
                } else {
                    "Responses continuation state is not available; retry by replaying the full input history"
                };
                let _ = events.send(Event::Rejected(ApiError::new(409, msg)));
                return Ok(());
            }
        }
        // Any binding not used by this request is cleared.
        self.thinking_visible = None;
        self.protocol = None;
        let _ = events.send(Event::Accepted {
            prompt_tokens: eff.len(),
            cached,
        });
        let m = &self.metrics;
        m.requests.fetch_add(1, Ordering::Relaxed);
        m.prompt_tokens
            .fetch_add(eff.len() as u64, Ordering::Relaxed);
        if cached > 0 {
            m.prefix_hits.fetch_add(1, Ordering::Relaxed);
            m.reused_tokens.fetch_add(cached as u64, Ordering::Relaxed);
        }
        let tools: &dyn ToolIds = if self.cfg.exact_replay {
            &self.memory
        } else {
            &NoToolIds
        };
        let stats = self
            .cache
            .prefill(
                &mut self.sess,
                &self.tok,
                &eff,
                cached,
                &mut |_, _| {},
                tools,
            )
            .map_err(|e| e.to_string())?;
        m.evaluated_prompt_tokens
            .fetch_add(stats.evaluated as u64, Ordering::Relaxed);
        let t_prefill = t0.elapsed();

        let thinking = req.chat_style() && req.mode.thinks();
        let max_new = req
            .max_tokens
            .map(|n| n.max(0) as usize)
            .unwrap_or(self.cfg.default_tokens)
            .min(ctx.saturating_sub(eff.len()));
        let queued = if req.script.is_none() && !self.cfg.queued_scripts.is_empty() {
            Some(self.cfg.queued_scripts.remove(0))
        } else {
            None
        };
        let mut picker: Box<dyn TokenPicker> = match req.script.as_ref().or(queued.as_ref()) {
            Some(s) => Box::new(Scripted::from_text(&self.tok, s)),
            None => Box::new(Sampled {
                cfg: req.sampler,
                rng: Rng::new(req.seed.unwrap_or_else(|| rng.next_u64())),
            }),
        };
        let tools: &dyn ToolIds = if self.cfg.exact_replay {
            &self.memory
        } else {
            &NoToolIds
        };
        let mut obs = Stream::new(
            &req,
            thinking,
            events.clone(),
            &mut *self.cache,
            tools,
            self.tok.clone(),
        );
        let t1 = Instant::now();
        let outcome =
            generate::generate(&mut self.sess, &self.tok, max_new, &mut *picker, &mut obs)
                .map_err(|e| e.to_string());
        let gen_s = t1.elapsed().as_secs_f64();
        let (tokens, finish) = match outcome {
            Ok(o) => (o.tokens, o.finish),
            Err(e) => {
                self.sess.reset();
                let _ = events.send(Event::Failed(e));
                return Ok(());
            }
        };
        m.generated_tokens
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        m.record_speed(tokens.len(), gen_s, t_prefill.as_secs_f64());
        obs.flush();
        let stop_hit = obs.stop_hit;
        let raw = String::from_utf8_lossy(&obs.raw).into_owned();
        let saw_close = obs.split.saw_close();
        let (live_ids, live_closed) = (
            std::mem::take(&mut obs.live_ids),
            std::mem::take(&mut obs.live_closed),
        );
        drop(obs);
        if stop_hit {
            // The KV holds tokens past the cut: it no longer matches the text.
            self.sess.reset();
        }
        let usage = Usage {
            prompt: eff.len(),
            cached,
            completion: tokens.len(),
        };
        let mut fin = Final {
            finish: match finish {
                Finish::Eos => FinishReason::Stop,
                Finish::Length => FinishReason::Length,
                Finish::Stopped if stop_hit => FinishReason::Stop,
                Finish::Stopped => FinishReason::ToolCalls,
                Finish::Cancelled => FinishReason::Error,
            },
            text: raw.clone(),
            reasoning: None,
            content: raw.clone(),
            calls: Vec::new(),
            saw_think_close: saw_close,
            usage,
        };
        if finish == Finish::Cancelled {
            m.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if req.chat_style() {
            let p: Parsed = dsml::parse_output(&raw, thinking);
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
                    let live = live_ids.get(i).cloned();
                    let streamed = live_closed.get(i).copied().unwrap_or(false);
                    let id = live.unwrap_or_else(|| loop {
                        let id = format!("{prefix}{}", random_hex(16, &mut rng));
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
            // SERVER.md §9.3: remember the visible transcript of a plain
            // thinking turn so the next request keeps the hidden reasoning.
            let tool_context = req.tools_active()
                || req
                    .messages
                    .iter()
                    .any(|m| !m.tool_calls.is_empty() || m.role == Role::Tool);
            if thinking
                && !tool_context
                && fin.saw_think_close
                && matches!(fin.finish, FinishReason::Stop)
                && !stop_hit
            {
                let base = text.strip_suffix("<think>").unwrap_or(&text);
                self.thinking_visible = Some(VisibleBinding {
                    text: format!("{base}</think>{}{EOS}", fin.content),
                    live_len: self.sess.tokens().len(),
                });
            }
            self.bind_protocol(&req, &text, &fin, raw_block, thinking, stop_hit);
        }
        if let Some(f) = self.trace.as_mut() {
            use std::io::Write;
            let mut t = format!(
                "\n--- generated text ---\n{}\n\n--- parsed message ---\nfinish: {:?}\ngenerated_tokens: {}\nelapsed_sec: {:.3}\n",
                fin.text,
                fin.finish,
                fin.usage.completion,
                t0.elapsed().as_secs_f64()
            );
            if let Some(r) = &fin.reasoning {
                t.push_str(&format!("\nreasoning:\n{r}\n"));
            }
            if !fin.content.is_empty() {
                t.push_str(&format!("\ncontent:\n{}\n", fin.content));
            }
            for (i, c) in fin.calls.iter().enumerate() {
                t.push_str(&format!(
                    "\ntool_call[{i}]:\nid: {}\nname: {}\narguments:\n{}\n",
                    c.id, c.name, c.arguments
                ));
            }
            t.push_str(&format!("\n===== end request {} =====\n", self.request_seq));
            let _ = f.write_all(t.as_bytes());
        }
        eprintln!(
            "ds4-server: request {} {:?} stream={} prompt={} cached={} generated={} finish={:?} calls={} {:.2}s",
            self.request_seq,
            req.api,
            req.stream as u8,
            fin.usage.prompt,
            fin.usage.cached,
            fin.usage.completion,
            fin.finish,
            fin.calls.len(),
            t0.elapsed().as_secs_f64()
        );
        let _ = events.send(Event::Done(Box::new(fin)));
        Ok(())
    }

    /// Records the Responses / Anthropic protocol state of a finished turn.
    fn bind_protocol(
        &mut self,
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
        let live_len = self.sess.tokens().len();
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
                        render::canonical_dsml(&calls)
                    };
                    v.push_str(&block);
                }
                v.push_str(EOS);
                self.protocol = Some(ProtocolBinding {
                    api: Api::Responses,
                    ids,
                    visible: Some(v),
                    live_len,
                });
            }
            Api::Messages if !ids.is_empty() => {
                self.protocol = Some(ProtocolBinding {
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

/// Observer of one job: stop sequences, reasoning/text split, the text hold
/// while a tool block may be forming, DSML greedy structure, cancellation.
struct Stream<'c> {
    events: UnboundedSender<Event>,
    cache: &'c mut dyn KvCacheHook,
    /// The tool memory, for the KTM map of continued saves.
    tool_ids: &'c dyn ToolIds,
    tok: Arc<Tokenizer>,
    raw: Vec<u8>,
    /// Bytes of `raw` already given to the splitter.
    fed: usize,
    stop: Vec<String>,
    stop_hold: usize,
    scanned: usize,
    stop_hit: bool,
    split: ThinkSplit,
    thinking: bool,
    tools: bool,
    /// Visible text not sent yet (tool hold).
    pending: String,
    in_block: bool,
    /// Live tool-call streaming (chat and Anthropic only).
    live: Option<dsml::LiveTools>,
    live_enabled: bool,
    id_prefix: &'static str,
    rng: Rng,
    live_ids: Vec<String>,
    live_closed: Vec<bool>,
}

/// Bytes searched back for a forming tool marker (PROMPT.md §8).
const TOOL_HOLD_WINDOW: usize = 80;

impl<'c> Stream<'c> {
    fn new(
        req: &GenRequest,
        thinking: bool,
        events: UnboundedSender<Event>,
        cache: &'c mut dyn KvCacheHook,
        tool_ids: &'c dyn ToolIds,
        tok: Arc<Tokenizer>,
    ) -> Stream<'c> {
        let stop_hold = req.stop.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        Stream {
            events,
            cache,
            tool_ids,
            tok,
            raw: Vec::new(),
            fed: 0,
            stop: req.stop.clone(),
            stop_hold,
            scanned: 0,
            stop_hit: false,
            split: ThinkSplit::new(thinking),
            thinking,
            tools: req.chat_style() && req.tools_active(),
            pending: String::new(),
            in_block: false,
            live: None,
            live_enabled: matches!(req.api, Api::Chat | Api::Messages),
            id_prefix: if req.api == Api::Messages {
                "toolu_"
            } else {
                "call_"
            },
            rng: Rng::new(now_seed(0)),
            live_ids: Vec::new(),
            live_closed: Vec::new(),
        }
    }

    fn live_text(&mut self, t: &str) {
        let Some(lt) = self.live.as_mut() else { return };
        for ev in lt.push(t) {
            let e = match ev {
                dsml::ToolEvent::Start(name) => {
                    let id = format!("{}{}", self.id_prefix, random_hex(16, &mut self.rng));
                    self.live_ids.push(id.clone());
                    self.live_closed.push(false);
                    Event::ToolStart {
                        index: self.live_ids.len() - 1,
                        id,
                        name,
                    }
                }
                dsml::ToolEvent::Args(args) => Event::ToolArgs {
                    index: self.live_ids.len().saturating_sub(1),
                    args,
                },
                dsml::ToolEvent::End => {
                    if let Some(c) = self.live_closed.last_mut() {
                        *c = true;
                    }
                    Event::ToolEnd {
                        index: self.live_ids.len().saturating_sub(1),
                    }
                }
            };
            let _ = self.events.send(e);
        }
    }

    fn send_pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Reasoning(r) => {
                    let _ = self.events.send(Event::Reasoning(r));
                }
                Piece::Text(t) => self.text(t),
            }
        }
    }

    fn text(&mut self, t: String) {
        if !self.tools {
            let _ = self.events.send(Event::Text(t));
            return;
        }
        if self.in_block {
            self.live_text(&t);
            return;
        }
        self.pending.push_str(&t);
        if let Some((p, v)) = dsml::block_start(self.pending.as_bytes()) {
            let before = self.pending[..p].trim_end_matches(|c: char| c.is_ascii_whitespace());
            if !before.is_empty() {
                let _ = self.events.send(Event::Text(before.to_string()));
            }
            let open = dsml::block_open(v);
            let rest = self.pending[p..]
                .find(open)
                .map(|i| self.pending[p + i + open.len()..].to_string())
                .unwrap_or_default();
            self.pending.clear();
            self.in_block = true;
            if self.live_enabled {
                self.live = Some(dsml::LiveTools::new(v));
                self.live_text(&rest);
            }
            return;
        }
        // Hold trailing whitespace and a `<` near the end (a marker may form).
        let mut window = self.pending.len().saturating_sub(TOOL_HOLD_WINDOW);
        while !self.pending.is_char_boundary(window) {
            window -= 1;
        }
        let cut = match self.pending[window..].rfind('<') {
            Some(lt) => window + lt,
            None => self.pending.len(),
        };
        let keep = self.pending[..cut]
            .trim_end_matches(|c: char| c.is_ascii_whitespace())
            .len();
        if keep > 0 {
            let out: String = self.pending.drain(..keep).collect();
            let _ = self.events.send(Event::Text(out));
        }
    }

    fn flush(&mut self) {
        let rest = self.raw[self.fed..].to_vec();
        self.fed = self.raw.len();
        let mut pieces = self.split.push(&rest);
        pieces.extend(self.split.finish());
        self.send_pieces(pieces);
        if !self.in_block && !self.pending.is_empty() {
            let out = std::mem::take(&mut self.pending);
            let _ = self.events.send(Event::Text(out));
        }
    }

    /// A tool block closed after the reasoning: generation ends.
    fn block_closed(&self) -> bool {
        let region = if self.thinking {
            match self.raw.windows(8).rposition(|w| w == b"</think>") {
                Some(i) => &self.raw[i + 8..],
                None => return false,
            }
        } else {
            &self.raw[..]
        };
        match dsml::block_start(region) {
            Some((p, v)) => generate::find(&region[p..], dsml::block_close(v).as_bytes()).is_some(),
            None => false,
        }
    }
}

impl Observer for Stream<'_> {
    fn before_step(&mut self, sess: &Session) {
        // No continued save in the middle of a tool block (KVCACHE.md §5.2).
        if !(self.tools && self.in_block) {
            self.cache.before_decode(sess, &self.tok, self.tool_ids);
        }
    }

    fn greedy_next(&mut self) -> bool {
        self.tools && dsml::structural_position(&self.raw)
    }

    fn cancelled(&mut self) -> bool {
        self.events.is_closed()
    }

    fn token(&mut self, _id: u32, bytes: &[u8]) -> Step {
        let before = self.raw.len();
        self.raw.extend_from_slice(bytes);
        if !self.stop.is_empty() {
            let from = self.scanned.min(before).saturating_sub(self.stop_hold);
            let hit = self
                .stop
                .iter()
                .filter_map(|s| generate::find(&self.raw[from..], s.as_bytes()).map(|i| from + i))
                .min();
            self.scanned = self.raw.len();
            if let Some(at) = hit {
                self.raw.truncate(at);
                self.stop_hit = true;
                return Step::Stop;
            }
        }
        let safe = self.raw.len().saturating_sub(self.stop_hold).max(self.fed);
        let chunk = self.raw[self.fed..safe].to_vec();
        self.fed = safe;
        let pieces = self.split.push(&chunk);
        self.send_pieces(pieces);
        if self.tools && self.block_closed() {
            return Step::Stop;
        }
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::request::{parse_chat, ParseContext};

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "1970-01-01 00:00:00");
        assert_eq!(utc_stamp(1_767_225_600), "2026-01-01 00:00:00");
        assert_eq!(utc_stamp(951_827_696), "2000-02-29 12:34:56");
    }

    #[test]
    fn a_full_queue_is_503_with_retry_after() {
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let metrics = Arc::new(Metrics::default());
        let q = Queue {
            tx,
            metrics: metrics.clone(),
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

    #[test]
    fn tool_memory_is_bounded_and_replays_one_block() {
        let mut m = ToolMemory::default();
        let b = Arc::new("\n\n<｜DSML｜tool_calls>…".to_string());
        for i in 0..50 {
            m.insert(&format!("call_{i}"), b.clone(), 20);
        }
        assert!(m.map.len() <= 20);
        assert!(m.contains("call_49") && !m.contains("call_0"));
        assert_eq!(m.block_for(&["call_49", "call_48"]), Some(b.to_string()));
        m.insert("call_x", Arc::new("other".into()), 20);
        assert_eq!(m.block_for(&["call_49", "call_x"]), None);
    }

    #[test]
    fn tool_memory_takes_ktm_entries_back_and_lists_its_pairs() {
        let e = |id: &[u8], dsml: &[u8]| KtmEntry {
            id: id.to_vec(),
            dsml: dsml.to_vec(),
        };
        let mut m = ToolMemory::default();
        let n = m.restore(
            vec![
                e(b"call_a", b"<tool_calls>1</tool_calls>"),
                e(b"call_b", b"<tool_calls>1</tool_calls>"),
                e(b"call_c", b"\xff not utf-8"),
                e(b"\xfe", b"<tool_calls>2</tool_calls>"),
            ],
            20,
        );
        assert_eq!(n, 2);
        assert!(Arc::ptr_eq(&m.map["call_a"].0, &m.map["call_b"].0));
        assert_eq!(
            m.block_for(&["call_a", "call_b"]).as_deref(),
            Some("<tool_calls>1</tool_calls>")
        );
        let mut pairs = Vec::new();
        m.for_each_tool_id(&mut |id, b| pairs.push((id.to_vec(), b.to_vec())));
        pairs.sort();
        assert_eq!(
            pairs,
            vec![
                (b"call_a".to_vec(), b"<tool_calls>1</tool_calls>".to_vec()),
                (b"call_b".to_vec(), b"<tool_calls>1</tool_calls>".to_vec()),
            ]
        );
    }
}
