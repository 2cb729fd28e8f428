//! The one engine thread: it owns the session (one live KV slot), the tool
//! memory and every reuse decision, takes jobs strictly in arrival order from
//! a bounded queue and sends each job's output back over the job's channel.
//! HTTP handlers never touch the engine, so engine work never blocks tokio.
//!
//! Here: the queue the HTTP layer submits to ([`Queue`], [`start`], and
//! `spawn`, which the slot scheduler shares) and the serial loop. A job runs
//! in four phases, `admit → prefill → decode → finish`, under
//! `catch_unwind`: a panic fails that job alone and resets the session.
//! The phases' shared half is `core.rs` (`Core`, `Admitted`, `Prefilled`)
//! and `finish.rs` (`Decoded`, the finish phase); the job contract is in
//! `job.rs`, the reuse decision in `plan.rs`, the tool memory and bindings
//! in `memory.rs`, the token observer in `stream.rs`, `--trace` in
//! `trace.rs`, liveness and caught panics in `health.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use super::core::{tool_ids, visible_at, Admitted, Bindings, Core, Prefilled};
use super::error::ApiError;
use super::finish::Decoded;
use super::health::{panic_message, AliveGuard, WorkerHealth};
use super::job::{Event, Job, KvCacheHook, Work};
use super::metrics::Metrics;
use super::request::GenRequest;
use super::scoring::JobLogprobs;
use super::stream::{Stream, WithCache};
use super::trace::Trace;
use crate::generate::{self, TokenPicker};
use crate::session::Session;
use crate::speculate::Speculator;
use crate::tokenizer::Tokenizer;

pub use super::core::WorkerConfig;

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

/// Starts the worker thread; `bound` is the queue length. With `spec`,
/// speculative decoding drafts for every request (issue 35); its policy
/// and counters live as long as the worker, so the measured step costs and
/// acceptance carry from request to request.
pub fn start(
    sess: Session,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    metrics: Arc<Metrics>,
    bound: usize,
    cache: Box<dyn KvCacheHook>,
    spec: Option<Speculator>,
) -> Queue {
    metrics.slots.store(1, Ordering::Relaxed);
    spawn(metrics, bound, move |rx, core_parts| {
        let core = core_parts.into_core(tok, cfg, cache);
        Worker {
            sess,
            core,
            live: Bindings::default(),
            spec,
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

struct Worker {
    sess: Session,
    core: Core,
    live: Bindings,
    /// Speculative decoding, when on.
    spec: Option<Speculator>,
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
        let before = self.spec.as_ref().map(|s| s.stats()).unwrap_or_default();
        let outcome = generate::generate_with(
            &mut self.sess,
            &c.tok,
            max_new,
            &mut picker,
            &mut obs,
            self.spec.as_mut(),
        );
        let gen_s = t1.elapsed().as_secs_f64();
        let spec = self
            .spec
            .as_ref()
            .map(|s| s.stats().since(&before))
            .unwrap_or_default();
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
        let d = self
            .core
            .decoded(
                &mut stream,
                tokens.len(),
                finish,
                thinking,
                grammar_open,
                logprobs,
                gen_s,
                p.t_prefill.as_secs_f64(),
            )
            .with_spec(spec, &self.core.metrics);
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
