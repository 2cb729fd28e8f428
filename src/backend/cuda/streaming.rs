//! SSD streaming on CUDA (`--ssd-streaming`, docs/SSD_STREAMING.md): each
//! streamed layer's routed experts live in device slots (one allocation of
//! `slots` expert slabs per part instead of the whole tensors), the slot
//! table ([`SlotTable`]) says which expert each slot holds, and the routed
//! kernels (cuda/moe.cu) run over the slots with the selection rewritten
//! to slot ids.
//!
//! A streamed layer's launches are recorded like any other, marked by a
//! [`StreamPoint`]; a step enqueues the list up to a point, learns the
//! pass's experts (a hash layer's from the token ids; a learned router's
//! by waiting for the stream and reading its selection back), pins the
//! misses in the [`ExpertCache`](crate::backend::experts::ExpertCache)
//! (reads, read-ahead, counters, faults as on the CPU), copies them into
//! their slots on the stream (ordered before the pass's launches) and goes
//! on. No CUDA graph is captured for a streaming backend: the list is
//! split at every streamed layer. The bytes are the file's, so the logits
//! are bit-identical with streaming on and off.

use std::collections::HashMap;

use cudarc::driver::sys::CUdeviceptr;

use super::mem::{download, upload_async, DevBuf};
use super::CudaBackend;
use crate::backend::experts::device::{Round, SlotTable};
use crate::backend::experts::{distinct_experts, HashTable};
use crate::backend::BackendError;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::Graph;

/// One streamed layer's slots on the device.
pub struct StreamedLayer {
    /// `gate`, `up`, `down` slots: `slots` slabs each.
    parts: [DevBuf; 3],
    /// Bytes of one slab of each part.
    slab: [u64; 3],
    refs: [TensorRef; 3],
    pub slots: usize,
    table: SlotTable,
}

impl StreamedLayer {
    /// The device address of part `t`'s slots (`None`: not this layer's).
    pub fn ptr(&self, t: &TensorRef) -> Option<CUdeviceptr> {
        let p = self.refs.iter().position(|r| r.offset == t.offset)?;
        Some(self.parts[p].ptr)
    }
}

/// Where a streamed layer's routed pass sits in a launch list.
pub struct StreamPoint {
    /// Its first launch (gate/up rows).
    pub first: usize,
    /// Its `expert_sum` launch; the launches before it (from `first`) are
    /// the per-slot rows, run once per round.
    pub sum: usize,
    pub gate: u64,
    pub k: usize,
    pub n_expert: usize,
    /// The router's selection.
    pub selected: CUdeviceptr,
    /// The slot-id selection the pass's kernels read.
    pub slot_sel: CUdeviceptr,
    /// A hash layer's table: the selection follows from the token ids.
    pub hash: Option<HashTable>,
}

fn weights_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Weights(e.to_string())
}

impl CudaBackend {
    /// Registers `graph`'s routed layers with the cache (the first graph
    /// plans it: a budget below one token's experts is refused here) and
    /// gives each streamed layer its device slots, preloaded unless cold.
    pub(super) fn stream_layers(&mut self, graph: &Graph) -> Result<(), BackendError> {
        let Some(cache) = self.experts.clone() else {
            return Ok(());
        };
        let file = self.file.clone();
        let file: &GgufFile = (*file).as_ref();
        let Some((plan, layers)) = cache
            .layers_for_slots(file, graph, |gate| self.streamed.contains_key(&gate))
            .map_err(BackendError::Weights)?
        else {
            return Ok(());
        };
        for layer in layers {
            let gate = layer.parts[0].offset;
            let slab = [0, 1, 2].map(|p| layer.parts[p].n_bytes / layer.n_expert.max(1) as u64);
            let parts = [
                DevBuf::alloc((slab[0] * plan.slots as u64).max(4) as usize)?,
                DevBuf::alloc((slab[1] * plan.slots as u64).max(4) as usize)?,
                DevBuf::alloc((slab[2] * plan.slots as u64).max(4) as usize)?,
            ];
            let mut l = StreamedLayer {
                parts,
                slab,
                refs: layer.parts.clone(),
                slots: plan.slots,
                table: SlotTable::new(plan.slots, self.stream_policy),
            };
            if let Some((list, pinned)) = cache.read_preload(file, gate).map_err(weights_err)? {
                for round in l.table.plan(&list) {
                    upload(&l, &round, &|e, p| pinned.part(e, p), self.dev.stream)?;
                }
                self.dev.sync()?;
            }
            self.streamed.insert(gate, l);
        }
        Ok(())
    }

    /// Whether expert `e` of the layer at `gate` is in device memory.
    pub(super) fn on_device(&self, gate: u64, e: u32) -> bool {
        self.streamed.get(&gate).is_some_and(|l| l.table.holds(e))
    }

    /// Enqueues graph `h`'s launch list for `tokens`, stopping at each
    /// streamed layer to bring its experts into their slots.
    pub(super) fn enqueue_streaming(
        &mut self,
        h: usize,
        tokens: &[u32],
        segs: &[crate::graph::Segment],
    ) -> Result<(), BackendError> {
        let n = tokens.len() as u32;
        let g = &self.graphs[h];
        let mut at = 0;
        for i in 0..g.points.len() {
            let g = &self.graphs[h];
            let p = &g.points[i];
            self.enqueue(&g.launches[at..p.first], n, Some(segs))?;
            let rounds = self.stream_pass(h, i, tokens)?;
            let g = &self.graphs[h];
            let p = &g.points[i];
            // Copies and launches share the stream, so a round's uploads
            // run after the previous round's launches (which may have used
            // the same slots).
            for (round, slots) in &rounds {
                let staged = |e, part| self.staged.as_ref().and_then(|s| s.part(e, part));
                upload(&self.streamed[&p.gate], round, &staged, self.dev.stream)?;
                upload_async(p.slot_sel, bytemuck::cast_slice(slots), self.dev.stream)?;
                self.enqueue(&g.launches[p.first..p.sum], n, Some(segs))?;
            }
            self.staged = None;
            at = p.sum;
        }
        let g = &self.graphs[h];
        self.enqueue(&g.launches[at..], n, Some(segs))
    }

    /// The rounds of streamed pass `i` of graph `h` (with their slot-id
    /// selections); the misses are pinned in `self.staged`.
    fn stream_pass(
        &mut self,
        h: usize,
        i: usize,
        tokens: &[u32],
    ) -> Result<Vec<(Round, Vec<i32>)>, BackendError> {
        let file = self.file.clone();
        let file: &GgufFile = (*file).as_ref();
        let p = &self.graphs[h].points[i];
        let sel = match p.hash.as_ref().and_then(|h| h.selection(file, tokens, p.k)) {
            Some(s) => s,
            None => {
                // A learned router: wait for its choice on the device.
                self.dev.sync()?;
                let mut raw = vec![0i32; tokens.len() * p.k];
                download(p.selected, bytemuck::cast_slice_mut(&mut raw))?;
                raw
            }
        };
        let want = distinct_experts(&sel, p.n_expert);
        let (gate, n_expert) = (p.gate, p.n_expert);
        let cache = self
            .experts
            .clone()
            .ok_or_else(|| weights_err("ssd streaming: no expert cache"))?;
        let layer = self
            .streamed
            .get_mut(&gate)
            .ok_or_else(|| weights_err("ssd streaming: a routed layer without slots"))?;
        let table = &layer.table;
        let pinned = cache
            .pin_experts(gate, &want, tokens.len() == 1, &|e| table.holds(e))
            .map_err(weights_err)?;
        // Every upload below can be made (the pinned set holds each miss),
        // so the table may move now.
        if let Some(e) = want
            .iter()
            .find(|&&e| !table.holds(e) && pinned.as_ref().and_then(|s| s.part(e, 0)).is_none())
        {
            return Err(weights_err(format!(
                "ssd streaming: expert {e} was not read"
            )));
        }
        let mut rounds = layer.table.plan(&want);
        if rounds.is_empty() {
            rounds.push(Round {
                slot_of: HashMap::new(),
                uploads: Vec::new(),
            });
        }
        self.staged = pinned;
        Ok(rounds
            .into_iter()
            .map(|r| {
                let s = r.slot_selection(&sel, n_expert);
                (r, s)
            })
            .collect())
    }
}

/// Copies the uploads of `round` into their slots on `stream`.
fn upload<'a>(
    l: &StreamedLayer,
    round: &Round,
    part: &dyn Fn(u32, usize) -> Option<&'a [u8]>,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), BackendError> {
    for &(e, slot) in &round.uploads {
        for p in 0..3 {
            let bytes = part(e, p).ok_or_else(|| {
                weights_err(format!(
                    "ssd streaming: expert {e} of {} was not read",
                    l.refs[p].name
                ))
            })?;
            if bytes.len() as u64 != l.slab[p] {
                return Err(weights_err(format!(
                    "ssd streaming: {} slab of {} bytes, {} read",
                    l.refs[p].name,
                    l.slab[p],
                    bytes.len()
                )));
            }
            upload_async(l.parts[p].ptr + slot as u64 * l.slab[p], bytes, stream)?;
        }
    }
    Ok(())
}
