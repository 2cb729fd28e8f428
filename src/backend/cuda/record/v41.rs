//! The DeepSeek V4.1 ops on CUDA (docs/V41.md): their launches, beside the
//! one exhaustive match in `record.rs`, which hands every [`V41Op`] here.
//! Kernels: cuda/v41.cu. The Engram hash and table lookup have no kernel:
//! the host hashes the ids and feeds the rows (`engram_from_host`), so no
//! table ever reaches the device.

use super::*;
use crate::graph::ops::v41::V41Op;
use crate::graph::StateId;

/// What the V4.1 launches read besides the op.
pub(super) struct V41Cx<'a, 'b> {
    pub list: &'a mut List<'b>,
    pub file: &'a crate::gguf::GgufFile,
    pub weights: &'a mut Weights,
    pub states: &'a [DevBuf],
    pub layout: &'a crate::graph::StateLayout,
    pub freqs: &'a mut HashMap<String, DevBuf>,
    pub values: &'a [CUdeviceptr],
    pub scratch: &'a mut Vec<DevBuf>,
    pub max_tokens: usize,
}

impl V41Cx<'_, '_> {
    fn v(&self, id: ValueId) -> Arg {
        Arg::Ptr(self.values[id.0 as usize])
    }

    fn st(&self, s: StateId) -> Result<Arg, BackendError> {
        self.states
            .get(s.0 as usize)
            .map(|d| Arg::Ptr(d.ptr))
            .ok_or_else(|| unsupported(format!("state #{} outside the layout", s.0)))
    }

    /// Blocks of a selection launch (looping over the tokens) and their
    /// scratch of `max_items` keys each.
    fn select_scratch(&mut self, max_items: usize) -> Result<(u32, CUdeviceptr), BackendError> {
        let blocks = u(self.max_tokens.max(1)).min(64);
        let p = scratch(self.scratch, blocks as usize * max_items.max(1) * 4)?;
        Ok((blocks, p))
    }

    pub fn record(&mut self, op: &V41Op) -> Result<(), BackendError> {
        match op {
            V41Op::HcOneHot(o) => {
                let args = vec![self.v(o.out), Arg::U32(u(o.n_hc))];
                let grid = Grid::Threads(per_token(u(o.n_hc)));
                self.list.launch("hc_one_hot", grid, THREADS, 0, args)
            }
            V41Op::EngramGate(o) => {
                let qw = self.weights.small_f32(self.file, &o.q_weight)?;
                let kw = self.weights.small_f32(self.file, &o.k_weight)?;
                let args = vec![
                    self.v(o.state),
                    self.v(o.kv),
                    Arg::Ptr(qw),
                    Arg::Ptr(kw),
                    self.v(o.out),
                    Arg::U32(u(o.n_hc)),
                    Arg::U32(u(o.dim)),
                    Arg::F32(o.eps),
                ];
                let grid = Grid::Blocks(per_token(u(o.n_hc)), fixed(1));
                self.list.launch("engram_gate", grid, THREADS, 0, args)
            }
            V41Op::Compress(o) => {
                let (hd, ihd, n_rot) = (o.head_dim, o.index_head_dim, o.rope.n_rot);
                if hd > 1024 || ihd > 1024 || n_rot > hd.min(ihd) {
                    return Err(unsupported(format!(
                        "v41_compress of rows {hd}, index keys {ihd}, {n_rot} rotated (at most 1024, rotation within both)"
                    )));
                }
                let ratio = o.ratio.max(1);
                let (gate, st_kv, st_score) = match (o.frontier, o.gate) {
                    (Some(f), Some(g)) if ratio > 1 => (self.v(g), self.st(f.kv)?, self.st(f.score)?),
                    _ if ratio > 1 => {
                        return Err(unsupported(format!(
                            "v41_compress of ratio {ratio} without its frontier or gate"
                        )))
                    }
                    _ => (Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)),
                };
                let norm = self.weights.small_f32(self.file, &o.norm)?;
                let wk = self.weights.small_f32(self.file, &o.index_wk)?;
                let index_norm = self.weights.small_f32(self.file, &o.index_norm)?;
                let f = freqs(self.freqs, &o.rope)?;
                let capacity = self
                    .layout
                    .get(o.rows)
                    .rows
                    .min(self.layout.get(o.index_rows).rows);
                let args = vec![
                    self.v(o.kv),
                    gate,
                    Arg::Ptr(norm),
                    Arg::Ptr(wk),
                    Arg::Ptr(index_norm),
                    st_kv,
                    st_score,
                    self.st(o.rows)?,
                    self.st(o.index_rows)?,
                    Arg::Ptr(f),
                    Arg::U32(u(ratio)),
                    Arg::U32(u(hd)),
                    Arg::U32(u(ihd)),
                    Arg::U32(u(n_rot)),
                    Arg::F32(o.eps),
                    Arg::U32(u(capacity)),
                ];
                let grid = Grid::Blocks(fixed(1), fixed(1));
                self.list.launch("v41_compress", grid, THREADS, 0, args)
            }
            V41Op::CandidateBlocks(o) => {
                let bs = o.block_size.max(1);
                let max_items = self.layout.get(o.rows).rows.div_ceil(bs);
                let (blocks, sc) = self.select_scratch(max_items)?;
                let args = vec![
                    self.v(o.q),
                    self.v(o.weights),
                    self.st(o.rows)?,
                    self.v(o.out),
                    Arg::Ptr(sc),
                    Arg::U32(u(o.ratio.max(1))),
                    Arg::U32(u(o.n_head)),
                    Arg::U32(u(o.head_dim)),
                    Arg::U32(u(o.topk_blocks)),
                    Arg::U32(u(bs)),
                    Arg::U32(u(max_items.max(1))),
                ];
                let grid = Grid::Blocks(fixed(blocks), fixed(1));
                self.list.launch("candidate_blocks", grid, THREADS, 0, args)
            }
            V41Op::CandidateTopK(o) => {
                let bs = o.block_size.max(1);
                let max_items = o.topk_blocks * bs;
                let (blocks, sc) = self.select_scratch(max_items)?;
                let args = vec![
                    self.v(o.q),
                    self.v(o.weights),
                    self.st(o.rows)?,
                    self.v(o.blocks),
                    self.v(o.out),
                    Arg::Ptr(sc),
                    Arg::U32(u(o.ratio.max(1))),
                    Arg::U32(u(o.top_k)),
                    Arg::U32(u(o.n_head)),
                    Arg::U32(u(o.head_dim)),
                    Arg::U32(u(o.topk_blocks)),
                    Arg::U32(u(bs)),
                    Arg::U32(u(max_items.max(1))),
                ];
                let grid = Grid::Blocks(fixed(blocks), fixed(1));
                self.list.launch("candidate_topk", grid, THREADS, 0, args)
            }
            V41Op::EngramHash(_) | V41Op::EngramLookup(_) => Err(unsupported(format!(
                "{}: the Engram tables stay on the host; record the V4.1 graph with engram_from_host (the host hashes the ids and feeds engram_rows@L)",
                op.name()
            ))),
        }
    }
}
