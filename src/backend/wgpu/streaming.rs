//! SSD streaming on wgpu (`--ssd-streaming`, docs/SSD_STREAMING.md): each
//! streamed layer's routed experts live in device slots
//! ([`GpuTensor::slots`]: `slots` expert slabs per part instead of the whole
//! tensors), the slot table ([`SlotTable`]) says which expert each slot
//! holds, and the routed kernels run unchanged over the slots with the
//! selection rewritten to slot ids.
//!
//! A routed pass ([`WgpuBackend::routed_pass`]) learns its experts either
//! from the token ids (a hash layer: `tid2eid`, so nothing waits on the
//! device) or by reading the router's selection back (one submit and wait:
//! layer L+1's choice is not known before layer L's output); it pins the
//! misses in the [`ExpertCache`](crate::backend::experts::ExpertCache) (positioned reads, read-ahead, counters,
//! faults are the CPU backends'), queues their upload with
//! `Queue::write_buffer` (staged by wgpu, ordered before the pass's
//! dispatches) and records the dispatches. The bytes are the file's, so the
//! logits are bit-identical with streaming on and off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::matmul::{BufRange, RoutedExperts};
use super::weights::GpuTensor;
use super::WgpuBackend;
use crate::backend::experts::device::{Round, SlotTable};
use crate::backend::experts::{distinct_experts, HashTable};

use crate::backend::BackendError;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::Graph;

/// One streamed layer on the device.
pub struct StreamedLayer {
    /// `gate`, `up`, `down` slots.
    pub parts: [Arc<GpuTensor>; 3],
    /// The file's tensors (to find the slabs in a pinned set).
    refs: [TensorRef; 3],
    table: SlotTable,
}

/// A routed pass over a streamed layer, in a recorded dispatch list.
pub struct StreamedExperts {
    /// The layer (its `gate` tensor's file offset).
    pub gate: u64,
    pub k: usize,
    pub n_expert: usize,
    /// The router's selection (read back for a learned router).
    pub selected: BufRange,
    /// A hash layer's table: the selection follows from the token ids.
    pub hash: Option<HashTable>,
    /// The selection as slot ids, bound where the kernels read `selected`.
    pub slot_sel: wgpu::Buffer,
    pub experts: RoutedExperts,
}

fn weights_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Weights(e.to_string())
}

impl WgpuBackend {
    /// Registers `graph`'s routed layers with the cache (the first graph
    /// plans it: a budget below one token's experts is refused here) and
    /// gives each streamed layer its device slots, preloaded unless cold.
    pub(super) fn stream_layers(&mut self, graph: &Graph) -> Result<(), BackendError> {
        let Some(cache) = self.experts.clone() else {
            return Ok(());
        };
        let file = self.file.clone();
        let file: &GgufFile = (*file).as_ref();
        let policy = self.stream_policy;
        let mut streamed = lock(&self.streamed);
        let Some((plan, layers)) = cache
            .layers_for_slots(file, graph, |gate| streamed.contains_key(&gate))
            .map_err(BackendError::Weights)?
        else {
            return Ok(());
        };
        for layer in layers {
            let gate = layer.parts[0].offset;
            let mut parts = Vec::with_capacity(3);
            for t in &layer.parts {
                parts.push(Arc::new(GpuTensor::slots(
                    &self.gpu, &t.name, t.ty, t.ne, plan.slots,
                )?));
            }
            let parts: [Arc<GpuTensor>; 3] = [parts[0].clone(), parts[1].clone(), parts[2].clone()];
            let mut l = StreamedLayer {
                parts,
                refs: layer.parts.clone(),
                table: SlotTable::new(plan.slots, policy),
            };
            if let Some((list, pinned)) = cache.read_preload(file, gate).map_err(weights_err)? {
                for round in l.table.plan(&list) {
                    upload(&self.gpu.queue, &l, &round, &|e, p| pinned.part(e, p))?;
                }
            }
            streamed.insert(gate, l);
        }
        drop(streamed);
        self.gpu.check()
    }

    /// Whether expert `e` of the layer at `gate` is in device memory (read
    /// ahead skips it).
    pub(super) fn on_device(&self, gate: u64, e: u32) -> bool {
        lock(&self.streamed)
            .get(&gate)
            .is_some_and(|l| l.table.holds(e))
    }

    /// Runs one routed pass of a streamed layer after `enc`'s work: finds
    /// the selection, pins and uploads the misses, records the pass (in
    /// rounds when its experts exceed the slots). Returns the encoder to go
    /// on with.
    pub(super) fn routed_pass(
        &self,
        mut enc: wgpu::CommandEncoder,
        se: &StreamedExperts,
        tokens: &[u32],
    ) -> Result<wgpu::CommandEncoder, BackendError> {
        let n = tokens.len();
        let file = self.file.clone();
        let file: &GgufFile = (*file).as_ref();
        let sel = match se
            .hash
            .as_ref()
            .and_then(|h| h.selection(file, tokens, se.k))
        {
            Some(sel) => sel,
            None => {
                // A learned router: its choice is on the device.
                let len = (n * se.k * 4) as u64;
                let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("selection readback"),
                    size: len.max(4),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if len > 0 {
                    enc.copy_buffer_to_buffer(
                        &se.selected.buffer,
                        se.selected.offset,
                        &staging,
                        0,
                        len,
                    );
                }
                self.gpu.queue.submit([enc.finish()]);
                let bytes = self.map_read(&staging, len)?;
                enc = self.gpu.device.create_command_encoder(&Default::default());
                bytemuck::pod_collect_to_vec(&bytes)
            }
        };
        let want = distinct_experts(&sel, se.n_expert);
        let cache = self
            .experts
            .clone()
            .ok_or_else(|| weights_err("ssd streaming: no expert cache"))?;
        let mut streamed = lock(&self.streamed);
        let layer = streamed
            .get_mut(&se.gate)
            .ok_or_else(|| weights_err("ssd streaming: a routed layer without slots"))?;
        let table = &layer.table;
        let pinned = cache
            .pin_experts(se.gate, &want, n == 1, &|e| table.holds(e))
            .map_err(weights_err)?;
        // Restored if an upload cannot be queued, so that the table never
        // names a slot whose bytes are not there.
        let before = layer.table.clone();
        let mut rounds = layer.table.plan(&want);
        if rounds.is_empty() {
            // No valid expert: the kernels skip every entry (as unstreamed).
            rounds.push(Round {
                slot_of: HashMap::new(),
                uploads: Vec::new(),
            });
        }
        let last = rounds.len() - 1;
        for (i, round) in rounds.iter().enumerate() {
            let part = |e: u32, p: usize| pinned.as_ref().and_then(|s| s.part(e, p));
            if let Err(e) = upload(&self.gpu.queue, layer, round, &part) {
                layer.table = before;
                return Err(e);
            }
            let slots = round.slot_selection(&sel, se.n_expert);
            if !slots.is_empty() {
                self.gpu
                    .queue
                    .write_buffer(&se.slot_sel, 0, bytemuck::cast_slice(&slots));
            }
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                se.experts.encode_rows(&mut pass, n as u32);
                if i == last {
                    se.experts.encode_sum(&mut pass, n as u32);
                }
            }
            if i < last {
                // The next round's uploads reuse this round's slots: they
                // must come after its dispatches.
                self.gpu.queue.submit([enc.finish()]);
                enc = self.gpu.device.create_command_encoder(&Default::default());
            }
        }
        Ok(enc)
    }
}

/// The slot tables (a panic while one was held leaves it consistent: every
/// change is a single assignment per slot).
pub(super) fn lock(
    m: &Mutex<HashMap<u64, StreamedLayer>>,
) -> MutexGuard<'_, HashMap<u64, StreamedLayer>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Queues the uploads of `round` (the slabs from `part(expert, part)`).
fn upload<'a>(
    queue: &wgpu::Queue,
    l: &StreamedLayer,
    round: &Round,
    part: &dyn Fn(u32, usize) -> Option<&'a [u8]>,
) -> Result<(), BackendError> {
    for &(e, slot) in &round.uploads {
        for p in 0..3 {
            let bytes = part(e, p).ok_or_else(|| {
                weights_err(format!(
                    "ssd streaming: expert {e} of {} was not read",
                    l.refs[p].name
                ))
            })?;
            l.parts[p].write_slab(queue, slot as u64, bytes)?;
        }
    }
    Ok(())
}

/// The dispatches of a routed pass over a streamed layer: the slots bound
/// where the expert tensors were, a slot-id selection where the router's
/// selection was.
pub(super) fn record_streamed(
    b: &WgpuBackend,
    g: &super::LoadedGraph,
    o: &crate::graph::ops::moe::MoeExperts,
) -> Result<StreamedExperts, BackendError> {
    let parts = lock(&b.streamed)
        .get(&o.gate.offset)
        .map(|l| l.parts.clone())
        .ok_or_else(|| weights_err("ssd streaming: a routed layer without slots"))?;
    let graph = &g.graph;
    let max_tokens = graph.max_tokens;
    let slot_sel = b.gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("slot selection"),
        size: (max_tokens.max(1) * o.k * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let hash = HashTable::of(graph, o);
    let mm = b.pipes.matmul(&b.gpu)?;
    let range = |v| BufRange::whole(g.buffer(v));
    let experts = mm.experts(
        &b.gpu,
        [&parts[0], &parts[1], &parts[2]],
        o.dims(),
        o.clamp,
        o.k,
        o.mid_fp8,
        range(o.x),
        BufRange::whole(&slot_sel),
        range(o.weights),
        range(o.out),
        &b.step,
        max_tokens,
    )?;
    Ok(StreamedExperts {
        gate: o.gate.offset,
        k: o.k,
        n_expert: o.dims().n_expert,
        selected: range(o.selected),
        hash,
        slot_sel,
        experts,
    })
}
