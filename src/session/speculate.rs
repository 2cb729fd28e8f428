//! Speculative verification (issue 35): one step of `k + 1` rows through
//! the model — the next token and `k` drafted ones — with logits at every
//! row, then the rows the caller keeps stay and the others are taken back.
//!
//! Exact by construction:
//! * **The rows.** The verify graph is the model's forward with logits at
//!   every row and [`Graph::decode_paths`] set, so each row takes the
//!   kernel path of a one-row step. With the batch-invariant kernels
//!   (docs/ARCHITECTURE.md, "Several sessions in one step") row `i`'s
//!   logits are then the bits decoding the rows one at a time gives.
//! * **The state.** A step writes four kinds of state, all known from the
//!   graph's ops ([`UndoPlan::of`]): the raw ring (one slot per position),
//!   the compressed rows (one per closed window), the compressors' frontier
//!   slots, and (V4.1) the host's Engram history. Before the step the plan
//!   saves what the step may overwrite: the ring slots of rows 1.., the
//!   compressed rows a window closed by the step would take, and the
//!   frontier when the step closes a window (V4.1's partial groups always:
//!   their slots are not cleared, and they are small). After the step the
//!   rows that were not kept are undone: their ring slots and compressed
//!   rows get the saved rows back; a frontier that was saved is replayed
//!   from the saved copy through the kept rows' projected rows and gates
//!   (read from the step, `comp_kv`/`comp_gate`, kept by the graph) with
//!   the compressor's own slot code ([`Compress::replay_frontier`]); a V4
//!   frontier the step did not close a window of only gained the slots of
//!   the undone rows, which were empty before (V4 clears a window's slots
//!   when it closes) and are emptied again. Compressed rows of windows the
//!   kept rows closed were pooled from kept rows only, so they stand. The
//!   Engram history is rebuilt from the kept tokens. So after a verify the
//!   whole state — every buffer, not only what later steps read — equals
//!   the state of decoding the kept rows one at a time (tests/speculate.rs
//!   compares every state buffer).
//!
//! The frontier values are copies of the step's rows, except V4's scores,
//! which are `gate + ape`: one f32 addition, correctly rounded on every
//! backend (the GPU kernels write the same sum), so the replay gives the
//! device's bits.

use std::ops::Range;
use std::sync::Arc;

use super::{Session, SessionError};
use crate::backend::{state_desc, Backend, GraphHandle};
use crate::gguf::GgufFile;
use crate::graph::ops::compress::{Compress, EMPTY_SCORE};
use crate::graph::ops::source_compress::SourceCompress;
use crate::graph::ops::v41::V41Op;
use crate::graph::ops::Op;
use crate::graph::{Graph, StateId, ValueId};
use crate::model::logits::Logits;

/// Rows of one verify step at most: the next token and up to 15 drafts.
pub const MAX_VERIFY_ROWS: usize = 16;

/// The verify graph of a session and what its steps may write.
pub(super) struct Verifier {
    pub graph: GraphHandle,
    pub plan: UndoPlan,
    pub max_rows: usize,
}

/// A compressor as a verify step sees it.
#[derive(Clone, Debug)]
enum Comp {
    /// V4's (`Compress`), with its `ape` table read once.
    V4 { op: Compress, ape: Vec<f32> },
    /// V4.1's (`SourceCompress`): latent and index rows, a partial group
    /// when the ratio is above 1.
    V41(SourceCompress),
}

impl Comp {
    fn ratio(&self) -> usize {
        match self {
            Comp::V4 { op, .. } => op.ratio,
            Comp::V41(op) => op.ratio.max(1),
        }
    }

    /// The compressed rows written when token `p` closes its window.
    fn row_states(&self) -> Vec<StateId> {
        match self {
            Comp::V4 { op, .. } => vec![op.rows],
            Comp::V41(op) => vec![op.rows, op.index_rows],
        }
    }

    /// The row token `p` writes, if it closes a window.
    fn emitted_row(&self, p: usize) -> Option<usize> {
        let r = self.ratio();
        match self {
            Comp::V4 { .. } => ((p + 1) % r == 0).then(|| (p + 1) / r - 1),
            Comp::V41(_) => ((p + 1) % r == 0).then_some(p / r),
        }
    }

    fn frontier(&self) -> Option<(StateId, StateId)> {
        match self {
            Comp::V4 { op, .. } => Some((op.state_kv, op.state_score)),
            Comp::V41(op) => op.frontier.map(|f| (f.kv, f.score)),
        }
    }

    fn inputs(&self) -> (ValueId, Option<ValueId>) {
        match self {
            Comp::V4 { op, .. } => (op.kv, Some(op.gate)),
            Comp::V41(op) => (op.kv, op.gate),
        }
    }
}

/// What a verify step may write, read from the verify graph's ops.
#[derive(Clone, Debug, Default)]
pub(super) struct UndoPlan {
    /// Raw rings: (state, window).
    rings: Vec<(StateId, usize)>,
    comps: Vec<Comp>,
}

/// What a plan saved before one step.
pub(super) struct Saved {
    pos0: usize,
    n: usize,
    /// Per ring: the rows of positions `pos0 + 1 .. pos0 + n`.
    rings: Vec<Vec<f32>>,
    /// Per compressor: per row state, (first row, rows) of the rows the
    /// step may write; the frontier (values, scores) when saved.
    comps: Vec<SavedComp>,
}

struct SavedComp {
    rows: Vec<(usize, Vec<f32>)>,
    frontier: Option<(Vec<f32>, Vec<f32>)>,
}

impl UndoPlan {
    /// The plan of graph `g`, or why a step of it cannot be undone (an op
    /// that writes state no rule here covers).
    pub fn of(g: &Graph, file: &GgufFile) -> Result<UndoPlan, String> {
        let mut plan = UndoPlan::default();
        for op in g.ops() {
            match op {
                Op::RingWrite(o) => plan.rings.push((o.ring, o.window)),
                Op::Compress(o) => plan.comps.push(Comp::V4 {
                    op: o.clone(),
                    ape: crate::graph::ops::load_f32(file, &o.ape),
                }),
                Op::V41(V41Op::SourceCompress(o)) => plan.comps.push(Comp::V41(o.clone())),
                Op::V41(V41Op::EngramHash(_)) => {
                    return Err("the graph hashes Engram rows into device state".into())
                }
                // Every other op reads state or none.
                _ => {}
            }
        }
        Ok(plan)
    }

    /// The values a verify graph must keep readable: each compressor's
    /// projected rows and gates.
    pub fn kept_values(&self) -> Vec<ValueId> {
        let mut v = Vec::new();
        for c in &self.comps {
            let (kv, gate) = c.inputs();
            v.push(kv);
            v.extend(gate);
        }
        v
    }

    /// The most rows one step may take: a ring slot must not be written
    /// twice in one step.
    pub fn max_rows(&self) -> usize {
        self.rings
            .iter()
            .map(|&(_, w)| w)
            .min()
            .unwrap_or(MAX_VERIFY_ROWS)
            .min(MAX_VERIFY_ROWS)
    }

    /// Saves what a step of `n` rows from position `pos0` may overwrite in
    /// state set `set`.
    pub fn save(
        &self,
        backend: &dyn Backend,
        set: usize,
        pos0: usize,
        n: usize,
    ) -> Result<Saved, SessionError> {
        let mut rings = Vec::with_capacity(self.rings.len());
        for &(s, w) in &self.rings {
            let mut rows = Vec::new();
            for r in slot_ranges(pos0 + 1, pos0 + n, w) {
                rows.extend(backend.read_set_rows(set, s, r)?);
            }
            rings.push(rows);
        }
        let mut comps = Vec::with_capacity(self.comps.len());
        for c in &self.comps {
            let emitted: Vec<usize> = (pos0..pos0 + n).filter_map(|p| c.emitted_row(p)).collect();
            let mut rows = Vec::new();
            if let (Some(&a), Some(&b)) = (emitted.first(), emitted.last()) {
                for s in c.row_states() {
                    let cap = state_desc(backend.state_layout(), s)?.rows;
                    let r = a.min(cap)..(b + 1).min(cap);
                    rows.push((r.start, backend.read_set_rows(set, s, r)?));
                }
            }
            // V4 keeps a frontier it can undo without a copy unless the
            // step closes a window; V4.1's partial groups are always kept.
            let whole = match c {
                Comp::V4 { .. } => !emitted.is_empty(),
                Comp::V41(_) => true,
            };
            let frontier = match c.frontier() {
                Some((kv, score)) if whole => Some((
                    read_whole(backend, set, kv)?,
                    read_whole(backend, set, score)?,
                )),
                _ => None,
            };
            comps.push(SavedComp { rows, frontier });
        }
        Ok(Saved {
            pos0,
            n,
            rings,
            comps,
        })
    }

    /// Takes back rows `keep..` of the step `saved` was taken for (graph
    /// `g` of `backend`, state set `set`): afterwards the state is that of
    /// the step's first `keep` rows alone.
    pub fn undo(
        &self,
        backend: &mut dyn Backend,
        g: GraphHandle,
        set: usize,
        saved: &Saved,
        keep: usize,
    ) -> Result<(), SessionError> {
        let (pos0, n) = (saved.pos0, saved.n);
        if keep >= n {
            return Ok(());
        }
        let t1 = pos0 + keep;
        for (&(s, w), rows) in self.rings.iter().zip(&saved.rings) {
            // The saved rows are positions pos0 + 1 .. pos0 + n, in order.
            let cols = state_desc(backend.state_layout(), s)?.cols;
            for q in t1.max(pos0 + 1)..pos0 + n {
                let o = (q - pos0 - 1) * cols;
                backend.write_set_rows(set, s, q % w, &rows[o..o + cols])?;
            }
        }
        for (c, sc) in self.comps.iter().zip(&saved.comps) {
            // Rows of windows closed by undone rows get their old bits back.
            for (s, (first, rows)) in c.row_states().into_iter().zip(&sc.rows) {
                let cols = state_desc(backend.state_layout(), s)?.cols;
                for p in t1..pos0 + n {
                    if let Some(j) = c.emitted_row(p) {
                        if j >= *first && (j - first + 1) * cols <= rows.len() {
                            let o = (j - first) * cols;
                            backend.write_set_rows(set, s, j, &rows[o..o + cols])?;
                        }
                    }
                }
            }
            let Some((kv_s, score_s)) = c.frontier() else {
                continue;
            };
            match (&sc.frontier, c) {
                (Some((kv0, score0)), _) => {
                    let (mut kv, mut score) = (kv0.clone(), score0.clone());
                    let (kv_v, gate_v) = c.inputs();
                    let rows_kv = backend.read_value(g, kv_v)?;
                    let rows_gate = match gate_v {
                        Some(v) => backend.read_value(g, v)?,
                        None => Vec::new(),
                    };
                    match c {
                        Comp::V4 { op, ape } => op.replay_frontier(
                            ape, &rows_kv, &rows_gate, pos0, keep, &mut kv, &mut score,
                        ),
                        Comp::V41(op) => op
                            .replay_frontier(&rows_kv, &rows_gate, pos0, keep, &mut kv, &mut score),
                    }
                    backend.write_set_rows(set, kv_s, 0, &kv)?;
                    backend.write_set_rows(set, score_s, 0, &score)?;
                }
                (None, Comp::V4 { op, .. }) => {
                    // No window closed in the step: the undone rows' slots
                    // (one window, after the kept rows') were empty before.
                    let (m, c) = (op.ratio, op.width());
                    let cur = if op.overlapped { m } else { 0 };
                    let first = cur + t1 % m;
                    let count = pos0 + n - t1;
                    backend.write_set_rows(set, kv_s, first, &vec![0.0; count * c])?;
                    backend.write_set_rows(set, score_s, first, &vec![EMPTY_SCORE; count * c])?;
                }
                (None, Comp::V41(_)) => unreachable!("V4.1 frontiers are always saved"),
            }
        }
        Ok(())
    }
}

/// The ring slots of positions `from..to` in a ring of `w` slots, as at
/// most two ascending slot ranges in position order.
fn slot_ranges(from: usize, to: usize, w: usize) -> Vec<Range<usize>> {
    if from >= to {
        return Vec::new();
    }
    let (a, n) = (from % w, to - from);
    if a + n <= w {
        // One range of slots (not the slots themselves).
        #[allow(clippy::single_range_in_vec_init)]
        let one = vec![a..a + n];
        one
    } else {
        vec![a..w, 0..a + n - w]
    }
}

fn read_whole(backend: &dyn Backend, set: usize, s: StateId) -> Result<Vec<f32>, SessionError> {
    let rows = state_desc(backend.state_layout(), s)?.rows;
    Ok(backend.read_set_rows(set, s, 0..rows)?)
}

/// What a verify step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Rows kept (1 ..= the rows given).
    pub kept: usize,
}

impl Session {
    /// The most rows [`Session::verify`] takes in one step (the next token
    /// and `max_verify_rows() − 1` drafts), or why this session cannot
    /// verify at all.
    pub fn max_verify_rows(&mut self) -> Result<usize, SessionError> {
        Ok(self.verifier()?.max_rows)
    }

    /// Runs `rows` — the next token, then drafted tokens — as one step
    /// after the tokens this session holds, with logits at every row.
    /// `decide` gets those logits (`rows.len() × vocab`, row `i` the
    /// logits after `rows[..=i]`) and returns how many rows to keep (at
    /// least 1); the rest are taken back as if never run. Afterwards the
    /// session holds the kept rows and the logits after the last of them,
    /// bit for bit what evaluating the kept rows one at a time gives.
    pub fn verify(
        &mut self,
        rows: &[u32],
        decide: &mut dyn FnMut(&[f32]) -> usize,
    ) -> Result<Verified, SessionError> {
        if rows.is_empty() {
            return Err(SessionError::Empty);
        }
        self.check(rows)?;
        let max = self.max_verify_rows()?;
        if rows.len() > max {
            return Err(SessionError::Speculation(format!(
                "{} rows in one verify step; this session takes at most {max}",
                rows.len()
            )));
        }
        let pos0 = self.tokens.len();
        if pos0 + rows.len() > self.opts.ctx {
            return Err(SessionError::ContextFull {
                tokens: pos0 + rows.len(),
                ctx: self.opts.ctx,
            });
        }
        let v = self.verifier.take().expect("loaded by max_verify_rows");
        let r = self.verify_with(&v, rows, decide);
        self.verifier = Some(v);
        r
    }

    fn verify_with(
        &mut self,
        v: &Verifier,
        rows: &[u32],
        decide: &mut dyn FnMut(&[f32]) -> usize,
    ) -> Result<Verified, SessionError> {
        let pos0 = self.tokens.len();
        let n = rows.len();
        let saved = v.plan.save(self.backend.as_ref(), 0, pos0, n)?;
        let all = self.run(v.graph, rows)?;
        let vocab = self.n_vocab();
        let keep = decide(&all).clamp(1, n);
        if keep < n {
            if let Err(e) = v.plan.undo(self.backend.as_mut(), v.graph, 0, &saved, keep) {
                self.reset();
                return Err(e);
            }
            self.tokens.truncate(pos0 + keep);
            if let Some(m) = self.drafter.as_mut() {
                m.truncate(pos0 + keep);
            }
            self.logits = all[(keep - 1) * vocab..keep * vocab].to_vec();
            self.net.rewind_host(&self.tokens);
        }
        Ok(Verified { kept: keep })
    }

    /// The verify graph, recorded and loaded on first use.
    fn verifier(&mut self) -> Result<&Verifier, SessionError> {
        if self.verifier.is_none() {
            if self.opts.backend_options.cuda_mma && self.backend.name() == "cuda" {
                return Err(SessionError::Speculation(
                    "the tensor-core prefill (DS4_CUDA_MMA=1) picks its path by the step's row \
                     count, so a verify step would not equal decoding; unset DS4_CUDA_MMA"
                        .into(),
                ));
            }
            let cap = MAX_VERIFY_ROWS.min(self.opts.ctx.max(1));
            let mut g = self.net.record(cap, Logits::All, &self.keep_values());
            let file = self.model.weight_file();
            let plan = UndoPlan::of(&g, (*file).as_ref()).map_err(SessionError::Speculation)?;
            g.keep.extend(plan.kept_values());
            g.keep.sort();
            g.keep.dedup();
            g.decode_paths = true;
            let max_rows = plan.max_rows().min(cap);
            let g = Arc::new(g);
            let h = self.backend.load_graph(g.clone())?;
            self.graphs.push((h, g));
            self.verifier = Some(Verifier {
                graph: h,
                plan,
                max_rows,
            });
        }
        Ok(self.verifier.as_ref().expect("set above"))
    }
}

#[cfg(test)]
mod tests {
    use super::slot_ranges;

    #[test]
    fn slot_ranges_wrap_in_position_order() {
        assert_eq!(slot_ranges(5, 5, 8), vec![]);
        assert_eq!(slot_ranges(1, 4, 8), vec![1..4]);
        assert_eq!(slot_ranges(6, 10, 8), vec![6..8, 0..2]);
        assert_eq!(slot_ranges(8, 16, 8), vec![0..8]);
    }
}
