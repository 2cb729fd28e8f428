//! Several sessions on one model: N KV slots, and steps that carry the rows
//! of several slots at once (issue 18). A slot is a [`Session`]-like
//! sequence (tokens, logits, KV state); [`Batch::step`] appends one piece of
//! tokens to each listed slot.
//!
//! Batch invariance: a slot's logits are bit-identical to the same tokens
//! run alone (`slots = 1`, the same piece sizes), whatever else is in the
//! step.
//!
//! This first version runs each listed slot's piece as its own step on its
//! own session, one after another: correct and invariant by construction,
//! with the final signatures, so the server's scheduler can be built on it
//! while the batched engine underneath is finished.

use std::sync::Arc;

use super::{Session, SessionError, SessionOptions};
use crate::model::ModelFile;

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

/// N KV slots on one model.
pub struct Batch {
    model: Arc<ModelFile>,
    opts: SessionOptions,
    slots: Vec<Slot>,
    backend_notice: String,
}

struct Slot {
    session: Session,
    /// Logits of every row of the last piece when it asked for them.
    piece_logits: Vec<f32>,
}

impl Batch {
    pub fn new(
        model: Arc<ModelFile>,
        opts: SessionOptions,
        slots: usize,
    ) -> Result<Batch, SessionError> {
        if slots == 0 {
            return Err(SessionError::Batch(
                "a batch needs at least one slot".into(),
            ));
        }
        let mut v = Vec::with_capacity(slots);
        for _ in 0..slots {
            v.push(Slot {
                session: Session::new(model.clone(), opts.clone())?,
                piece_logits: Vec::new(),
            });
        }
        let backend_notice = v[0].session.backend_notice().to_string();
        Ok(Batch {
            model,
            opts,
            slots: v,
            backend_notice,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// KV/state bytes one slot holds (the server prints slots × this).
    pub fn slot_state_bytes(&self) -> usize {
        self.slots[0].session.state_bytes()
    }

    pub fn ctx(&self) -> usize {
        self.opts.ctx
    }

    pub fn model(&self) -> &ModelFile {
        &self.model
    }

    pub fn backend_notice(&self) -> &str {
        &self.backend_notice
    }

    fn slot(&self, slot: usize) -> &Slot {
        // Slot indices come from the caller's own scheduler; out of range is a bug.
        assert!(
            slot < self.slots.len(),
            "slot {slot} of {}",
            self.slots.len()
        );
        &self.slots[slot]
    }

    pub fn tokens(&self, slot: usize) -> &[u32] {
        self.slot(slot).session.tokens()
    }

    /// Logits after the slot's last token (vocab floats; empty before any).
    pub fn logits(&self, slot: usize) -> &[f32] {
        self.slot(slot).session.logits()
    }

    /// Logits of every row of the slot's last piece when it asked
    /// `all_logits` (rows × vocab), else empty.
    pub fn piece_logits(&self, slot: usize) -> &[f32] {
        &self.slot(slot).piece_logits
    }

    pub fn reset(&mut self, slot: usize) {
        self.slot(slot);
        let s = &mut self.slots[slot];
        s.session.reset();
        s.piece_logits.clear();
    }

    /// Checks every entry of a step before anything runs: known, distinct
    /// slots; non-empty pieces of known tokens that fit the context.
    fn check(&self, work: &[SlotWork<'_>]) -> Result<(), SessionError> {
        let vocab = self.model.config.n_vocab;
        let mut seen = vec![false; self.slots.len()];
        for w in work {
            if w.slot >= self.slots.len() {
                return Err(SessionError::Batch(format!(
                    "slot {} of a batch of {}",
                    w.slot,
                    self.slots.len()
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
        let mut failed = None;
        for w in work {
            let s = &mut self.slots[w.slot];
            s.piece_logits.clear();
            let r = if w.all_logits {
                s.session
                    .score_more(w.tokens)
                    .map(|all| s.piece_logits = all)
            } else {
                s.session.sync_more(w.tokens)
            };
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => {
                for w in work {
                    self.reset(w.slot);
                }
                Err(e)
            }
        }
    }

    /// The same payload as [`Session::save_snapshot`] (it carries the tokens).
    pub fn save_snapshot(&self, slot: usize) -> Result<Vec<u8>, SessionError> {
        self.slot(slot).session.save_snapshot()
    }

    /// Replaces the slot with a snapshot; on error the slot is left empty.
    pub fn load_snapshot(&mut self, slot: usize, payload: &[u8]) -> Result<(), SessionError> {
        self.slot(slot);
        let s = &mut self.slots[slot];
        s.piece_logits.clear();
        s.session.load_snapshot(payload)
    }
}
