//! The slot scheduler's engine step: each active slot's piece (a prefill
//! quantum or its next sampled token), one `Batch::step` for all, then each
//! slot's bookkeeping (its tokens, scored prompt rows, disk-cache save
//! points, the move from prefill to decode, the finish). A failed step is
//! recovered slot by slot (`recover`, `replay`); a panic in a slot's own
//! work fails that job alone (`fail_panicked`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::{Decoding, Piece, Running, Scheduler};
use crate::generate::{Finish, Observer, Step};
use crate::server::core::tool_ids;
use crate::server::health::panic_message;
use crate::server::job::Event;
use crate::server::logprobs::score_following;
use crate::session::{SessionError, SlotWork};

impl Scheduler {
    /// One engine step: every active slot's piece, then the bookkeeping.
    pub(super) fn step(&mut self) {
        let mut plan: Vec<(usize, Piece)> = Vec::new();
        for i in 0..self.slots.len() {
            match catch_unwind(AssertUnwindSafe(|| self.piece(i))) {
                Ok(Some(p)) => plan.push((i, p)),
                Ok(None) => {}
                Err(payload) => self.fail_panicked(i, &*payload),
            }
        }
        if plan.is_empty() {
            return;
        }
        let m = &self.core.metrics;
        let rows: usize = plan
            .iter()
            .map(|(i, p)| match p {
                Piece::Prefill { n } => self.prefill_tokens(*i, *n).len(),
                Piece::Decode { .. } => 1,
            })
            .sum();
        let prefills = plan
            .iter()
            .filter(|(_, p)| matches!(p, Piece::Prefill { .. }))
            .count();
        m.record_step(plan.len(), rows, prefills > 0 && prefills < plan.len());
        let poisoned = plan
            .iter()
            .any(|(i, p)| matches!(p, Piece::Prefill { .. }) && self.poisoned(*i));
        let r = self.run_step(&plan, poisoned);
        if let Some(st) = self.batch.engram_stats() {
            self.core.metrics.record_engram(st);
        }
        match r {
            Ok(()) => {
                for (i, p) in plan {
                    self.after(i, p);
                }
            }
            Err(e) => self.recover(plan, e),
        }
    }

    fn poisoned(&self, i: usize) -> bool {
        matches!(&self.slots[i].job, Some(Running::Prefill(j)) if j.poisoned)
    }

    /// The slot's prefill pieces keep every row's logits (prompt scoring).
    fn scores_prompt(&self, i: usize) -> bool {
        matches!(&self.slots[i].job, Some(Running::Prefill(j)) if j.scored.is_some())
    }

    /// The next prompt tokens of a prefilling slot.
    fn prefill_tokens(&self, i: usize, n: usize) -> &[u32] {
        match &self.slots[i].job {
            Some(Running::Prefill(j)) => &j.eff[j.done..j.done + n],
            _ => &[],
        }
    }

    /// The engine step over `plan`; `poisoned` fails it as a backend
    /// failure would (the test hook).
    fn run_step(&mut self, plan: &[(usize, Piece)], poisoned: bool) -> Result<(), SessionError> {
        let tokens: Vec<Vec<u32>> = plan
            .iter()
            .map(|(i, p)| match p {
                Piece::Prefill { n } => self.prefill_tokens(*i, *n).to_vec(),
                Piece::Decode { token } => vec![*token],
            })
            .collect();
        if poisoned {
            for (i, _) in plan {
                self.batch.reset(*i);
            }
            return Err(SessionError::Batch(
                "injected prefill failure (--debug-fail-prefill-on-prompt)".into(),
            ));
        }
        let work: Vec<SlotWork<'_>> = plan
            .iter()
            .zip(&tokens)
            .map(|((i, p), t)| SlotWork {
                slot: *i,
                tokens: t,
                all_logits: matches!(p, Piece::Prefill { .. }) && self.scores_prompt(*i),
            })
            .collect();
        let batch = &mut self.batch;
        match catch_unwind(AssertUnwindSafe(|| batch.step(&work))) {
            Ok(r) => r,
            Err(payload) => {
                for (i, _) in plan {
                    self.batch.reset(*i);
                }
                Err(SessionError::Batch(format!(
                    "the engine step panicked ({})",
                    panic_message(&*payload)
                )))
            }
        }
    }

    /// A failed step: each slot of it is brought back (its own pieces
    /// replayed when the engine reset it) and its piece retried alone; a
    /// slot whose replay or piece fails again fails its job alone.
    fn recover(&mut self, plan: Vec<(usize, Piece)>, first: SessionError) {
        crate::log_line!(
            "ds4-server: a step of {} slots failed ({first}); retrying its slots one by one",
            plan.len()
        );
        for (i, p) in plan {
            let poisoned = matches!(p, Piece::Prefill { .. }) && self.poisoned(i);
            let r = self
                .replay(i)
                .and_then(|()| self.run_step(&[(i, p)], poisoned));
            match r {
                Ok(()) => self.after(i, p),
                Err(e) => {
                    let s = &mut self.slots[i];
                    if let Some(job) = s.job.take() {
                        let events = match &job {
                            Running::Prefill(j) => j.a.events.clone(),
                            Running::Decode(d) => d.p.events.clone(),
                        };
                        let _ = events.send(Event::Failed(e.to_string()));
                    }
                    self.clear(i);
                }
            }
        }
    }

    /// Brings a slot the engine reset back to its tokens by running its
    /// pieces again, alone, with the sizes they had (so its logits are
    /// bit-identical to before).
    fn replay(&mut self, i: usize) -> Result<(), SessionError> {
        if self.batch.tokens(i).len() == self.slots[i].tokens.len() {
            return Ok(());
        }
        if self.slots[i].from_disk {
            return Err(SessionError::Batch(
                "the slot's state came from a disk checkpoint and cannot be rebuilt".into(),
            ));
        }
        self.batch.reset(i);
        let s = &self.slots[i];
        let (tokens, pieces) = (s.tokens.clone(), s.pieces.clone());
        let mut at = 0;
        for n in pieces {
            self.batch.step(&[SlotWork {
                slot: i,
                tokens: &tokens[at..at + n],
                all_logits: false,
            }])?;
            at += n;
        }
        Ok(())
    }

    /// What slot `i` puts into the step (or `None`: idle, or its job ended
    /// before the step — EOS, the token limit, a full context, a client
    /// that left).
    fn piece(&mut self, i: usize) -> Option<Piece> {
        let ctx = self.batch.ctx();
        let eos = self.core.tok.specials().eos;
        let quantum = self.quantum;
        let live_len = self.slots[i].tokens.len();
        let job = self.slots[i].job.as_mut()?;
        match job {
            Running::Prefill(j) => {
                if j.a.events.is_closed() {
                    // The client left during prefill: the slot is free now;
                    // its KV (a prefix of the prompt) stays for reuse.
                    self.slots[i].job = None;
                    self.core.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                let to = j.stops.first().map_or(j.eff.len(), |&(b, _)| b);
                let n = quantum.min(to - j.done);
                Some(Piece::Prefill { n })
            }
            Running::Decode(d) => {
                // The serial loop of `generate::generate`, one token a step.
                if d.generated >= d.max_new {
                    self.end(i, Finish::Length);
                    return None;
                }
                if d.stream.cancelled() {
                    self.end(i, Finish::Cancelled);
                    return None;
                }
                if let Some(disk) = self.disk.as_mut().filter(|_| !d.stream.in_tool_block()) {
                    // Continued saves; none inside a tool block (KVCACHE.md §5.2).
                    let c = &self.core;
                    let tools = tool_ids(&c.cfg, &c.memory);
                    disk.before_decode(&self.batch, i, &c.tok, tools);
                }
                let greedy = d.stream.greedy_next();
                let logits = self.batch.logits(i);
                let next = d.picker.pick(logits, greedy);
                if d.picker.dead_end() {
                    // The grammar has no token left: a `length` finish.
                    self.end(i, Finish::Length);
                    return None;
                }
                // As the serial recorder: every kept pick, the EOS included.
                d.scorer.record(logits, next);
                if next == eos {
                    self.end(i, Finish::Eos);
                    return None;
                }
                d.generated += 1;
                let bytes = d.stream.token_bytes(next).to_vec();
                let step = d.stream.token(next, &bytes);
                if live_len + 1 >= ctx {
                    self.end(i, Finish::Length);
                    return None;
                }
                d.stop_after = step == Step::Stop;
                Some(Piece::Decode { token: next })
            }
        }
    }

    /// After a successful step: the slot's tokens, and the job's next phase.
    fn after(&mut self, i: usize, p: Piece) {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let added: Vec<u32> = match &p {
                Piece::Prefill { n } => self.prefill_tokens(i, *n).to_vec(),
                Piece::Decode { token } => vec![*token],
            };
            let s = &mut self.slots[i];
            s.pieces.push(added.len());
            s.tokens.extend_from_slice(&added);
            match s.job.take() {
                Some(Running::Prefill(mut j)) => {
                    if let Some(entries) = j.scored.as_mut() {
                        // Row k of the piece predicts the token after it.
                        let next = &j.eff[j.done + 1..(j.done + added.len() + 1).min(j.eff.len())];
                        let (tok, vocab) = (&self.core.tok, self.batch.model().n_vocab());
                        let k = j.a.req.scoring.top.unwrap_or(0);
                        let rows = self.batch.piece_logits(i);
                        entries.extend(score_following(tok, rows, vocab, next, k));
                    }
                    j.done += added.len();
                    if j.stops.first().is_some_and(|&(b, _)| b == j.done) {
                        let (_, reason) = j.stops.remove(0);
                        if let Some(disk) = self.disk.as_mut() {
                            let c = &self.core;
                            let tools = tool_ids(&c.cfg, &c.memory);
                            disk.at_stop(&self.batch, i, &c.tok, reason, tools);
                        }
                    }
                    let next = if j.done == j.eff.len() {
                        self.start_decode(*j)
                    } else {
                        Some(Running::Prefill(j))
                    };
                    self.slots[i].job = next;
                }
                Some(Running::Decode(d)) => {
                    let stop = d.stop_after;
                    s.job = Some(Running::Decode(d));
                    if stop {
                        self.end(i, Finish::Stopped);
                    }
                }
                None => {}
            }
        }));
        if let Err(payload) = r {
            self.fail_panicked(i, &*payload);
        }
    }

    /// The end of a decoding job: the serial worker's finish with this
    /// slot's bindings; the slot is free at once.
    fn end(&mut self, i: usize, finish: Finish) {
        let Some(Running::Decode(d)) = self.slots[i].job.take() else {
            return;
        };
        let Decoding {
            p,
            mut stream,
            mut picker,
            thinking,
            generated,
            t1,
            scorer,
            ..
        } = *d;
        let gen_s = t1.elapsed().as_secs_f64();
        let grammar_open = picker.unfinished();
        let d = self.core.decoded(
            &mut stream,
            generated,
            finish,
            thinking,
            grammar_open,
            scorer.entries,
            gen_s,
            p.t_prefill.as_secs_f64(),
        );
        if d.stop_hit {
            // The KV holds tokens past the cut: it no longer matches the text.
            self.clear(i);
        }
        let live_len = self.slots[i].tokens.len();
        self.core.finish(p, d, &mut self.slots[i].live, live_len);
    }

    /// A panic in a slot's own work: that job fails, its slot is reset.
    fn fail_panicked(&mut self, i: usize, payload: &(dyn std::any::Any + Send)) {
        let job = self.slots[i].job.take();
        let _ = catch_unwind(AssertUnwindSafe(|| self.clear(i)));
        let Some(job) = job else { return };
        let (seq, events) = match &job {
            Running::Prefill(j) => (j.a.seq, j.a.events.clone()),
            Running::Decode(d) => (d.p.seq, d.p.events.clone()),
        };
        self.panicked(seq, payload, &events);
    }
}
