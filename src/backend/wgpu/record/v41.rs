//! The DeepSeek V4.1 ops on wgpu (docs/V41.md): their dispatches, beside
//! the one exhaustive match in `record.rs`, which hands every
//! [`V41Op`] here. Kernels: shaders/v41_gate.wgsl, v41_compress.wgsl,
//! v41_select.wgsl. The Engram hash and table lookup have no kernel: the
//! host hashes the ids and feeds the rows (`engram_from_host`), so no table
//! ever reaches the device.

use super::*;
use crate::graph::ops::v41::V41Op;

/// Loop iterations one invocation of `v41_compress` may spend per dispatch
/// (llvmpipe ends an invocation's loops after 65,535 in all; see
/// `COMPRESS_BLOCK_TOKENS`), with room to spare.
const COMPRESS_ITERATION_BUDGET: usize = 40_000;

/// Threads per workgroup of every WGSL kernel (`WG` in shaders/common.wgsl).
const WG: usize = 256;

impl Rec<'_> {
    /// Refuses a V4.1 kernel's state stored as f16 (the kernels are f32).
    fn v41_f32(&self, s: StateId, op: &str) -> Result<(), BackendError> {
        if self.b.state_is_f16(s) {
            return Err(unsupported(format!(
                "{op} over state {} stored as f16",
                self.b.layout.get(s).name
            )));
        }
        Ok(())
    }

    /// A state bound whole by a V4.1 kernel: the compressor frontier,
    /// `ratio` rows that never grow with the context, so it spans several
    /// bindings only under a binding limit below `ratio` rows (a few KiB at
    /// Flash width), which no chunking of whole rows would help with.
    fn v41_state(&self, s: StateId, op: &str) -> Result<wgpu::Buffer, BackendError> {
        self.v41_f32(s, op)?;
        // V4.1 runs one session per backend (no batched V4.1 yet): set 0.
        let st = &self.b.sets[0][s.0 as usize];
        if st.chunks.len() != 1 {
            let d = self.b.layout.get(s);
            return Err(BackendError::Device {
                device: self.b.gpu.describe(),
                msg: format!(
                    "{op}: state {} ({} rows of {}, independent of the context) spans {} bindings of at most {} bytes; its kernel binds it whole",
                    d.name,
                    d.rows,
                    d.cols,
                    st.chunks.len(),
                    self.b.chunk_bytes
                ),
            });
        }
        Ok(st.chunks[0].clone())
    }

    /// A state that grows with the context (compressed rows, index keys)
    /// bound as `MAX_STATE_CHUNKS` chunks of whole rows, and the rows per
    /// chunk; `write_base` as in `state_chunks_at` (None: read only).
    fn v41_chunks(
        &self,
        s: StateId,
        op: &str,
        write_base: Option<usize>,
    ) -> Result<(Vec<wgpu::Buffer>, u32), BackendError> {
        self.v41_f32(s, op)?;
        Ok(self.state_chunks_at(0, s, write_base))
    }

    /// The graph's score scratch, at least `need` bytes (shared with the
    /// indexer: its ops run one after another).
    fn v41_scratch(&mut self, need: u64) -> Result<wgpu::Buffer, BackendError> {
        if let Some(s) = &self.scratch {
            if s.size() >= need {
                return Ok(s.clone());
            }
        }
        check_binding(&self.b.gpu, "V4.1 selection scores", need)?;
        let s = self.b.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("selection scores"),
            size: need,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        self.scratch = Some(s.clone());
        Ok(s)
    }

    /// One selection kernel per block of tokens whose scratch rows of
    /// `max_items` keys fit one binding.
    #[allow(clippy::too_many_arguments)]
    fn v41_select(
        &mut self,
        entry: &str,
        p: V41SelectParams,
        q: ValueId,
        weights: ValueId,
        keys: StateId,
        blocks: Option<ValueId>,
        out: ValueId,
    ) -> Result<Vec<Work>, BackendError> {
        let row_bytes = (p.max_items as u64 * 4).max(4);
        check_binding(&self.b.gpu, "one token's selection scores", row_bytes)?;
        let max_tokens = self.g.graph.max_tokens.max(1);
        let block = ((self.b.chunk_bytes / row_bytes) as usize).clamp(1, max_tokens);
        let scratch = self.v41_scratch(block as u64 * row_bytes)?;
        let (kc, chunk_rows) = self.v41_chunks(keys, entry, None)?;
        let p = V41SelectParams { chunk_rows, ..p };
        let mut s = vec![
            self.val(q),
            self.val(weights),
            kc[0].clone(),
            blocks.map_or_else(|| self.dummy(), |b| self.val(b)),
            scratch,
            self.val(out),
        ];
        s.extend_from_slice(&kc[1..]);
        let mut works = Vec::new();
        for first in (0..max_tokens).step_by(block) {
            let p = V41SelectParams {
                t0: first as u32,
                ..p
            };
            let size = Size::TokenBlock {
                first: first as u32,
                count: block as u32,
            };
            works.push(self.kernel("v41_select", entry, &p, &s, size)?);
        }
        Ok(works)
    }

    pub(super) fn v41(&mut self, op: &V41Op) -> Result<Vec<Work>, BackendError> {
        match op {
            V41Op::HcOneHot(o) => {
                let p = V41GateParams {
                    n_hc: o.n_hc as u32,
                    ..Default::default()
                };
                let d = self.dummy();
                let s = [d.clone(), d.clone(), d.clone(), d, self.val(o.out)];
                Ok(vec![self.kernel(
                    "v41_gate",
                    "hc_one_hot",
                    &p,
                    &s,
                    per_token(o.n_hc),
                )?])
            }
            V41Op::EngramGate(o) => {
                let p = V41GateParams {
                    n_hc: o.n_hc as u32,
                    dim: o.dim as u32,
                    eps: o.eps,
                    _pad0: 0,
                };
                let s = [
                    self.val(o.state),
                    self.val(o.kv),
                    self.small(&o.q_weight)?,
                    self.small(&o.k_weight)?,
                    self.val(o.out),
                ];
                Ok(vec![self.kernel(
                    "v41_gate",
                    "engram_gate",
                    &p,
                    &s,
                    groups_per_token(o.n_hc),
                )?])
            }
            V41Op::Compress(o) => {
                let (hd, ihd, n_rot) = (o.head_dim, o.index_head_dim, o.rope.n_rot);
                if hd > 1024 || ihd > 1024 || n_rot > hd.min(ihd) {
                    return Err(unsupported(format!(
                        "v41_compress of rows {hd}, index keys {ihd}, {n_rot} rotated (at most 1024, rotation within both)"
                    )));
                }
                let ratio = o.ratio.max(1);
                let frontier = match (o.frontier, o.gate) {
                    (Some(f), Some(g)) if ratio > 1 => Some((f, g)),
                    (_, _) if ratio > 1 => {
                        return Err(unsupported(format!(
                            "v41_compress of ratio {ratio} without its frontier or gate"
                        )))
                    }
                    _ => None,
                };
                let mut consts = ops::load_f32(self.file, &o.norm);
                consts.extend(ops::load_f32(self.file, &o.index_norm));
                consts.extend(ops::load_f32(self.file, &o.index_wk));
                consts.extend(rope_table(&ops::rope::frequencies(&o.rope)));
                let capacity = self.b.layout.get(o.rows).rows;
                let p = V41CompressParams {
                    ratio: ratio as u32,
                    head_dim: hd as u32,
                    index_head_dim: ihd as u32,
                    n_rot: n_rot as u32,
                    eps: o.eps,
                    capacity: capacity.min(self.b.layout.get(o.index_rows).rows) as u32,
                    ..Default::default()
                };
                let cb = self
                    .b
                    .storage_init("v41 compressor constants", bytemuck::cast_slice(&consts));
                let (gate, st_kv, st_score) = match frontier {
                    Some((f, g)) => (
                        self.val(g),
                        self.v41_state(f.kv, "v41_compress")?,
                        self.v41_state(f.score, "v41_compress")?,
                    ),
                    // Dummies 0 and MAX_STATE_CHUNKS: the chunked rows'
                    // unused bindings take the others.
                    None => (
                        self.dummy(),
                        self.b.dummy_write[0].clone(),
                        self.b.dummy_write[MAX_STATE_CHUNKS].clone(),
                    ),
                };
                let (rows, chunk_rows) = self.v41_chunks(o.rows, "v41_compress", Some(0))?;
                let (irows, index_chunk_rows) =
                    self.v41_chunks(o.index_rows, "v41_compress", Some(MAX_STATE_CHUNKS))?;
                let p = V41CompressParams {
                    chunk_rows,
                    index_chunk_rows,
                    ..p
                };
                let mut s = vec![
                    self.val(o.kv),
                    gate,
                    cb,
                    st_kv,
                    st_score,
                    rows[0].clone(),
                    irows[0].clone(),
                ];
                s.extend_from_slice(&rows[1..]);
                s.extend_from_slice(&irows[1..]);
                // One workgroup walks the tokens in order, in blocks whose
                // loops stay within llvmpipe's budget: per token a thread
                // spends up to ceil(ihd/WG) dot products of hd, and a few
                // passes over ceil(hd/WG) columns of 2·ratio slots.
                let per_token = ihd.div_ceil(WG) * hd + hd.div_ceil(WG) * (2 * ratio + 8) + 8;
                let block = (COMPRESS_ITERATION_BUDGET / per_token).clamp(1, COMPRESS_BLOCK_TOKENS);
                let mut works = Vec::new();
                for first in (0..self.g.graph.max_tokens.max(1)).step_by(block) {
                    let p = V41CompressParams {
                        t0: first as u32,
                        t1: (first + block) as u32,
                        ..p
                    };
                    let size = Size::TokenBlock {
                        first: first as u32,
                        count: 1,
                    };
                    works.push(self.kernel("v41_compress", "v41_compress", &p, &s, size)?);
                }
                Ok(works)
            }
            V41Op::CandidateBlocks(o) => {
                let max_rows = self.b.layout.get(o.rows).rows;
                let p = V41SelectParams {
                    ratio: o.ratio.max(1) as u32,
                    n_head: o.n_head as u32,
                    head_dim: o.head_dim as u32,
                    topk_blocks: o.topk_blocks as u32,
                    block_size: o.block_size.max(1) as u32,
                    max_items: max_rows.div_ceil(o.block_size.max(1)).max(1) as u32,
                    ..Default::default()
                };
                self.v41_select("candidate_blocks", p, o.q, o.weights, o.rows, None, o.out)
            }
            V41Op::CandidateTopK(o) => {
                let p = V41SelectParams {
                    ratio: o.ratio.max(1) as u32,
                    top_k: o.top_k as u32,
                    n_head: o.n_head as u32,
                    head_dim: o.head_dim as u32,
                    topk_blocks: o.topk_blocks as u32,
                    block_size: o.block_size.max(1) as u32,
                    max_items: (o.topk_blocks * o.block_size).max(1) as u32,
                    ..Default::default()
                };
                let blocks = Some(o.blocks);
                self.v41_select("candidate_topk", p, o.q, o.weights, o.rows, blocks, o.out)
            }
            V41Op::EngramHash(_) | V41Op::EngramLookup(_) => Err(unsupported(format!(
                "{}: the Engram tables stay on the host; record the V4.1 graph with engram_from_host (the host hashes the ids and feeds engram_rows@L)",
                op.name()
            ))),
        }
    }
}
