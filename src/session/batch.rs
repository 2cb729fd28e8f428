//! Several sessions on one model: N KV slots, and steps that carry the rows
//! of several slots at once (issue 18). A slot is a [`Session`]-like
//! sequence (tokens, logits, KV state); [`Batch::step`] appends one piece of
//! tokens to each listed slot.
//!
//! Batch invariance: a slot's logits are bit-identical to the same tokens
//! run alone (`slots = 1`, the same piece sizes), whatever else is in the
//! step.
//!
//! Engines: on a backend that holds several state sets (the CPU backends)
//! one step runs the rows of every listed slot through one pass of the
//! graph ([`Backend::run_rows`]): each weight is read once per step for all
//! rows, the position-dependent ops run per slot against the slot's own state
//! set. A piece longer than the chunk ([`SessionOptions::prefill_chunk`],
//! at most [`MAX_CHUNK`]) runs as chunks of that size in successive passes,
//! at most one chunk per slot per pass, so a slot's rows meet the kernels in
//! the same pieces whatever else runs. Backends with one state set, and
//! V4.1 models (whose forward pass is not recorded over several state sets
//! yet), run one [`Session`] per slot, one after another: the same results
//! as alone, the slots served in turn, no weight read shared.

use std::sync::Arc;

use super::net::{Frame, Loading, Net, Saving};
use super::{open_net, Session, SessionError, SessionOptions};
use crate::backend::{self, Backend, BackendKind, GraphHandle};
use crate::graph::{RowRecord, ValueId};
use crate::model::logits::Logits;
use crate::model::v41::engram_reader::EngramStats;
use crate::model::{AnyModel, ModelFile};

/// What one slot does in a step: append `tokens` to its sequence (1 for
/// decode, up to the prefill quantum for a prefill piece).
#[derive(Clone, Copy, Debug)]
pub struct SlotWork<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    /// Keep the logits of every row of this piece (prompt scoring, `echo`);
    /// otherwise only the last row's logits are kept.
    pub all_logits: bool,
}

/// The longest chunk of one slot in one pass: bounds the pass's activations
/// (with `all_logits`, logits of every row: rows × vocab floats).
pub const MAX_CHUNK: usize = 256;

/// N KV slots on one model.
pub struct Batch {
    model: AnyModel,
    opts: SessionOptions,
    engine: Engine,
    backend_notice: String,
}

enum Engine {
    /// One backend with a state set per slot.
    Shared(Box<Shared>),
    /// A session per slot, run one after another.
    Serial(Vec<SerialSlot>),
}

struct Shared {
    net: Box<dyn Net>,
    backend: Box<dyn Backend>,
    vocab: usize,
    /// Logits of each slot's last row, in the slot's row
    /// ([`Logits::LastPerState`]); capacity `slots` (decode passes) and
    /// `slots + chunk` (passes with prefill chunks).
    small: (GraphHandle, usize, ValueId),
    large: (GraphHandle, usize, ValueId),
    /// Logits at every row, capacity `slots + chunk`: the passes that hold
    /// an `all_logits` piece. Loaded at the first such pass.
    every_row: Option<(GraphHandle, usize, ValueId)>,
    chunk: usize,
    slots: Vec<SlotData>,
}

#[derive(Default)]
struct SlotData {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    piece_logits: Vec<f32>,
}

struct SerialSlot {
    session: Session,
    piece_logits: Vec<f32>,
}

impl Batch {
    /// N slots on a V4 model: the shared engine where the backend holds
    /// several state sets, a session per slot otherwise.
    pub fn new(
        model: Arc<ModelFile>,
        opts: SessionOptions,
        slots: usize,
    ) -> Result<Batch, SessionError> {
        Self::open_any(&AnyModel::V4(model), opts, slots)
    }

    /// N slots on a model of either family (a V4.1 model: a session per
    /// slot, see the module note).
    pub fn open_any(
        model: &AnyModel,
        opts: SessionOptions,
        slots: usize,
    ) -> Result<Batch, SessionError> {
        if slots == 0 {
            return Err(SessionError::Batch(
                "a batch needs at least one slot".into(),
            ));
        }
        let chunk = opts.prefill_chunk.clamp(1, MAX_CHUNK.min(opts.ctx.max(1)));
        let opts = SessionOptions {
            prefill_chunk: chunk,
            ..opts
        };
        let why = match Self::shared(model, &opts, slots)? {
            Ok(b) => return Ok(b),
            Err(why) => why,
        };
        let mut v = Vec::with_capacity(slots);
        for _ in 0..slots {
            v.push(SerialSlot {
                session: Session::open_any(model, opts.clone())?,
                piece_logits: Vec::new(),
            });
        }
        let backend_notice = format!(
            "{} ({slots} slots, one step per slot: {why})",
            v[0].session.backend_notice()
        );
        Ok(Batch {
            model: model.clone(),
            opts,
            engine: Engine::Serial(v),
            backend_notice,
        })
    }

    /// The shared engine, or why not: the model's net or the backend
    /// cannot step several state sets at once.
    fn shared(
        model: &AnyModel,
        opts: &SessionOptions,
        slots: usize,
    ) -> Result<Result<Batch, &'static str>, SessionError> {
        let net = open_net(model, opts)?;
        if let Some(why) = net.no_batching() {
            return Ok(Err(why));
        }
        let kind = match opts.backend {
            // `auto` picks a GPU where there is one; those run serially.
            BackendKind::Auto => return Ok(Err("the backend holds one state set")),
            k => k,
        };
        let opened = backend::open(
            kind,
            model.weight_file(),
            net.state_layout().clone(),
            &opts.backend_options,
        )?;
        let mut backend = opened.backend;
        // Probe with two sets so that one slot takes the same engine as many.
        if backend.set_state_sets(slots.max(2)).is_err() {
            return Ok(Err("the backend holds one state set"));
        }
        backend.set_state_sets(slots)?;
        let logits = Logits::LastPerState(slots);
        let small = load_graph(backend.as_mut(), net.as_ref(), slots, logits)?;
        let large = load_graph(
            backend.as_mut(),
            net.as_ref(),
            slots + opts.prefill_chunk,
            logits,
        )?;
        let backend_notice = format!("{} ({slots} slots, batched steps)", opened.notice);
        Ok(Ok(Batch {
            model: model.clone(),
            opts: opts.clone(),
            engine: Engine::Shared(Box::new(Shared {
                net,
                backend,
                vocab: model.n_vocab(),
                small,
                large,
                every_row: None,
                chunk: opts.prefill_chunk,
                slots: (0..slots).map(|_| SlotData::default()).collect(),
            })),
            backend_notice,
        }))
    }

    pub fn slots(&self) -> usize {
        match &self.engine {
            Engine::Shared(s) => s.slots.len(),
            Engine::Serial(v) => v.len(),
        }
    }

    /// KV/state bytes one slot holds (the server prints slots × this).
    pub fn slot_state_bytes(&self) -> usize {
        match &self.engine {
            Engine::Shared(s) => s.net.state_layout().bytes(),
            Engine::Serial(v) => v[0].session.state_bytes(),
        }
    }

    pub fn ctx(&self) -> usize {
        self.opts.ctx
    }

    /// The model the slots run.
    pub fn model(&self) -> &AnyModel {
        &self.model
    }

    /// What the slots' Engram readers did, summed (V4.1 models only).
    pub fn engram_stats(&self) -> Option<EngramStats> {
        let Engine::Serial(v) = &self.engine else {
            return None;
        };
        let mut sum: Option<EngramStats> = None;
        for st in v.iter().filter_map(|s| s.session.engram_stats()) {
            *sum.get_or_insert_with(EngramStats::default) += st;
        }
        sum
    }

    pub fn backend_notice(&self) -> &str {
        &self.backend_notice
    }

    fn frame(&self) -> Frame {
        Frame {
            ctx: self.opts.ctx,
            prefill_chunk: self.opts.prefill_chunk,
        }
    }

    fn known(&self, slot: usize) {
        // Slot indices come from the caller's own scheduler; out of range is a bug.
        assert!(slot < self.slots(), "slot {slot} of {}", self.slots());
    }

    pub fn tokens(&self, slot: usize) -> &[u32] {
        self.known(slot);
        match &self.engine {
            Engine::Shared(s) => &s.slots[slot].tokens,
            Engine::Serial(v) => v[slot].session.tokens(),
        }
    }

    /// Logits after the slot's last token (vocab floats; empty before any).
    pub fn logits(&self, slot: usize) -> &[f32] {
        self.known(slot);
        match &self.engine {
            Engine::Shared(s) => &s.slots[slot].logits,
            Engine::Serial(v) => v[slot].session.logits(),
        }
    }

    /// Logits of every row of the slot's last piece when it asked
    /// `all_logits` (rows × vocab), else empty.
    pub fn piece_logits(&self, slot: usize) -> &[f32] {
        self.known(slot);
        match &self.engine {
            Engine::Shared(s) => &s.slots[slot].piece_logits,
            Engine::Serial(v) => &v[slot].piece_logits,
        }
    }

    pub fn reset(&mut self, slot: usize) {
        self.known(slot);
        match &mut self.engine {
            Engine::Shared(s) => {
                s.slots[slot] = SlotData::default();
                // The set exists (checked above); a failure here is a bug.
                s.backend
                    .reset_set(slot)
                    .expect("state set of a known slot");
            }
            Engine::Serial(v) => {
                v[slot].session.reset();
                v[slot].piece_logits.clear();
            }
        }
    }
    /// Checks every entry of a step before anything runs: known, distinct
    /// slots; non-empty pieces of known tokens that fit the context.
    fn check(&self, work: &[SlotWork<'_>]) -> Result<(), SessionError> {
        let vocab = self.model.n_vocab();
        let mut seen = vec![false; self.slots()];
        for w in work {
            if w.slot >= self.slots() {
                return Err(SessionError::Batch(format!(
                    "slot {} of a batch of {}",
                    w.slot,
                    self.slots()
                )));
            }
            if std::mem::replace(&mut seen[w.slot], true) {
                return Err(SessionError::Batch(format!(
                    "slot {} listed twice in one step",
                    w.slot
                )));
            }
            if w.tokens.is_empty() {
                return Err(SessionError::Empty);
            }
            if let Some(&id) = w.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(SessionError::BadToken { id, vocab });
            }
            let total = self.tokens(w.slot).len() + w.tokens.len();
            if total > self.opts.ctx {
                return Err(SessionError::ContextFull {
                    tokens: total,
                    ctx: self.opts.ctx,
                });
            }
        }
        Ok(())
    }

    /// One engine step over all listed slots (distinct slots). Checks every
    /// entry first and returns the first error without running anything; a
    /// backend failure resets only the slots of that step and is returned.
    pub fn step(&mut self, work: &[SlotWork<'_>]) -> Result<(), SessionError> {
        self.check(work)?;
        let r = match &mut self.engine {
            Engine::Shared(s) => s.step(work),
            Engine::Serial(v) => serial_step(v, work),
        };
        if r.is_err() {
            for w in work {
                self.reset(w.slot);
            }
        }
        r
    }

    /// The same payload as [`Session::save_snapshot`] (it carries the tokens).
    pub fn save_snapshot(&self, slot: usize) -> Result<Vec<u8>, SessionError> {
        self.known(slot);
        match &self.engine {
            Engine::Shared(s) => {
                let d = &s.slots[slot];
                s.net.save(Saving {
                    backend: s.backend.as_ref(),
                    set: slot,
                    tokens: &d.tokens,
                    logits: &d.logits,
                    frame: self.frame(),
                })
            }
            Engine::Serial(v) => v[slot].session.save_snapshot(),
        }
    }

    /// Replaces the slot with a snapshot; on error the slot is left empty.
    pub fn load_snapshot(&mut self, slot: usize, payload: &[u8]) -> Result<(), SessionError> {
        self.known(slot);
        let frame = self.frame();
        let r = match &mut self.engine {
            Engine::Shared(s) => s
                .net
                .load(Loading {
                    backend: s.backend.as_mut(),
                    set: slot,
                    payload,
                    frame,
                })
                .map(|(tokens, logits)| {
                    s.slots[slot] = SlotData {
                        tokens,
                        logits,
                        piece_logits: Vec::new(),
                    }
                }),
            Engine::Serial(v) => {
                v[slot].piece_logits.clear();
                return v[slot].session.load_snapshot(payload);
            }
        };
        if r.is_err() {
            self.reset(slot);
        }
        r
    }
}

/// Records the forward pass for `cap` rows and loads it: its handle,
/// capacity and logits value.
fn load_graph(
    backend: &mut dyn Backend,
    net: &dyn Net,
    cap: usize,
    logits: Logits,
) -> Result<(GraphHandle, usize, ValueId), SessionError> {
    let g = net.record(cap, logits, &[]);
    let logits = g.logits;
    Ok((backend.load_graph(Arc::new(g))?, cap, logits))
}

fn serial_step(v: &mut [SerialSlot], work: &[SlotWork<'_>]) -> Result<(), SessionError> {
    for w in work {
        let s = &mut v[w.slot];
        s.piece_logits.clear();
        if w.all_logits {
            s.piece_logits = s.session.score_more(w.tokens)?;
        } else {
            s.session.sync_more(w.tokens)?;
        }
    }
    Ok(())
}

impl Shared {
    /// Runs the pieces in passes of at most one chunk per slot.
    fn step(&mut self, work: &[SlotWork<'_>]) -> Result<(), SessionError> {
        let vocab = self.vocab;
        for w in work {
            self.slots[w.slot].piece_logits.clear();
        }
        let mut done = vec![0usize; work.len()];
        loop {
            // This pass: the next chunk of every unfinished piece of one
            // kind, in order, while they fit the large graph. The kinds
            // (every row's logits, or only the last row's) never share a
            // pass: a piece's rows meet the head on the path its own row
            // count picks in the every-row graph, but its last row alone
            // in the last-row graph, and a fast backend's two paths round
            // differently; so a piece gets the head it gets alone.
            let Some(every_row) = work
                .iter()
                .zip(&done)
                .find(|(w, &d)| d < w.tokens.len())
                .map(|(w, _)| w.all_logits)
            else {
                return Ok(());
            };
            let mut pass: Vec<(usize, usize, usize)> = Vec::new(); // (work index, from, to)
            let mut rows = 0;
            for (i, w) in work.iter().enumerate() {
                let from = done[i];
                if from == w.tokens.len() || w.all_logits != every_row {
                    continue;
                }
                let to = (from + self.chunk).min(w.tokens.len());
                if rows + (to - from) > self.large.1 {
                    continue;
                }
                rows += to - from;
                pass.push((i, from, to));
            }
            // A pass of `all_logits` pieces projects every row; the others
            // only each slot's last row.
            let (g, _, logits_v) = if every_row {
                match self.every_row {
                    Some(g) => g,
                    None => {
                        let g = load_graph(
                            self.backend.as_mut(),
                            self.net.as_ref(),
                            self.large.1,
                            Logits::All,
                        )?;
                        *self.every_row.insert(g)
                    }
                }
            } else if rows <= self.small.1 {
                self.small
            } else {
                self.large
            };
            let mut tokens = Vec::with_capacity(rows);
            let mut table = Vec::with_capacity(rows);
            for &(i, from, to) in &pass {
                let w = &work[i];
                let pos0 = self.slots[w.slot].tokens.len();
                tokens.extend_from_slice(&w.tokens[from..to]);
                table.extend((0..to - from).map(|t| RowRecord {
                    pos: (pos0 + t) as u32,
                    state: w.slot as u32,
                }));
            }
            self.backend.run_rows(g, &tokens, &table)?;
            let all = self.backend.read_value(g, logits_v)?;
            let mut at = 0;
            for &(i, from, to) in &pass {
                let w = &work[i];
                let n = to - from;
                let d = &mut self.slots[w.slot];
                d.tokens.extend_from_slice(&w.tokens[from..to]);
                d.logits.clear();
                if every_row {
                    let rows = &all[at * vocab..(at + n) * vocab];
                    d.logits.extend_from_slice(&rows[(n - 1) * vocab..]);
                    if w.all_logits {
                        d.piece_logits.extend_from_slice(rows);
                    }
                } else {
                    d.logits
                        .extend_from_slice(&all[w.slot * vocab..(w.slot + 1) * vocab]);
                }
                at += n;
                done[i] = to;
            }
        }
    }
}
