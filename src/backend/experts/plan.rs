//! What the cache streams: the routed layers of a graph as the cache sees
//! them ([`ExpertLayer`]) and the resident/streamed arithmetic of the
//! start-up line ([`StreamPlan`]).

use crate::backend::options::{CacheBudget, StreamingOptions};
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops::moe::MoeExperts;
use crate::graph::ops::Op;
use crate::graph::Graph;

/// One routed layer as the cache sees it: the three expert tensors, the
/// expert count, the experts a token selects and the hash table, if any.
#[derive(Clone, Debug)]
pub struct ExpertLayer {
    /// `gate`, `up`, `down` (each `n_expert` equal slabs).
    pub parts: [TensorRef; 3],
    pub n_expert: usize,
    /// Experts one token selects.
    pub k: usize,
    /// The token → experts table of a hash layer (`tid2eid`).
    pub hash: Option<TensorRef>,
}

impl ExpertLayer {
    /// The layer of a routed-expert op (`hash` from its router).
    pub fn of(o: &MoeExperts, hash: Option<TensorRef>) -> ExpertLayer {
        ExpertLayer {
            parts: [o.gate.clone(), o.up.clone(), o.down.clone()],
            n_expert: o.dims().n_expert,
            k: o.k,
            hash,
        }
    }

    /// Bytes of part `p`'s slab of one expert.
    pub(super) fn part_bytes(&self, p: usize) -> u64 {
        self.parts[p].n_bytes / self.n_expert.max(1) as u64
    }

    /// Bytes of one expert's slice (its three slabs).
    pub fn slice_bytes(&self) -> u64 {
        (0..3).map(|p| self.part_bytes(p)).sum()
    }

    /// Every expert's bytes.
    pub fn routed_bytes(&self) -> u64 {
        self.parts.iter().map(|t| t.n_bytes).sum()
    }

    /// The experts of `tokens` in this hash layer, in first-use order
    /// (empty for a learned-router layer; ids outside the table skipped).
    pub(super) fn hash_experts(&self, file: &GgufFile, tokens: &[u32]) -> Vec<u32> {
        let Some(t) = &self.hash else {
            return Vec::new();
        };
        let cols = t.ne[0] as usize;
        let bytes = t.bytes(file);
        let mut out = Vec::new();
        for &tok in tokens {
            let base = tok as usize * cols * 4;
            for i in 0..self.k.min(cols) {
                let Some(b) = bytes.get(base + 4 * i..base + 4 * i + 4) else {
                    break;
                };
                let e = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if e >= 0 && (e as usize) < self.n_expert && !out.contains(&(e as u32)) {
                    out.push(e as u32);
                }
            }
        }
        out
    }

    /// Experts in the order a preload takes them: by how many token ids
    /// the hash table sends to each (a hash layer's traffic follows that),
    /// else by index (no prior for a learned router).
    pub(super) fn popularity_order(&self, file: &GgufFile) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.n_expert as u32).collect();
        if let Some(t) = &self.hash {
            let mut count = vec![0u64; self.n_expert];
            let cols = t.ne[0] as usize;
            for row in t.bytes(file).chunks_exact(4 * cols.max(1)) {
                for b in row.chunks_exact(4).take(self.k) {
                    let e = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if e >= 0 && (e as usize) < self.n_expert {
                        count[e as usize] += 1;
                    }
                }
            }
            order.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
        }
        order
    }
}

/// The table of a hash router (`tid2eid`) that writes a routed pass's
/// selection from the step's token ids alone: a streaming backend knows
/// which experts the pass needs before anything runs.
#[derive(Clone, Debug)]
pub struct HashTable {
    pub table: TensorRef,
    /// Experts per token id (the row length).
    pub cols: usize,
}

impl HashTable {
    /// The hash router's table for `o`'s selection, if a hash router
    /// reading the step's token ids writes it.
    pub fn of(graph: &Graph, o: &MoeExperts) -> Option<HashTable> {
        graph.ops().find_map(|op| match op {
            Op::Router(r) if r.selected == o.selected && r.tokens == graph.tokens => {
                r.tid2eid.clone().map(|table| HashTable {
                    table,
                    cols: r.table_cols(),
                })
            }
            _ => None,
        })
    }

    /// The selection for `tokens`, `k` experts each (what the router
    /// writes); `None` if a token id lies past the table.
    pub fn selection(&self, file: &GgufFile, tokens: &[u32], k: usize) -> Option<Vec<i32>> {
        let bytes = self.table.bytes(file);
        let mut sel = Vec::with_capacity(tokens.len() * k);
        for &tok in tokens {
            for i in 0..k {
                let at = (tok as usize * self.cols + i) * 4;
                let b = bytes.get(at..at + 4)?;
                sel.push(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
        Some(sel)
    }
}

/// The routed layers of a graph, in the order they run.
pub fn graph_layers(graph: &Graph) -> Vec<ExpertLayer> {
    let mut out = Vec::new();
    let mut hash = None;
    for node in &graph.nodes {
        match node {
            crate::graph::Node::Op(Op::Router(r)) => hash = r.tid2eid.clone(),
            crate::graph::Node::Op(Op::MoeExperts(o)) => {
                out.push(ExpertLayer::of(o, hash.take()));
            }
            _ => {}
        }
    }
    out
}

/// What stays resident and what streams, from the file, its routed layers
/// and the options: the start-up line's figures. Pure arithmetic, so the
/// full-shape header test checks it for the 81 GiB file.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamPlan {
    pub file_bytes: u64,
    pub layers: usize,
    /// Routed layers kept whole (the first `full_layers`).
    pub full_layers: usize,
    /// Experts per layer (the largest layer's).
    pub n_expert: usize,
    /// Experts one token selects per layer (the largest).
    pub k: usize,
    /// Cache slots per streamed layer.
    pub slots: usize,
    /// One expert slice in every streamed layer (the bytes of one slot
    /// across the cache).
    pub slot_bytes: u64,
    /// Every routed byte of the streamed layers.
    pub streamed_bytes: u64,
    /// The cache: `slots × slot_bytes`.
    pub cache_bytes: u64,
    /// Everything else: non-expert weights, metadata and full layers.
    pub resident_bytes: u64,
    /// Routed bytes one decoded token reads in the streamed layers.
    pub active_bytes: u64,
}

impl StreamPlan {
    /// The plan for `layers` of a file of `file_bytes`; an error naming
    /// the smallest budget that works when the cache cannot hold one
    /// token's experts of a layer.
    pub fn new(
        file_bytes: u64,
        layers: &[ExpertLayer],
        o: &StreamingOptions,
    ) -> Result<StreamPlan, String> {
        let full_layers = o.full_layers.min(layers.len());
        let streamed = &layers[full_layers..];
        let n_expert = streamed.iter().map(|l| l.n_expert).max().unwrap_or(0);
        let k = streamed.iter().map(|l| l.k).max().unwrap_or(0);
        let slot_bytes: u64 = streamed.iter().map(|l| l.slice_bytes()).sum();
        let streamed_bytes: u64 = streamed.iter().map(|l| l.routed_bytes()).sum();
        let slots = match o.budget {
            _ if slot_bytes == 0 => n_expert,
            CacheBudget::Experts(n) => n.min(n_expert),
            CacheBudget::Bytes(b) => ((b / slot_bytes) as usize).min(n_expert),
        };
        if slots < k {
            let min = k as u64 * slot_bytes;
            return Err(format!(
                "--ssd-streaming-cache-experts: the cache holds {slots} expert(s) per layer, \
                 but one token uses {k} in every layer; the minimum is {k} \
                 (--ssd-streaming-cache-experts {k}, or {} MiB)",
                min.div_ceil(1 << 20)
            ));
        }
        Ok(StreamPlan {
            file_bytes,
            layers: layers.len(),
            full_layers,
            n_expert,
            k,
            slots,
            slot_bytes,
            streamed_bytes,
            cache_bytes: slots as u64 * slot_bytes,
            resident_bytes: file_bytes.saturating_sub(streamed_bytes),
            active_bytes: k as u64 * slot_bytes,
        })
    }

    /// The hit rate if routing were uniform: slots ÷ experts (the start-up
    /// estimate before anything is measured).
    pub fn uniform_hit_rate(&self) -> f64 {
        if self.n_expert == 0 {
            1.0
        } else {
            self.slots as f64 / self.n_expert as f64
        }
    }

    /// Routed bytes read from disk per decoded token at `hit_rate`.
    pub fn bytes_per_token(&self, hit_rate: f64) -> f64 {
        self.active_bytes as f64 * (1.0 - hit_rate).max(0.0)
    }

    /// The start-up line: resident bytes, cache budget, slices that fit,
    /// expected reads per token at `hit_rate`.
    pub fn line(&self, hit_rate: f64, direct: bool) -> String {
        format!(
            "ssd streaming: {} resident ({} of {} routed layers whole), cache {} = \
             {} of {} experts × {} streamed layers ({:.0} % of {} routed), \
             ~{:.1} MiB read per token at a {:.0} % hit rate, {} reads",
            size(self.resident_bytes),
            self.full_layers,
            self.layers,
            size(self.cache_bytes),
            self.slots,
            self.n_expert,
            self.layers - self.full_layers,
            100.0 * self.cache_bytes as f64 / self.streamed_bytes.max(1) as f64,
            size(self.streamed_bytes),
            self.bytes_per_token(hit_rate) / (1u64 << 20) as f64,
            100.0 * hit_rate,
            if direct { "direct" } else { "buffered" },
        )
    }
}

/// Bytes as GiB from 1 GiB up, else MiB.
pub(super) fn size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}
