//! The DeepSeek V4.1 side of a [`super::Session`] (docs/V41.md § CLI and
//! server): the V4.1 graphs with their state layout, the Engram rows fed
//! from the host, and the V4.1 snapshot payload.
//!
//! Engram rows are never resident: the graphs are recorded with
//! `engram_from_host`, so no op names the tables and no backend maps or
//! uploads them. Before each step the token ids are hashed to table rows
//! (`engram::hash_rows`, the ids are all it needs), every row the step will
//! read is prefetched by positioned reads (sorted, deduplicated, behind the
//! reader's hot-row LRU), and then decoded into each Engram layer's
//! `engram_rows@L` input. The host keeps the last `max_ngram − 1`
//! compressed ids itself, so decode continues the prompt's n-grams; a
//! snapshot load rebuilds them from the restored tokens.
//!
//! The snapshot payload is our own layout (V4.1 has no ds4 payload to
//! match): magic `DS41`, so a V4 payload (`DSV4`) offered to a V4.1 session
//! or the reverse is refused by its first word, never loaded.

use std::sync::Arc;

use super::draft::{add_draft_rings, no_drafter_file, DraftModel, Drafter};
use super::dspark::DsparkRunner;
use super::net::{Loading, Net, Saving};
use super::snapshot::{
    begin_payload, check_fits, put_f32s, put_whole_state, Reader, V41_SNAPSHOT_MAGIC,
};
use super::SessionError;
use crate::backend::{state_desc, Backend, GraphHandle};
use crate::graph::{Graph, StateId, StateLayout, ValueName};
use crate::model::dspark;
use crate::model::forward::Numerics;
use crate::model::logits::Logits;
use crate::model::v41::dspark as v41_dspark;
use crate::model::v41::engram::{hash_rows, EngramHistory};
use crate::model::v41::engram_reader::{EngramReader, EngramStats};
use crate::model::v41::forward::{self, engram_input, V41ForwardOptions, V41KvLayout};
use crate::model::v41::{LayerRole, V41ModelFile};

const VERSION: u32 = 1;
const HEADER_FIELDS: usize = 11;

/// Hot Engram rows kept by default: 64 Ki rows (16.5 MiB of 264-byte rows
/// at real size), against tables of 384 M rows each.
pub const DEFAULT_ENGRAM_CACHE_ROWS: usize = 1 << 16;

/// The V4.1 model, its state layout and the Engram reader of one session.
pub(super) struct V41Net {
    model: Arc<V41ModelFile>,
    kv: V41KvLayout,
    reader: EngramReader,
    history: EngramHistory,
    /// What the session asked for (`model`: the official rounding steps).
    numerics: Numerics,
    /// The DSpark stages' window rings (`--dspark`; empty without).
    draft_rings: Vec<StateId>,
}

impl V41Net {
    pub fn open(
        model: Arc<V41ModelFile>,
        ctx: usize,
        cache_rows: usize,
        numerics: Numerics,
        drafter: DraftModel,
    ) -> Result<V41Net, SessionError> {
        let mut kv = V41KvLayout::new(&model.config, ctx);
        let n_rings = match (drafter, &model.dspark) {
            (DraftModel::None, _) => 0,
            (DraftModel::Dspark, Some(ds)) => ds.config.n_stages,
            (DraftModel::Dspark, None) => return Err(no_drafter_file("--dspark")),
            (DraftModel::Mtp, _) => {
                return Err(SessionError::Speculation(
                    "--mtp: V4.1 has no MTP block (its drafter is DSpark: --dspark)".into(),
                ))
            }
        };
        let draft_rings = add_draft_rings(&mut kv.layout, &model.config, n_rings, false);
        let reader = EngramReader::open(
            model.file.path(),
            &model.config.engram,
            &model.weights,
            cache_rows,
        )
        .map_err(|e| SessionError::Engram(format!("{}: {e}", model.file.path().display())))?;
        let history = EngramHistory::new(&model.config.engram);
        Ok(V41Net {
            model,
            kv,
            reader,
            history,
            numerics,
            draft_rings,
        })
    }

    fn header(&self, ctx: usize, prefill_chunk: usize, t: usize) -> [u32; HEADER_FIELDS] {
        let cfg = &self.model.config;
        [
            V41_SNAPSHOT_MAGIC,
            VERSION,
            ctx as u32,
            prefill_chunk as u32,
            cfg.sliding_window as u32,
            t as u32,
            cfg.n_layer as u32,
            cfg.head_dim as u32,
            cfg.indexer_head_dim as u32,
            cfg.n_vocab as u32,
            (cfg.engram.max_ngram - 1) as u32,
        ]
    }

    /// The history after `tokens`: only the last `max_ngram − 1` matter.
    fn rebuild_history(&mut self, tokens: &[u32]) {
        let eg = &self.model.config.engram;
        let mut h = EngramHistory::new(eg);
        let tail = &tokens[tokens.len().saturating_sub(eg.max_ngram - 1)..];
        hash_rows(eg, &mut h, tail, None);
        self.history = h;
    }
}

impl Net for V41Net {
    fn state_layout(&self) -> &StateLayout {
        &self.kv.layout
    }

    /// The V4.1 forward for steps of up to `max_tokens`, Engram rows fed by the host.
    fn record(&self, max_tokens: usize, logits: Logits, keep: &[ValueName]) -> Graph {
        let opts = V41ForwardOptions {
            numerics: self.numerics,
            logits,
            keep: keep.to_vec(),
            engram_from_host: true,
        };
        forward::record(
            &self.model.config,
            &self.model.weights,
            &self.kv,
            max_tokens,
            &opts,
        )
    }

    fn no_batching(&self) -> Option<&'static str> {
        Some("V4.1 steps one slot at a time")
    }

    fn open_drafter(&self, backend: &mut dyn Backend) -> Result<Option<Drafter>, SessionError> {
        let (m, cfg) = (&self.model, &self.model.config);
        let Some(ds) = m.dspark.as_ref().filter(|_| !self.draft_rings.is_empty()) else {
            return Ok(None);
        };
        let rings = &self.draft_rings;
        let attn = forward::v41_attn_options(self.numerics);
        let seed = dspark::record_seed(cfg, ds, rings, attn, cfg.sliding_window);
        let draft = v41_dspark::record_draft(cfg, &m.weights, ds, rings, self.numerics);
        let markov = dspark::record_markov(cfg, ds);
        let taps = dspark::tap_values(&ds.config, &cfg.engram.layer_ids);
        let r = DsparkRunner::open(backend, cfg, ds, taps, seed, draft, markov)?;
        Ok(Some(Drafter::new(Box::new(r), cfg.sliding_window)))
    }

    fn engram_stats(&self) -> Option<EngramStats> {
        Some(self.reader.stats())
    }

    /// The history of an empty sequence.
    fn reset(&mut self) {
        self.history = EngramHistory::new(&self.model.config.engram);
    }

    /// The history after the kept tokens of a speculative step.
    fn rewind_host(&mut self, tokens: &[u32]) {
        self.rebuild_history(tokens);
    }

    /// Hashes `tokens` (the step's ids, known before it runs), prefetches
    /// every table row they need and writes the decoded rows into each
    /// Engram layer's input of graph `g`.
    fn feed(
        &mut self,
        backend: &mut dyn Backend,
        g: GraphHandle,
        graph: &Graph,
        tokens: &[u32],
    ) -> Result<(), SessionError> {
        let eg = &self.model.config.engram;
        let (n_slots, cols, hd) = (eg.layer_ids.len(), eg.cols(), eg.head_dim);
        let rows = hash_rows(eg, &mut self.history, tokens, None);
        self.reader.count_tokens(tokens.len());
        let per_slot: Vec<Vec<u32>> = (0..n_slots)
            .map(|slot| {
                (0..tokens.len())
                    .flat_map(|t| {
                        let o = (t * n_slots + slot) * cols;
                        rows[o..o + cols].iter().copied()
                    })
                    .collect()
            })
            .collect();
        let io = |e: std::io::Error| SessionError::Engram(e.to_string());
        // Per table: every row of the step read first (ascending, each
        // once), then decoded from the cache into the layer's input.
        for (slot, (&l, r)) in eg.layer_ids.iter().zip(&per_slot).enumerate() {
            self.reader.prefetch(slot, r).map_err(io)?;
            let input = engram_input(graph, l).ok_or_else(|| {
                SessionError::Engram(format!("the graph has no engram_rows@{l} input"))
            })?;
            let mut buf = vec![0f32; r.len() * hd];
            self.reader.decode(slot, r, &mut buf).map_err(io)?;
            backend.write_value(g, input, &buf)?;
        }
        Ok(())
    }

    /// Serialises the session's state (set `set` of `backend`).
    fn save(&self, at: Saving<'_>) -> Result<Vec<u8>, SessionError> {
        let (backend, set, tokens, logits) = (at.backend, at.set, at.tokens, at.logits);
        let frame = at.frame;
        let cfg = &self.model.config;
        let t = tokens.len();
        let header = self.header(frame.ctx, frame.prefill_chunk, t);
        let mut out = begin_payload(&header, tokens, logits)?;
        for (l, ls) in self.kv.layers.iter().enumerate() {
            put_whole_state(&mut out, backend, set, ls.ring)?;
            let ratio = role_ratio(cfg.roles[l]);
            for s in [ls.rows, ls.index_rows].into_iter().flatten() {
                let cap = state_desc(backend.state_layout(), s)?.rows;
                let n = (t / ratio).min(cap);
                if n > 0 {
                    put_f32s(&mut out, &backend.read_set_rows(set, s, 0..n)?);
                }
            }
            if let Some(f) = ls.frontier {
                for s in [f.kv, f.score] {
                    put_whole_state(&mut out, backend, set, s)?;
                }
            }
        }
        put_whole_state(&mut out, backend, set, self.kv.engram_history)?;
        Ok(out)
    }

    /// Reads a payload made by `save` into set `set`; returns its tokens
    /// and logits. On error the set is undefined (the caller resets).
    fn load(&mut self, at: Loading<'_>) -> Result<(Vec<u32>, Vec<f32>), SessionError> {
        let (backend, set, payload, frame) = (at.backend, at.set, at.payload, at.frame);
        let ctx = frame.ctx;
        let bad = |m: String| SessionError::Snapshot(m);
        let (mut r, h) = Reader::header::<HEADER_FIELDS>(payload, true)?;
        if h[1] != VERSION {
            return Err(bad(format!("V4.1 session payload version {}", h[1])));
        }
        let (saved_ctx, t) = (h[2] as usize, h[5] as usize);
        check_fits(saved_ctx, t, ctx)?;
        let want = self.header(saved_ctx, h[3] as usize, t);
        if h[4..] != want[4..] {
            return Err(bad(format!(
                "different model layout: window, tokens, layers, head dims, vocab, n-gram history {:?} vs {:?}",
                &h[4..],
                &want[4..]
            )));
        }
        let cfg = self.model.config.clone();
        let (tokens, logits) = r.tokens_and_logits(t, cfg.n_vocab)?;
        backend.reset_set(set)?;
        let layers = self.kv.layers.clone();
        for (l, ls) in layers.iter().enumerate() {
            r.whole_state(backend, set, ls.ring, "window rows")?;
            let ratio = role_ratio(cfg.roles[l]);
            for s in [ls.rows, ls.index_rows].into_iter().flatten() {
                let d = state_desc(backend.state_layout(), s)?;
                let (cap, cols) = (d.rows, d.cols);
                let n = (t / ratio).min(cap);
                let v = r.f32s(n * cols, "compressed rows")?;
                if n > 0 {
                    backend.write_set_rows(set, s, 0, &v)?;
                }
            }
            if let Some(f) = ls.frontier {
                for s in [f.kv, f.score] {
                    r.whole_state(backend, set, s, "compressor frontier")?;
                }
            }
        }
        r.whole_state(backend, set, self.kv.engram_history, "engram history")?;
        r.end()?;
        self.rebuild_history(&tokens);
        Ok((tokens, logits))
    }
}

/// Tokens per compressed row of a kv-source layer (1 for the others, which
/// own no rows).
fn role_ratio(role: LayerRole) -> usize {
    match role {
        LayerRole::Source { ratio } => ratio.max(1),
        _ => 1,
    }
}
