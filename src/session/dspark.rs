//! Drafting with DeepSeek's DSpark (docs/SPECULATIVE.md, "DSpark";
//! `model::dspark`): the session keeps the taps of the target's last `W`
//! positions, seeds the stages' rings with the positions not yet in them,
//! runs one draft block and picks the drafts through the Markov head.
//!
//! **Its rings.** A stage's ring holds one row per target position, made
//! from that position's taps alone, so it is caught up lazily before a
//! draft, like the MTP block's: rows of positions a verify step took back
//! are never written (only kept positions are seeded), and the block's
//! own rows are never written at all (`Attention::block`).

use std::sync::Arc;

use super::draft::{DraftAsk, DraftRunner, TargetRows, TargetStep};
use super::SessionError;
use crate::backend::{Backend, GraphHandle};
use crate::graph::{Graph, StepParams, ValueId, ValueName};
use crate::model::config::CoreConfig;
use crate::model::dspark::{DsparkWeights, MarkovGraph, SeedGraph};
use crate::sampler::argmax;

pub(super) struct DsparkRunner {
    seed: GraphHandle,
    seed_taps: ValueId,
    draft: GraphHandle,
    draft_logits: ValueId,
    targets: Vec<ValueName>,
    /// The model's width (a tap's).
    dim: usize,
    block: usize,
    noise: u32,
    vocab: usize,
    /// The Markov step ([`crate::model::dspark::record_markov`]).
    markov: GraphHandle,
    markov_row: ValueId,
    markov_logits: ValueId,
    /// Row 0's logits with its Markov bias, of the last draft.
    first: Vec<f32>,
}

impl DsparkRunner {
    /// `targets`: the target's values the taps are read from
    /// ([`crate::model::dspark::tap_values`]).
    pub fn open(
        backend: &mut dyn Backend,
        cfg: &CoreConfig,
        ds: &DsparkWeights,
        targets: Vec<ValueName>,
        seed: SeedGraph,
        draft: Graph,
        markov: MarkovGraph,
    ) -> Result<DsparkRunner, SessionError> {
        let draft_logits = draft.logits;
        let seed_taps = seed.taps;
        let (markov_row, markov_logits) = (markov.row, markov.graph.logits);
        let seed = backend.load_graph(Arc::new(seed.graph))?;
        let draft = backend.load_graph(Arc::new(draft))?;
        let markov_h = backend.load_graph(Arc::new(markov.graph))?;
        Ok(DsparkRunner {
            seed,
            seed_taps,
            draft,
            draft_logits,
            targets,
            dim: cfg.n_embd,
            block: ds.config.block_size,
            noise: ds.config.noise_token,
            vocab: cfg.n_vocab,
            markov: markov_h,
            markov_row,
            markov_logits,
            first: Vec::new(),
        })
    }

    /// One tap: the mean of an n·D state's streams, or a D row as it is.
    fn tap(&self, row: &[f32], out: &mut Vec<f32>) {
        let d = self.dim;
        if row.len() == d {
            out.extend_from_slice(row);
            return;
        }
        let n = (row.len() / d) as f32;
        out.extend((0..d).map(|j| row.iter().skip(j).step_by(d).sum::<f32>() / n));
    }
}

impl DraftRunner for DsparkRunner {
    fn targets(&self) -> Vec<ValueName> {
        self.targets.clone()
    }

    /// One row per position: the taps of every target value, side by side.
    fn rows(&self, step: &TargetStep<'_>, kept: usize) -> Result<Vec<Vec<f32>>, SessionError> {
        let values = (self.targets.iter())
            .map(|t| step.read_last(t, kept))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((0..kept)
            .map(|r| {
                let mut row = Vec::with_capacity(self.targets.len() * self.dim);
                for v in &values {
                    let w = v.len() / kept;
                    self.tap(&v[r * w..(r + 1) * w], &mut row);
                }
                row
            })
            .collect())
    }

    fn draft(
        &mut self,
        backend: &mut dyn Backend,
        hist: &mut TargetRows,
        ask: DraftAsk<'_>,
    ) -> Result<Vec<u32>, SessionError> {
        let DraftAsk { tokens, next, k } = ask;
        let len = tokens.len();
        // Seed the rings with the kept positions not in them yet.
        let first = hist.done.max(hist.oldest());
        if first < len {
            let taps: Vec<f32> = (first..len).flat_map(|p| hist.row(p)).copied().collect();
            backend.write_value(self.seed, self.seed_taps, &taps)?;
            let params = StepParams {
                pos0: first,
                n_tokens: len - first,
            };
            backend.run(self.seed, &tokens[first..len], params)?;
            hist.done = len;
        }
        // The block: `next` and noise, at the positions after the target's.
        let mut block = vec![self.noise; self.block];
        block[0] = next;
        let params = StepParams {
            pos0: len,
            n_tokens: self.block,
        };
        backend.run(self.draft, &block, params)?;
        let logits = backend.read_value(self.draft, self.draft_logits)?;
        // Row i gains the Markov bias of token i (`next`, then each pick)
        // and picks token i + 1 (DeepSeek's `DSparkBlock.forward_head`,
        // greedy).
        let mut prev = next;
        let mut drafts = Vec::with_capacity(k.min(self.block));
        for (i, row) in logits.chunks_exact(self.vocab).take(k).enumerate() {
            backend.write_value(self.markov, self.markov_row, row)?;
            let params = StepParams {
                pos0: len + i,
                n_tokens: 1,
            };
            backend.run(self.markov, &[prev], params)?;
            let biased = backend.read_value(self.markov, self.markov_logits)?;
            prev = argmax(&biased) as u32;
            drafts.push(prev);
            if i == 0 {
                self.first = biased;
            }
        }
        Ok(drafts)
    }

    fn first_logits(&self, _backend: &dyn Backend) -> Result<Vec<f32>, SessionError> {
        Ok(self.first.clone())
    }
}
