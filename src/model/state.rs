//! The persistent KV state of a session, per layer (MODEL.md §2, §4):
//! the raw sliding-window ring, compressed rows, and compressor frontiers.

use super::{AttentionKind, ModelConfig, Weights};
use crate::graph::ops::compress::EMPTY_SCORE;
use crate::graph::{StateId, StateLayout};

/// State buffers of one compressor.
#[derive(Clone, Copy, Debug)]
pub struct CompressorState {
    /// Emitted rows, `capacity × head_dim`.
    pub rows: StateId,
    /// Frontier slots, `coff·ratio × coff·head_dim` values and scores.
    pub kv: StateId,
    pub score: StateId,
}

#[derive(Clone, Copy, Debug)]
pub struct LayerState {
    /// Raw KV rows of the last `window` positions, slot = position mod window.
    pub ring: StateId,
    pub compressor: Option<CompressorState>,
    pub indexer: Option<CompressorState>,
}

/// The state layout of a model for a session context of `ctx` tokens.
#[derive(Clone, Debug)]
pub struct KvLayout {
    pub ctx: usize,
    pub layout: StateLayout,
    pub layers: Vec<LayerState>,
}

impl KvLayout {
    /// Marks the cached rows (raw ring, compressed and indexer rows) as
    /// holding only f16 values: true under model numerics, where every row
    /// is rounded to f16 before it is stored (MODEL.md, model numerics).
    /// Compressor frontiers hold unrounded values and stay f32.
    pub fn mark_f16_rows(&mut self) {
        for l in &self.layers {
            self.layout.mark_f16_values(l.ring);
            for c in [l.compressor, l.indexer].into_iter().flatten() {
                self.layout.mark_f16_values(c.rows);
            }
        }
    }
}

/// Compressed-row capacity for `ctx` tokens at `ratio` (ds4's allocation).
pub fn compressed_capacity(ctx: usize, ratio: usize) -> usize {
    ctx / ratio + 2
}

impl KvLayout {
    pub fn new(cfg: &ModelConfig, w: &Weights, ctx: usize) -> KvLayout {
        let mut layout = StateLayout::default();
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (l, lw) in w.layers.iter().enumerate() {
            let ring = layout.add("kv_ring", Some(l), cfg.sliding_window, cfg.head_dim, 0.0);
            let ratio = lw.kind.ratio();
            let comp = |name: &str, hd: usize, overlapped: bool, layout: &mut StateLayout| {
                let coff = if overlapped { 2 } else { 1 };
                CompressorState {
                    rows: layout.add(
                        &format!("{name}_rows"),
                        Some(l),
                        compressed_capacity(ctx, ratio),
                        hd,
                        0.0,
                    ),
                    kv: layout.add(
                        &format!("{name}_state_kv"),
                        Some(l),
                        coff * ratio,
                        coff * hd,
                        0.0,
                    ),
                    score: layout.add(
                        &format!("{name}_state_score"),
                        Some(l),
                        coff * ratio,
                        coff * hd,
                        EMPTY_SCORE,
                    ),
                }
            };
            let (compressor, indexer) = match lw.kind {
                AttentionKind::Window => (None, None),
                AttentionKind::Hca { .. } => {
                    (Some(comp("comp", cfg.head_dim, false, &mut layout)), None)
                }
                AttentionKind::Csa { .. } => (
                    Some(comp("comp", cfg.head_dim, true, &mut layout)),
                    Some(comp("index", cfg.indexer_head_dim, true, &mut layout)),
                ),
            };
            layers.push(LayerState {
                ring,
                compressor,
                indexer,
            });
        }
        KvLayout {
            ctx,
            layout,
            layers,
        }
    }

    /// Total state size in bytes (f32).
    pub fn bytes(&self) -> usize {
        self.layout.bytes()
    }
}
