//! The DeepSeek V4 side of a session: the V4 graphs over their state
//! layout ([`KvLayout`]), and ds4's session payload layout (KVCACHE.md
//! §4.3), generalised from Flash's fixed shapes to the model's
//! configuration: 13 u32 header fields, then tokens, logits, per-layer row
//! counts and per-layer state.

use std::sync::Arc;

use super::draft::{add_draft_rings, no_drafter_file, DraftModel, Drafter};
use super::dspark::DsparkRunner;
use super::mtp::MtpRunner;
use super::net::{Loading, Net, Saving};
use super::snapshot::{
    begin_payload, check_fits, put_f32s, put_u32, put_whole_state, Reader, SNAPSHOT_MAGIC,
};
use super::SessionError;
use crate::backend::{state_desc, Backend};
use crate::graph::{Graph, StateId, StateLayout, ValueName};
use crate::model::forward::{self, ForwardOptions, Numerics};
use crate::model::logits::Logits;
use crate::model::state::KvLayout;
use crate::model::{dspark, mtp};
use crate::model::{AttentionKind, ModelFile};

const VERSION: u32 = 1;
const HEADER_FIELDS: usize = 13;

/// A V4 model with the state layout of one session (or of each slot of a
/// batch) and the numerics its graphs are recorded with.
pub(crate) struct V4Net {
    model: Arc<ModelFile>,
    kv: KvLayout,
    numerics: Numerics,
    drafter: DraftModel,
    /// The draft model's window rings (MTP: one; DSpark: one per stage).
    draft_rings: Vec<StateId>,
}

impl V4Net {
    /// `drafter`: with the draft model's state and graphs (the model must
    /// have the drafter's file attached).
    pub fn open(
        model: Arc<ModelFile>,
        ctx: usize,
        numerics: Numerics,
        drafter: DraftModel,
    ) -> Result<V4Net, SessionError> {
        let cfg = &model.config;
        model.weights.check_tables(&model.file, cfg)?;
        let mut kv = KvLayout::new(cfg, &model.weights, ctx);
        if numerics == Numerics::Model {
            kv.mark_f16_rows();
        }
        let n_rings = match (drafter, &model.mtp, &model.dspark) {
            (DraftModel::None, _, _) => 0,
            (DraftModel::Mtp, Some(_), _) => 1,
            (DraftModel::Dspark, _, Some(ds)) => ds.config.n_stages,
            (DraftModel::Mtp, None, _) => return Err(no_drafter_file("--mtp")),
            (DraftModel::Dspark, _, None) => return Err(no_drafter_file("--dspark")),
        };
        let f16 = numerics == Numerics::Model;
        let draft_rings = add_draft_rings(&mut kv.layout, cfg, n_rings, f16);
        Ok(V4Net {
            model,
            kv,
            numerics,
            drafter,
            draft_rings,
        })
    }
}

impl Net for V4Net {
    fn state_layout(&self) -> &StateLayout {
        &self.kv.layout
    }

    fn record(&self, max_tokens: usize, logits: Logits, keep: &[ValueName]) -> Graph {
        let fo = ForwardOptions {
            numerics: self.numerics,
            logits,
            keep: keep.to_vec(),
        };
        forward::record(
            &self.model.config,
            &self.model.weights,
            &self.kv,
            max_tokens,
            &fo,
        )
    }

    fn no_batching(&self) -> Option<&'static str> {
        None
    }

    fn open_drafter(&self, backend: &mut dyn Backend) -> Result<Option<Drafter>, SessionError> {
        let (m, cfg) = (&self.model, &self.model.config);
        let window = cfg.sliding_window;
        Ok(match (self.drafter, &m.mtp, &m.dspark) {
            (DraftModel::Mtp, Some(mtp), _) => {
                let ring = self.draft_rings[0];
                let graph = |head| mtp::record(cfg, &m.weights, mtp, ring, self.numerics, head);
                let target = forward::final_state(cfg);
                let r = MtpRunner::open(backend, target, graph(true), graph(false), window)?;
                Some(Drafter::new(Box::new(r), window))
            }
            (DraftModel::Dspark, _, Some(ds)) => {
                let rings = &self.draft_rings;
                let attn = forward::attn_options(self.numerics);
                let seed = dspark::record_seed(cfg, ds, rings, attn, window);
                let draft = dspark::record_draft(cfg, &m.weights, ds, rings, self.numerics);
                let markov = dspark::record_markov(cfg, ds);
                let taps = dspark::tap_values(&ds.config, &[]);
                let r = DsparkRunner::open(backend, cfg, ds, taps, seed, draft, markov)?;
                Some(Drafter::new(Box::new(r), window))
            }
            _ => None,
        })
    }

    /// ds4's session payload (KVCACHE.md §4.3) of state set `set`.
    fn save(&self, at: Saving<'_>) -> Result<Vec<u8>, SessionError> {
        let (backend, set, tokens, logits) = (at.backend, at.set, at.tokens, at.logits);
        let frame = at.frame;
        let cfg = &self.model.config;
        let t = tokens.len();
        let w = self.raw_window(frame.ctx);
        let raw_live = t.min(w);
        let (hd, ihd) = (cfg.head_dim, cfg.indexer_head_dim);
        let header = [
            SNAPSHOT_MAGIC,
            VERSION,
            frame.ctx as u32,
            frame.prefill_chunk as u32,
            w as u32,
            w as u32,
            (frame.ctx / self.min_ratio() + 2) as u32,
            t as u32,
            cfg.n_layer as u32,
            hd as u32,
            ihd as u32,
            cfg.n_vocab as u32,
            raw_live as u32,
        ];
        let mut out = begin_payload(&header, tokens, logits)?;
        let kinds: Vec<AttentionKind> = self.model.weights.layers.iter().map(|l| l.kind).collect();
        for k in &kinds {
            put_u32(
                &mut out,
                if k.ratio() > 0 {
                    (t / k.ratio()) as u32
                } else {
                    0
                },
            );
        }
        for k in &kinds {
            put_u32(
                &mut out,
                if matches!(k, AttentionKind::Csa { .. }) {
                    (t / k.ratio()) as u32
                } else {
                    0
                },
            );
        }
        for (l, ls) in self.kv.layers.iter().enumerate() {
            // The live ring slots are 0..raw_live (all of them once the
            // window is full), in position order from slot t % w.
            let ring = backend.read_set_rows(set, ls.ring, 0..raw_live)?;
            for pos in t - raw_live..t {
                let s = pos % w;
                put_f32s(&mut out, &ring[s * hd..(s + 1) * hd]);
            }
            let ratio = kinds[l].ratio();
            for (c, dim) in [(ls.compressor, hd), (ls.indexer, ihd)] {
                let Some(c) = c else { continue };
                let n = t / ratio;
                if n > 0 {
                    let rows = backend.read_set_rows(set, c.rows, 0..n)?;
                    debug_assert_eq!(rows.len(), n * dim);
                    put_f32s(&mut out, &rows);
                }
                for s in [c.kv, c.score] {
                    put_whole_state(&mut out, backend, set, s)?;
                }
            }
        }
        Ok(out)
    }

    /// Reads a payload made by `save` into state set `set`.
    fn load(&mut self, at: Loading<'_>) -> Result<(Vec<u32>, Vec<f32>), SessionError> {
        let (backend, set, payload, frame) = (at.backend, at.set, at.payload, at.frame);
        let bad = |m: String| SessionError::Snapshot(m);
        let cfg = self.model.config.clone();
        let (mut r, h) = Reader::header::<HEADER_FIELDS>(payload, false)?;
        if h[0] != SNAPSHOT_MAGIC || h[1] != VERSION {
            return Err(bad(format!(
                "not a ds4 session payload (magic {:#x}, version {})",
                h[0], h[1]
            )));
        }
        let t = h[7] as usize;
        check_fits(h[2] as usize, t, frame.ctx)?;
        let want = [cfg.n_layer, cfg.head_dim, cfg.indexer_head_dim, cfg.n_vocab];
        if h[8..12].iter().zip(want).any(|(&a, b)| a as usize != b) {
            return Err(bad(format!(
                "different model layout: {:?} vs {:?}",
                &h[8..12],
                want
            )));
        }
        let w = self.raw_window(frame.ctx);
        let raw_live = h[12] as usize;
        if h[5] as usize != w || raw_live != t.min(w) {
            return Err(bad(format!(
                "raw window {} / live rows {raw_live} do not match window {w}",
                h[5]
            )));
        }
        let (tokens, logits) = r.tokens_and_logits(t, cfg.n_vocab)?;
        let n_comp: Vec<u32> = (0..cfg.n_layer)
            .map(|_| r.u32("compressed row counts"))
            .collect::<Result<_, _>>()?;
        let n_index: Vec<u32> = (0..cfg.n_layer)
            .map(|_| r.u32("indexer row counts"))
            .collect::<Result<_, _>>()?;
        backend.reset_set(set)?;
        let (hd, ihd) = (cfg.head_dim, cfg.indexer_head_dim);
        let layers = self.kv.layers.clone();
        for (l, ls) in layers.iter().enumerate() {
            let rows = r.f32s(raw_live * hd, "raw rows")?;
            // Positions t - raw_live..t fill ring slots 0..raw_live; the
            // rest keep their fresh value.
            let mut ring = vec![0.0; raw_live * hd];
            for (i, pos) in (t - raw_live..t).enumerate() {
                let s = pos % w;
                ring[s * hd..(s + 1) * hd].copy_from_slice(&rows[i * hd..(i + 1) * hd]);
            }
            backend.write_set_rows(set, ls.ring, 0, &ring)?;
            let kind = self.model.weights.layers[l].kind;
            let ratio = kind.ratio();
            for (c, dim, count) in [
                (ls.compressor, hd, n_comp[l]),
                (ls.indexer, ihd, n_index[l]),
            ] {
                let Some(c) = c else {
                    if count != 0 {
                        return Err(bad(format!(
                            "layer {l}: {count} rows for a layer without them"
                        )));
                    }
                    continue;
                };
                let n = count as usize;
                if n != t / ratio {
                    return Err(bad(format!(
                        "layer {l}: {n} compressed rows for {t} tokens at ratio {ratio}"
                    )));
                }
                if n > state_desc(backend.state_layout(), c.rows)?.rows {
                    return Err(bad(format!("layer {l}: {n} rows exceed the capacity")));
                }
                let rows = r.f32s(n * dim, "compressed rows")?;
                if n > 0 {
                    backend.write_set_rows(set, c.rows, 0, &rows)?;
                }
                for s in [c.kv, c.score] {
                    r.whole_state(backend, set, s, "compressor state")?;
                }
            }
        }
        r.end()?;
        Ok((tokens, logits))
    }
}

impl V4Net {
    fn raw_window(&self, ctx: usize) -> usize {
        self.model.config.sliding_window.min(ctx)
    }

    fn min_ratio(&self) -> usize {
        self.model
            .config
            .compress_ratios
            .iter()
            .copied()
            .filter(|&r| r > 0)
            .min()
            .unwrap_or(4)
    }
}
