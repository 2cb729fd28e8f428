//! Drafting with V4 Flash's MTP block (MODEL.md §6; issue 35): the block
//! runs on the session's own backend, over its own window ring, and
//! proposes the tokens after the next one.
//!
//! **Which state drafts which token.** The block at position `j` takes the
//! target's final n·D state at `j` and the embedding of the token at
//! `j + 1`, and predicts the token at `j + 2`: DeepSeek-V3's pairing (the
//! MTP paper, §2.2), which is how the block was trained over whole
//! sequences. ds4 pairs the state at `j` with the token at `j` instead
//! (MODEL.md §6.2 notes the point as unverified); ours is the paper's,
//! and docs/SPECULATIVE.md says why.
//!
//! **Its ring.** Trained over whole sequences, the block attends to its
//! own rows of the last `W` positions. A row depends only on its own
//! inputs, so the ring is caught up lazily: the session keeps the target's
//! final state of its last `W` positions ([`MtpRunner::record`]), and a
//! draft first runs the block over the positions not yet in the ring (at
//! most `W`, without the head), so its last row attends to exactly the
//! rows a whole-sequence run would give it. Draft rows past the target's
//! positions write ring slots of positions the window still needs; those
//! slots are put back after the draft.
//!
//! Drafts never change what the session outputs: verification keeps a
//! draft only when it is the token the target picks.

use std::sync::Arc;

use super::draft::{DraftAsk, DraftRunner, TargetRows, TargetStep};
use super::SessionError;
use crate::backend::{Backend, GraphHandle};
use crate::graph::{StateId, StepParams, ValueId, ValueName};
use crate::model::mtp::MtpGraph;
use crate::sampler::argmax;

/// One loaded MTP step graph.
struct Step {
    handle: GraphHandle,
    hprev: ValueId,
    state: ValueId,
    logits: ValueId,
}

impl Step {
    fn load(backend: &mut dyn Backend, g: MtpGraph) -> Result<(Step, StateId), SessionError> {
        let graph = Arc::new(g.graph);
        let handle = backend.load_graph(graph.clone())?;
        Ok((
            Step {
                handle,
                hprev: g.hprev,
                state: g.state,
                logits: graph.logits,
            },
            g.ring,
        ))
    }

    /// One block row at position `pos`: token `t` after state `h`.
    fn run(
        &self,
        backend: &mut dyn Backend,
        h: &[f32],
        t: u32,
        pos: usize,
    ) -> Result<(), SessionError> {
        backend.write_value(self.handle, self.hprev, h)?;
        backend.run(
            self.handle,
            &[t],
            StepParams {
                pos0: pos,
                n_tokens: 1,
            },
        )?;
        Ok(())
    }
}

/// The MTP block of a session: its graphs, its ring and the target states
/// it drafts from.
pub(super) struct MtpRunner {
    /// A step with the draft logits.
    head: Step,
    /// A step that only writes the ring (catching up).
    ring_only: Step,
    ring: StateId,
    window: usize,
    /// The target's final state in the graphs that keep it.
    target: ValueName,
}

impl MtpRunner {
    /// The runner of the MTP block's two graphs (`head`: with the draft
    /// logits; `ring_only`: catching up), drafting from the target's
    /// value `target`.
    pub fn open(
        backend: &mut dyn Backend,
        target: ValueName,
        head: MtpGraph,
        ring_only: MtpGraph,
        window: usize,
    ) -> Result<MtpRunner, SessionError> {
        let (head, ring) = Step::load(backend, head)?;
        let (ring_only, _) = Step::load(backend, ring_only)?;
        Ok(MtpRunner {
            head,
            ring_only,
            ring,
            window: window.max(1),
            target,
        })
    }
}

impl DraftRunner for MtpRunner {
    fn targets(&self) -> Vec<ValueName> {
        vec![self.target.clone()]
    }

    /// One row per position: the target's final state.
    fn rows(&self, step: &TargetStep<'_>, kept: usize) -> Result<Vec<Vec<f32>>, SessionError> {
        let rows = step.read_last(&self.target, kept)?;
        let w = rows.len() / kept.max(1);
        Ok(rows.chunks_exact(w.max(1)).map(<[f32]>::to_vec).collect())
    }

    fn draft(
        &mut self,
        backend: &mut dyn Backend,
        hist: &mut TargetRows,
        ask: DraftAsk<'_>,
    ) -> Result<Vec<u32>, SessionError> {
        let DraftAsk { tokens, next, k } = ask;
        let len = tokens.len();
        // Catch up: positions j < len pair the target's state at j with the
        // token at j + 1 (`next` for the last); the last row has the head.
        let first = hist.done.max(hist.oldest()).min(len - 1);
        for j in first..len {
            let h = hist.row(j);
            let (step, t) = if j + 1 < len {
                (&self.ring_only, tokens[j + 1])
            } else {
                (&self.head, next)
            };
            step.run(backend, h, t, j)?;
        }
        hist.done = len;
        let mut drafts =
            vec![argmax(&backend.read_value(self.head.handle, self.head.logits)?) as u32];
        if k == 1 {
            return Ok(drafts);
        }
        // Draft rows at positions len .. len + k - 2 take ring slots the
        // window of the next catch-up still reads: saved and put back.
        let saved: Vec<(usize, Vec<f32>)> = (len..len + k - 1)
            .map(|p| {
                let s = p % self.window;
                Ok((s, backend.read_set_rows(0, self.ring, s..s + 1)?))
            })
            .collect::<Result<_, SessionError>>()?;
        let mut r = Ok(());
        for p in len..len + k - 1 {
            let h = match backend.read_value(self.head.handle, self.head.state) {
                Ok(h) => h,
                Err(e) => {
                    r = Err(e.into());
                    break;
                }
            };
            let d = *drafts.last().expect("one draft");
            if let Err(e) = self.head.run(backend, &h, d, p) {
                r = Err(e);
                break;
            }
            match backend.read_value(self.head.handle, self.head.logits) {
                Ok(l) => drafts.push(argmax(&l) as u32),
                Err(e) => {
                    r = Err(e.into());
                    break;
                }
            }
        }
        for (s, row) in saved.iter().rev() {
            backend.write_set_rows(0, self.ring, *s, row)?;
        }
        r.map(|()| drafts)
    }

    fn first_logits(&self, backend: &dyn Backend) -> Result<Vec<f32>, SessionError> {
        Ok(backend.read_value(self.head.handle, self.head.logits)?)
    }
}
