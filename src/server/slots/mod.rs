//! The slot scheduler of `--batched-session N` (N > 1): one engine thread,
//! one [`Batch`] of N KV slots, and a loop of steps in which every active
//! slot contributes one piece: a decode slot its next token, a prefilling
//! slot the next `--mixed-prefill-quantum` tokens of its prompt. So a long
//! prompt never stalls the streams of the other slots for more than one
//! quantum per step, and each slot's rows see exactly the piece sizes they
//! would see alone, which with the engine's batch invariance makes every
//! stream bit-identical to the same request served alone.
//!
//! A job goes `admit` (render, tokenize, the context check: a prompt over
//! `--ctx` is refused here, before it takes a slot) → wait for a free slot
//! (FIFO; it still counts in the queue depth) → `assign` (the free slot
//! whose live tokens and bindings reuse most, else the least recently
//! used; the reuse rules are the serial worker's, `Core::plan_live` in
//! `core.rs`) → prefill pieces → decode steps → `finish` (the serial
//! worker's, `finish.rs`, with the slot's own bindings). A job whose client
//! leaves, whose context fills or that hits a stop sequence frees its slot
//! at once.
//!
//! Faults stay with their slot: a panic in a slot's own work fails that job
//! alone; a failed engine step (the engine resets the slots of that step)
//! is retried slot by slot, each slot first brought back by replaying its
//! own pieces, so the slots that did not fail continue bit-identically and
//! only the one whose piece fails again reports an error.
//!
//! Here: the scheduler's loop, admission and the choice of a slot; the
//! engine step, its recovery and a job's end are `step.rs`.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::core::{
    missing_tool_ids, tool_ids, visible_at, Admitted, Bindings, Core, Prefilled, WorkerConfig,
};
use super::health::panic_message;
use super::job::{Event, NoCache, Work};
use super::logprobs::{first_prompt_entry, TokenLogprob};
use super::metrics::Metrics;
use super::scoring::{JobLogprobs, PickScorer};
use super::slotdisk::SlotDisk;
use super::stream::Stream;
use super::worker::{self, Queue};
use crate::generate::TokenPicker;
use crate::kvcache::SaveReason;
use crate::session::Batch;
use crate::tokenizer::Tokenizer;

mod step;

/// ds4's `--mixed-prefill-quantum` default: prompt tokens a prefilling
/// slot adds per step.
pub const DEFAULT_PREFILL_QUANTUM: usize = 128;

/// Settings of the slot scheduler beyond the worker's.
#[derive(Clone, Debug)]
pub struct SlotConfig {
    /// Prompt tokens per prefill piece (`--mixed-prefill-quantum`).
    pub prefill_quantum: usize,
    /// Test hook (`--debug-fail-prefill-on-prompt`): the engine step that
    /// carries a prefill piece of a job whose rendered prompt contains this
    /// text fails as a backend failure would (the step's slots are reset).
    pub debug_fail_prefill_on_prompt: Option<String>,
}

/// Starts the scheduler thread over `batch`; `bound` is the queue length;
/// `disk` is the disk KV cache (`--kv-disk-dir`), if any.
pub fn start(
    batch: Batch,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    slot_cfg: SlotConfig,
    metrics: Arc<Metrics>,
    bound: usize,
    disk: Option<SlotDisk>,
) -> Queue {
    let n = batch.slots();
    metrics.slots.store(n, Ordering::Relaxed);
    worker::spawn(metrics, bound, move |rx, parts| {
        Scheduler {
            core: parts.into_core(tok, cfg, Box::new(NoCache)),
            disk,
            slots: (0..n).map(|_| Slot::default()).collect(),
            batch,
            pending: VecDeque::new(),
            quantum: slot_cfg.prefill_quantum.max(1),
            fail_marker: slot_cfg.debug_fail_prefill_on_prompt,
            tick: 0,
        }
        .run(rx)
    })
}

/// The effective prompt, the cached count and the reuse rule's name.
type Plan = (Vec<u32>, usize, &'static str);

struct Scheduler {
    batch: Batch,
    core: Core,
    disk: Option<SlotDisk>,
    slots: Vec<Slot>,
    /// Admitted jobs waiting for a free slot, in arrival order.
    pending: VecDeque<Admitted>,
    quantum: usize,
    fail_marker: Option<String>,
    /// Use counter for the least-recently-used choice.
    tick: u64,
}

#[derive(Default)]
struct Slot {
    /// The bindings of the turn the slot's KV holds.
    live: Bindings,
    last_used: u64,
    /// The piece sizes that built the slot's KV since its last reset, and
    /// its tokens: what a replay after a failed step runs again.
    pieces: Vec<usize>,
    tokens: Vec<u32>,
    /// The KV began as a disk checkpoint: a replay cannot rebuild it.
    from_disk: bool,
    job: Option<Running>,
}

enum Running {
    Prefill(Box<Prefilling>),
    Decode(Box<Decoding>),
}

struct Prefilling {
    a: Admitted,
    eff: Vec<u32>,
    cached: usize,
    /// Tokens of `eff` already in the slot.
    done: usize,
    /// Disk-cache save points ahead (ascending): pieces end there.
    stops: Vec<(usize, SaveReason)>,
    /// This job's pieces fail (`--debug-fail-prefill-on-prompt`).
    poisoned: bool,
    /// Completions `echo` with `logprobs`: the prompt's entries so far
    /// (each piece runs with the logits of every row; the slot starts
    /// empty, as `Session::score` does).
    scored: Option<Vec<TokenLogprob>>,
}

struct Decoding {
    p: Prefilled,
    stream: Stream,
    picker: Box<dyn TokenPicker>,
    thinking: bool,
    max_new: usize,
    generated: usize,
    t1: Instant,
    /// The observer asked to stop after the token now being evaluated.
    stop_after: bool,
    /// Scores each pick (`logprobs`), as the serial worker's recorder.
    scorer: PickScorer,
}

/// What a slot puts into the coming step.
#[derive(Clone, Copy)]
enum Piece {
    Prefill { n: usize },
    Decode { token: u32 },
}

impl Scheduler {
    fn run(mut self, rx: Receiver<Work>) {
        let mut shutdown: Option<Sender<()>> = None;
        loop {
            let busy = !self.pending.is_empty() || self.slots.iter().any(|s| s.job.is_some());
            if !busy {
                if let Some(ack) = shutdown.take() {
                    self.shutdown();
                    let _ = ack.send(());
                    return;
                }
                match rx.recv() {
                    Ok(w) => self.take(w, &mut shutdown),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(w) => self.take(w, &mut shutdown),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if !busy => return,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.assign();
            self.step();
            let active = self.slots.iter().filter(|s| s.job.is_some()).count();
            self.core
                .metrics
                .active_slots
                .store(active, Ordering::Relaxed);
        }
    }

    /// A job off the queue: admitted (rendered, tokenized, its context
    /// checked) at once, so a prompt over `--ctx` is refused without
    /// waiting for a slot; then it waits in `pending`.
    fn take(&mut self, w: Work, shutdown: &mut Option<Sender<()>>) {
        let job = match w {
            Work::Gen(job) => *job,
            Work::Shutdown(ack) => {
                *shutdown = Some(ack);
                return;
            }
        };
        if job.events.is_closed() {
            // The client left while queued: nothing to do.
            self.dequeued();
            return;
        }
        self.core.request_seq += 1;
        let seq = self.core.request_seq;
        let events = job.events.clone();
        let ctx = self.batch.ctx();
        let live: Vec<&Bindings> = self.slots.iter().map(|s| &s.live).collect();
        let core = &mut self.core;
        let disk = &mut self.disk;
        let admit = || {
            if let (Some(disk), true) = (disk.as_mut(), core.cfg.exact_replay) {
                // KVCACHE.md §7: ids the tool memory lacks, from the disk.
                let missing = missing_tool_ids(&job.req, &core.memory);
                if !missing.is_empty() {
                    let found = disk.prefetch_tool_ids(&|id: &[u8]| {
                        std::str::from_utf8(id).is_ok_and(|id| missing.contains(id))
                    });
                    core.memory.restore(found, core.cfg.tool_memory_max_ids);
                }
            }
            core.admit(job, ctx, &live)
        };
        match catch_unwind(AssertUnwindSafe(admit)) {
            Ok(Some(a)) => self.pending.push_back(a),
            Ok(None) => self.dequeued(),
            Err(payload) => {
                self.dequeued();
                self.panicked(seq, &*payload, &events);
            }
        }
    }

    /// After the last request: every slot's shutdown checkpoint.
    fn shutdown(&mut self) {
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        let c = &self.core;
        let tools = tool_ids(&c.cfg, &c.memory);
        for (i, s) in self.slots.iter().enumerate() {
            let visible = visible_at(&s.live, s.tokens.len());
            let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
            disk.shutdown(&self.batch, i, &c.tok, v, tools);
        }
    }

    fn dequeued(&self) {
        self.core.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
    }

    fn panicked(
        &self,
        seq: u64,
        payload: &(dyn std::any::Any + Send),
        events: &UnboundedSender<Event>,
    ) {
        let msg = panic_message(payload);
        self.core.health.record_panic(msg.clone(), seq);
        crate::log_line!(
            "ds4-server: request {seq} failed: the worker panicked ({msg}); its slot was reset"
        );
        let _ = events.send(Event::Failed(format!(
            "internal error: the server failed on this request ({msg}); its session was reset"
        )));
    }

    /// Free slots take waiting jobs in arrival order.
    fn assign(&mut self) {
        while let Some(front) = self.pending.front() {
            if front.events.is_closed() {
                self.pending.pop_front();
                self.dequeued();
                continue;
            }
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].job.is_none())
                .collect();
            if free.is_empty() {
                return;
            }
            let Some(a) = self.pending.pop_front() else {
                return;
            };
            self.dequeued();
            let seq = a.seq;
            let events = a.events.clone();
            let r = catch_unwind(AssertUnwindSafe(|| self.place(a, &free)));
            if let Err(payload) = r {
                // A free slot whose KV no longer matches what describes it
                // (a disk load cut short) is emptied; the others keep
                // their content for reuse.
                for &i in &free {
                    let s = &self.slots[i];
                    if s.job.is_none() && self.batch.tokens(i) != s.tokens.as_slice() {
                        self.clear(i);
                    }
                }
                self.panicked(seq, &*payload, &events);
            }
        }
    }

    /// The reuse plan against every free slot; the job takes the slot that
    /// reuses most (else an empty one, else the least recently used).
    fn place(&mut self, a: Admitted, free: &[usize]) {
        let ctx = self.batch.ctx();
        if a.req.scoring.raw_prompt() {
            return self.place_raw(a, free);
        }
        let mut best: Option<(usize, Plan)> = None;
        for &i in free {
            let live = self.slots[i].tokens.clone();
            if let Ok(p) =
                self.core
                    .plan_live(&a.req, &a.text, a.full.clone(), &live, &self.slots[i].live)
            {
                if p.0.len() < ctx && best.as_ref().is_none_or(|b| p.1 > b.1 .1) {
                    best = Some((i, p));
                }
            }
        }
        let (slot, (eff, cached, source)) = match best {
            Some(b) => b,
            None => {
                let i = *free
                    .iter()
                    .min_by_key(|&&i| (!self.slots[i].tokens.is_empty(), self.slots[i].last_used))
                    .expect("a free slot");
                (i, self.plan_cold(i, &a))
            }
        };
        self.start_prefill(a, slot, (eff, cached, source));
    }

    /// A job whose prompt is the client's own tokens (`echo`, token ids):
    /// that prompt as is, nothing reported cached (as the serial worker).
    /// It continues the free slot holding the longest prefix of it, except
    /// when its prompt is scored: that needs every row's logits, so it
    /// starts on an empty slot.
    fn place_raw(&mut self, a: Admitted, free: &[usize]) {
        let scores = a.req.scoring.echo && a.req.scoring.top.is_some();
        let prefix = |t: &[u32]| !t.is_empty() && t.len() < a.full.len() && a.full.starts_with(t);
        let reuse = free
            .iter()
            .copied()
            .filter(|&i| !scores && prefix(&self.slots[i].tokens))
            .max_by_key(|&i| self.slots[i].tokens.len());
        let slot = reuse.unwrap_or_else(|| {
            *free
                .iter()
                .min_by_key(|&&i| (!self.slots[i].tokens.is_empty(), self.slots[i].last_used))
                .expect("a free slot")
        });
        if reuse.is_none() {
            self.clear(slot);
        }
        let full = a.full.clone();
        self.start_prefill(a, slot, (full, 0, "none"));
    }

    /// The job takes `slot` with its plan: accepted (or refused), then its
    /// prefill (or, with the whole prompt live, its decode) begins.
    fn start_prefill(&mut self, a: Admitted, slot: usize, (eff, cached, source): Plan) {
        let live_before = self.slots[slot].tokens.len();
        if !self.core.accept(&a, eff.len(), cached, source, live_before) {
            return;
        }
        self.tick += 1;
        let s = &mut self.slots[slot];
        s.last_used = self.tick;
        // Any binding not used by this request is cleared.
        s.live = Bindings::default();
        // The KV continues only from a whole prefix of the new prompt
        // (compressor frontiers cannot be rewound), as `Session::sync`.
        if !(eff.starts_with(&s.tokens) && s.tokens.len() <= eff.len()) {
            self.clear(slot);
        }
        let done = self.slots[slot].tokens.len();
        self.core
            .metrics
            .evaluated_prompt_tokens
            .fetch_add((eff.len() - done) as u64, Ordering::Relaxed);
        let poisoned = self
            .fail_marker
            .as_deref()
            .is_some_and(|m| a.text.contains(m));
        let stops = match &self.disk {
            Some(d) => d.stops(&self.core.tok, &eff, cached, done),
            None => Vec::new(),
        };
        let scored = match (a.req.scoring.echo, a.req.scoring.top) {
            // The slot was emptied for it (`place_raw`).
            (true, Some(_)) => Some(vec![first_prompt_entry(&self.core.tok, eff[0])]),
            _ => None,
        };
        let job = Prefilling {
            a,
            eff,
            cached,
            done,
            stops,
            poisoned,
            scored,
        };
        let running = if job.done == job.eff.len() && !job.eff.is_empty() {
            // The whole prompt is live already: its logits are current.
            self.start_decode(job)
        } else {
            Some(Running::Prefill(Box::new(job)))
        };
        self.slots[slot].job = running;
    }

    /// Rules 7 and 8 for slot `i`: a disk checkpoint (the slot's content
    /// saved first, as an evict), or the request's own tokens.
    fn plan_cold(&mut self, i: usize, a: &Admitted) -> Plan {
        let Some(disk) = self.disk.as_mut() else {
            return (a.full.clone(), 0, "none");
        };
        let c = &mut self.core;
        let s = &mut self.slots[i];
        let visible = visible_at(&s.live, s.tokens.len());
        let v = visible.as_ref().map(|(t, k)| (t.as_bytes(), *k));
        let tools = tool_ids(&c.cfg, &c.memory);
        let hit = disk.resume(&mut self.batch, i, &c.tok, &a.text, v, tools);
        if self.batch.tokens(i) != s.tokens.as_slice() {
            // Loaded (or emptied by a failed load): what was live is gone.
            s.tokens = self.batch.tokens(i).to_vec();
            s.pieces.clear();
            s.live = Bindings::default();
            s.from_disk = !s.tokens.is_empty();
        }
        match hit {
            Some(hit) => {
                if c.cfg.exact_replay {
                    c.memory.restore(hit.tool_map, c.cfg.tool_memory_max_ids);
                }
                (hit.effective, hit.cached, "disk-text")
            }
            None => (a.full.clone(), 0, "none"),
        }
    }

    /// Empties a slot's KV and what describes it.
    fn clear(&mut self, slot: usize) {
        self.batch.reset(slot);
        let s = &mut self.slots[slot];
        s.tokens.clear();
        s.pieces.clear();
        s.from_disk = false;
        s.live = Bindings::default();
    }

    /// The job's decode phase; `None` (the slot is free) when its picker
    /// cannot be built (a grammar the engine refused), reported to its client.
    fn start_decode(&mut self, job: Prefilling) -> Option<Running> {
        let Prefilling {
            a,
            eff,
            cached,
            scored,
            ..
        } = job;
        let ctx = self.batch.ctx();
        let mut lp = JobLogprobs::new(&a.req);
        if a.req.scoring.echo {
            lp.echoed(&self.core.tok, &eff, scored, &a.events);
        }
        let mut p = a.prefilled(eff.len(), cached, lp);
        let thinking = p.req.chat_style() && p.req.mode.thinks();
        let max_new = self.core.max_new(&p.req, ctx, p.prompt);
        let picker = match self.core.picker(&p.req, &mut p.ids, thinking) {
            Ok(picker) => picker,
            Err(e) => {
                let _ = p.events.send(Event::Failed(e));
                return None;
            }
        };
        let stream = Stream::new(
            &p.req,
            thinking,
            p.events.clone(),
            self.core.tok.clone(),
            p.seq,
        );
        let scorer =
            p.lp.pick_scorer(self.core.tok.clone(), thinking, p.events.clone());
        Some(Running::Decode(Box::new(Decoding {
            p,
            stream,
            picker,
            thinking,
            max_new,
            generated: 0,
            t1: Instant::now(),
            stop_after: false,
            scorer,
        })))
    }
}
