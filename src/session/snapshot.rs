//! Session snapshots in ds4's payload layout (KVCACHE.md §4.3), generalised
//! from Flash's fixed shapes to the model's configuration: 13 u32 header
//! fields, then tokens, logits, per-layer row counts and per-layer state.

use super::{Net, Session, SessionError};
use crate::backend::{state_desc, Backend};
use crate::model::state::KvLayout;
use crate::model::{AttentionKind, ModelFile};

/// `D S V 4` little-endian.
pub const SNAPSHOT_MAGIC: u32 = 0x3456_5344;
/// `D S 4 1` little-endian: the first word of a V4.1 session payload
/// (`session/v41.rs`).
pub const V41_SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"DS41");
const VERSION: u32 = 1;
const HEADER_FIELDS: usize = 13;

/// Refuses a payload of the other family by its first word: `v41` says
/// whether the session is V4.1.
pub(super) fn refuse_other_arch(magic: u32, v41: bool) -> Result<(), SessionError> {
    let (theirs, ours) = match (magic, v41) {
        (SNAPSHOT_MAGIC, true) => ("DeepSeek V4 (deepseek4)", "V4.1 (deepseek41)"),
        (V41_SNAPSHOT_MAGIC, false) => ("DeepSeek V4.1 (deepseek41)", "V4 (deepseek4)"),
        _ => return Ok(()),
    };
    Err(SessionError::Snapshot(format!(
        "this checkpoint holds a {theirs} session; the loaded model is {ours}: refused, nothing loaded"
    )))
}

/// A payload being read, with the position reached.
pub(super) struct Reader<'a> {
    pub b: &'a [u8],
    pub pos: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, n: usize, what: &str) -> Result<&[u8], SessionError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                SessionError::Snapshot(format!("truncated payload while reading {what}"))
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, SessionError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, SessionError> {
        let len = n
            .checked_mul(4)
            .ok_or_else(|| SessionError::Snapshot(format!("{what}: size overflows")))?;
        Ok(self
            .bytes(len, what)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// What a snapshot needs to know of a session besides its state: the
/// model, the state layout and the session's context and prefill chunk.
/// [`Session`] and each slot of a [`super::Batch`] (its own state set of a
/// shared backend) save and load through it.
pub(super) struct Store<'a> {
    pub model: &'a ModelFile,
    pub kv: &'a KvLayout,
    pub ctx: usize,
    pub prefill_chunk: usize,
}

impl Session {
    /// Serialises the whole session (tokens, logits, every KV state).
    pub fn save_snapshot(&self) -> Result<Vec<u8>, SessionError> {
        let (ctx, chunk) = (self.opts.ctx, self.opts.prefill_chunk);
        let b = self.backend.as_ref();
        match &self.net {
            Net::V4 { model, kv } => Store {
                model,
                kv,
                ctx,
                prefill_chunk: chunk,
            }
            .save(b, 0, &self.tokens, &self.logits),
            Net::V41(n) => n.save(b, 0, &self.tokens, &self.logits, ctx, chunk),
        }
    }

    /// Replaces the session with a snapshot made by [`Session::save_snapshot`]
    /// for the same model. A payload of the other model family (V4 for a
    /// V4.1 session or the reverse) is refused by its first word. On error
    /// the session is left empty.
    pub fn load_snapshot(&mut self, payload: &[u8]) -> Result<(), SessionError> {
        let ctx = self.opts.ctx;
        let chunk = self.opts.prefill_chunk;
        let r = match &mut self.net {
            Net::V4 { model, kv } => Store {
                model,
                kv,
                ctx,
                prefill_chunk: chunk,
            }
            .load(self.backend.as_mut(), 0, payload),
            Net::V41(n) => n.load(self.backend.as_mut(), 0, payload, ctx),
        };
        match r {
            Ok((tokens, logits)) => {
                self.tokens = tokens;
                self.logits = logits;
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }
}

impl Store<'_> {
    fn raw_window(&self) -> usize {
        self.model.config.sliding_window.min(self.ctx)
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

    /// Serialises state set `set` of `backend` with the session's tokens
    /// and logits.
    pub fn save(
        &self,
        backend: &dyn Backend,
        set: usize,
        tokens: &[u32],
        logits: &[f32],
    ) -> Result<Vec<u8>, SessionError> {
        let cfg = &self.model.config;
        let t = tokens.len();
        if t == 0 {
            return Err(SessionError::Snapshot("the session holds no tokens".into()));
        }
        let w = self.raw_window();
        let raw_live = t.min(w);
        let (hd, ihd) = (cfg.head_dim, cfg.indexer_head_dim);
        let mut out = Vec::new();
        for v in [
            SNAPSHOT_MAGIC,
            VERSION,
            self.ctx as u32,
            self.prefill_chunk as u32,
            w as u32,
            w as u32,
            (self.ctx / self.min_ratio() + 2) as u32,
            t as u32,
            cfg.n_layer as u32,
            hd as u32,
            ihd as u32,
            cfg.n_vocab as u32,
            raw_live as u32,
        ] {
            put_u32(&mut out, v);
        }
        for &tok in tokens {
            put_u32(&mut out, tok);
        }
        put_f32s(&mut out, logits);
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
                    let d = state_desc(backend.state_layout(), s)?;
                    put_f32s(&mut out, &backend.read_set_rows(set, s, 0..d.rows)?);
                }
            }
        }
        Ok(out)
    }

    /// Reads a snapshot into state set `set` of `backend`; returns the
    /// tokens and logits it holds. On error the set is in an undefined
    /// state (the caller resets it).
    pub fn load(
        &self,
        backend: &mut dyn Backend,
        set: usize,
        payload: &[u8],
    ) -> Result<(Vec<u32>, Vec<f32>), SessionError> {
        let bad = |m: String| SessionError::Snapshot(m);
        let cfg = self.model.config.clone();
        let mut r = Reader { b: payload, pos: 0 };
        let mut h = [0u32; HEADER_FIELDS];
        for (i, f) in h.iter_mut().enumerate() {
            *f = r.u32(&format!("header field {i}"))?;
            if i == 0 {
                refuse_other_arch(*f, false)?;
            }
        }
        if h[0] != SNAPSHOT_MAGIC || h[1] != VERSION {
            return Err(bad(format!(
                "not a ds4 session payload (magic {:#x}, version {})",
                h[0], h[1]
            )));
        }
        let (saved_ctx, t) = (h[2] as usize, h[7] as usize);
        if saved_ctx > self.ctx || t >= self.ctx || t == 0 {
            return Err(bad(format!(
                "saved with context {saved_ctx} and {t} tokens; this session's context is {}",
                self.ctx
            )));
        }
        let want = [cfg.n_layer, cfg.head_dim, cfg.indexer_head_dim, cfg.n_vocab];
        if h[8..12].iter().zip(want).any(|(&a, b)| a as usize != b) {
            return Err(bad(format!(
                "different model layout: {:?} vs {:?}",
                &h[8..12],
                want
            )));
        }
        let w = self.raw_window();
        let raw_live = h[12] as usize;
        if h[5] as usize != w || raw_live != t.min(w) {
            return Err(bad(format!(
                "raw window {} / live rows {raw_live} do not match window {w}",
                h[5]
            )));
        }
        let tokens: Vec<u32> = (0..t)
            .map(|i| r.u32(&format!("token {i}")))
            .collect::<Result<_, _>>()?;
        if let Some(&id) = tokens.iter().find(|&&x| x as usize >= cfg.n_vocab) {
            return Err(SessionError::BadToken {
                id,
                vocab: cfg.n_vocab,
            });
        }
        let logits = r.f32s(cfg.n_vocab, "logits")?;
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
                    let d = state_desc(backend.state_layout(), s)?;
                    let v = r.f32s(d.rows * d.cols, "compressor state")?;
                    backend.write_set_rows(set, s, 0, &v)?;
                }
            }
        }
        if r.pos != payload.len() {
            return Err(bad(format!(
                "{} trailing payload bytes",
                payload.len() - r.pos
            )));
        }
        Ok((tokens, logits))
    }
}
