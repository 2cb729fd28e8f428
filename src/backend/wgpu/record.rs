//! From a recorded graph to a dispatch list: the one exhaustive match of
//! this backend over [`Op`]. Each op gets its pipeline, its parameter
//! uniform and its bind group here, once; weights it reads are uploaded on
//! first use and shared by every graph.

use std::sync::Arc;

use super::matmul::{BufRange, MatmulKernels};
use super::params::*;
use super::weights::GpuTensor;
use super::{check_binding, kernels, LoadedGraph, Size, WgpuBackend, Work, MAX_STATE_CHUNKS};
use crate::backend::BackendError;
use crate::gguf::GgufFile;
use crate::gguf::TensorRef;
use crate::graph::ops::compress::RowRounding;
use crate::graph::ops::{self, Op};
use crate::graph::{Node, StateId, ValueId};
use crate::quant::GgmlType;

mod v41;

struct Rec<'a> {
    b: &'a mut WgpuBackend,
    g: &'a LoadedGraph,
    file: &'a GgufFile,
    /// Indexer score scratch of this graph (created on first use).
    scratch: Option<wgpu::Buffer>,
    /// Values holding only f16 numbers (outputs of an f16 `KvRound`).
    f16_values: Vec<ValueId>,
}

/// Tokens one compressor dispatch walks through. The compressor is a
/// sequential loop in one workgroup; over a whole long step (thousands of
/// tokens) one invocation would loop more than llvmpipe (lavapipe) allows:
/// it ends every loop of an invocation after 65,535 iterations in all
/// (Mesa gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`), silently, so the rows of
/// the step's last tokens were never written (docs/VALIDATION.md, long
/// contexts). A block of 256 tokens stays near 10,000 iterations even at
/// Flash's widths (ratio 4: 64 rows of 512), and bounds the run time of
/// one dispatch on a GPU as well.
pub(crate) const COMPRESS_BLOCK_TOKENS: usize = 256;

fn unsupported(what: String) -> BackendError {
    BackendError::Unsupported {
        backend: "wgpu".into(),
        what,
    }
}

fn per_token(n: usize) -> Size {
    Size::Threads {
        per_token: n as u32,
        fixed: 0,
    }
}

fn groups_per_token(n: usize) -> Size {
    Size::Groups {
        per_token: n as u32,
        fixed: 0,
    }
}

impl Rec<'_> {
    fn val(&self, v: ValueId) -> wgpu::Buffer {
        self.g.buffer(v).clone()
    }

    /// State `s` of set `set` bound whole (ring, compressor frontier: sizes
    /// that do not grow with the context).
    fn state(&self, set: usize, s: StateId) -> Result<wgpu::Buffer, BackendError> {
        let st = &self.b.sets[set][s.0 as usize];
        if st.chunks.len() != 1 {
            return Err(BackendError::Device {
                device: self.b.gpu.describe(),
                msg: format!(
                    "state {} spans {} bindings but its kernel binds it whole; use a smaller --ctx",
                    self.b.layout.get(s).name,
                    st.chunks.len()
                ),
            });
        }
        Ok(st.chunks[0].clone())
    }

    /// The module of KV family `base` for the storage of `states` (all f32
    /// or all f16; the f16 module is `<base>_f16`).
    fn kv_family(&self, base: &str, states: &[StateId]) -> Result<String, BackendError> {
        let f16: Vec<bool> = states.iter().map(|&s| self.b.state_is_f16(s)).collect();
        if f16.iter().all(|&x| x) {
            Ok(format!("{base}{}", super::shaders::F16_SUFFIX))
        } else if f16.iter().all(|&x| !x) {
            Ok(base.to_string())
        } else {
            Err(unsupported(format!(
                "{base} over states of mixed f16/f32 storage ({})",
                states
                    .iter()
                    .map(|&s| self.b.layout.get(s).name.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }

    /// Refuses a write of unrounded values into a state stored as f16
    /// (the layout promised f16 values only; storing would round them).
    fn check_f16_write(&self, s: StateId, rounded: bool, op: &str) -> Result<(), BackendError> {
        if self.b.state_is_f16(s) && !rounded {
            return Err(BackendError::State {
                state: self.b.layout.get(s).name.to_string(),
                msg: format!(
                    "stored as f16 (marked f16-valued) but {op} writes values not rounded to f16"
                ),
            });
        }
        Ok(())
    }

    /// A state of cached rows bound as `MAX_STATE_CHUNKS` bindings of whole
    /// rows (unused ones repeat chunk 0, or get a dummy when writable), and
    /// the rows per chunk.
    fn state_chunks(&self, set: usize, s: StateId, writable: bool) -> (Vec<wgpu::Buffer>, u32) {
        self.state_chunks_at(set, s, writable.then_some(0))
    }

    /// [`Self::state_chunks`] where a writable state's unused chunk `i`
    /// gets `dummy_write[base + i]` (`Some(base)`; a second writable
    /// chunked state in the same kernel uses `base = MAX_STATE_CHUNKS`).
    fn state_chunks_at(
        &self,
        set: usize,
        s: StateId,
        write_base: Option<usize>,
    ) -> (Vec<wgpu::Buffer>, u32) {
        let st = &self.b.sets[set][s.0 as usize];
        let mut out = st.chunks.clone();
        for i in out.len()..MAX_STATE_CHUNKS {
            out.push(match write_base {
                Some(base) => self.b.dummy_write[base + i].clone(),
                None => st.chunks[0].clone(),
            });
        }
        (out, st.chunk_rows as u32)
    }

    fn range(&self, v: ValueId) -> BufRange {
        BufRange::whole(self.g.buffer(v))
    }

    /// The matrix-product pipelines (created on first use), the device and
    /// the step uniform.
    fn matmul(&mut self) -> Result<(Arc<MatmulKernels>, &super::Gpu, &wgpu::Buffer), BackendError> {
        let k = self.b.pipes.matmul(&self.b.gpu)?;
        let b = &*self.b;
        Ok((k, &b.gpu, &b.step))
    }

    /// A matrix or expert tensor uploaded as stored (cached by name).
    fn tensor(&mut self, t: &TensorRef) -> Result<Arc<GpuTensor>, BackendError> {
        if let Some(w) = self.b.tensors.get(&t.name) {
            return Ok(w.clone());
        }
        let w = Arc::new(GpuTensor::upload(
            &self.b.gpu,
            &t.name,
            t.ty,
            t.ne,
            t.bytes(self.file),
            &mut |_| {},
        )?);
        self.b.tensors.insert(t.name.clone(), w.clone());
        Ok(w)
    }

    fn dummy(&self) -> wgpu::Buffer {
        self.b.dummy_read.clone()
    }

    /// A small tensor widened to f32 (cached by name).
    fn small(&mut self, t: &TensorRef) -> Result<wgpu::Buffer, BackendError> {
        if let Some(b) = self.b.small.get(&t.name) {
            return Ok(b.clone());
        }
        let v = if t.ty == GgmlType::I32 {
            bytemuck::cast_slice(&ops::load_i32(self.file, t)).to_vec()
        } else {
            bytemuck::cast_slice(&ops::load_f32(self.file, t)).to_vec()
        };
        check_binding(&self.b.gpu, &t.name, v.len() as u64)?;
        let buf = self.b.storage_init(&t.name, &v);
        self.b.small.insert(t.name.clone(), buf.clone());
        Ok(buf)
    }

    fn kernel<P: bytemuck::Pod>(
        &mut self,
        family: &str,
        entry: &str,
        params: &P,
        storage: &[wgpu::Buffer],
        size: Size,
    ) -> Result<Work, BackendError> {
        let (pipeline, layout) = self
            .b
            .pipes
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pipeline(&self.b.gpu, family, entry)?;
        let pbuf = self.b.uniform(entry, params);
        let bind = self.bind(family, entry, &layout, &self.b.step, &pbuf, storage)?;
        Ok(Work::Kernel {
            pipeline,
            bind,
            size,
        })
    }

    /// A per-session kernel: one bind group per state set, each binding
    /// that set's step uniform and the buffers `storage(set)` gives.
    fn kernel_sets<P: bytemuck::Pod>(
        &mut self,
        family: &str,
        entry: &str,
        params: &P,
        storage: impl Fn(&Self, usize) -> Result<Vec<wgpu::Buffer>, BackendError>,
        size: Size,
    ) -> Result<Work, BackendError> {
        let (pipeline, layout) = self
            .b
            .pipes
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pipeline(&self.b.gpu, family, entry)?;
        let pbuf = self.b.uniform(entry, params);
        let mut binds = Vec::with_capacity(self.b.sets.len());
        for set in 0..self.b.sets.len() {
            let s = storage(self, set)?;
            let step = &self.b.set_steps[set];
            binds.push(self.bind(family, entry, &layout, step, &pbuf, &s)?);
        }
        Ok(Work::PerSession {
            pipeline,
            binds,
            size,
        })
    }

    /// The bind group of one dispatch: step uniform, parameters, storage
    /// buffers in order, then the row table where the family reads it.
    fn bind(
        &self,
        family: &str,
        entry: &str,
        layout: &wgpu::BindGroupLayout,
        step: &wgpu::Buffer,
        pbuf: &wgpu::Buffer,
        storage: &[wgpu::Buffer],
    ) -> Result<wgpu::BindGroup, BackendError> {
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: step.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: pbuf.as_entire_binding(),
            },
        ];
        for (i, s) in storage.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 2 + i as u32,
                resource: s.as_entire_binding(),
            });
        }
        if kernels::uses_row_table(family) {
            entries.push(wgpu::BindGroupEntry {
                binding: 2 + storage.len() as u32,
                resource: self.g.rows.as_entire_binding(),
            });
        }
        let gpu = &self.b.gpu;
        kernels::scoped(gpu, &format!("bind group of {family}::{entry}"), || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(entry),
                layout,
                entries: &entries,
            })
        })
    }

    /// Embedding table in chunks of whole rows no larger than one binding.
    fn table(
        &mut self,
        o: &ops::basic::Embed,
    ) -> Result<Vec<(wgpu::Buffer, u32, u32)>, BackendError> {
        let t = &o.table;
        if let Some(c) = self.b.tables.get(&t.name) {
            return Ok(c.clone());
        }
        let rb = t.row_bytes();
        let n_rows = o.vocab();
        // Even row counts keep every chunk's start on a u32 word for F16/BF16.
        let per = ((self.b.gpu.max_binding() as usize / rb.max(1)) & !1).max(2);
        let bytes = t.bytes(self.file);
        let mut chunks = Vec::new();
        let mut r0 = 0;
        while r0 < n_rows {
            let rows = per.min(n_rows - r0);
            let src = &bytes[r0 * rb..(r0 + rows) * rb];
            let size = (src.len().next_multiple_of(4)).max(4) as u64;
            // Streamed from the mmap into the mapped buffer: no second copy.
            let buf = self.b.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&t.name),
                size,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: true,
            });
            {
                let mut view =
                    buf.slice(..)
                        .get_mapped_range_mut()
                        .map_err(|e| BackendError::Device {
                            device: self.b.gpu.describe(),
                            msg: format!("uploading {}: {e}", t.name),
                        })?;
                let mut padded;
                let src = if src.len() as u64 == size {
                    src
                } else {
                    padded = src.to_vec();
                    padded.resize(size as usize, 0);
                    &padded[..]
                };
                view.copy_from_slice(src);
            }
            buf.unmap();
            chunks.push((buf, r0 as u32, rows as u32));
            r0 += rows;
        }
        self.b.tables.insert(t.name.clone(), chunks.clone());
        Ok(chunks)
    }

    fn op(&mut self, op: &Op) -> Result<Vec<Work>, BackendError> {
        let one = |w: Work| Ok(vec![w]);
        match op {
            Op::Embed(o) => {
                let ty = match o.table.ty {
                    GgmlType::F32 => 0,
                    GgmlType::F16 => 1,
                    GgmlType::Bf16 => 2,
                    other => {
                        return Err(unsupported(format!("embedding tables of type {other:?}")))
                    }
                };
                let dim = o.dim();
                let mut out = Vec::new();
                for (buf, row0, n_rows) in self.table(o)? {
                    let p = EmbedParams {
                        dim: dim as u32,
                        ty,
                        row0,
                        n_rows,
                    };
                    let s = [buf, self.val(o.tokens), self.val(o.out)];
                    out.push(self.kernel("embed", "embed", &p, &s, per_token(dim))?);
                }
                Ok(out)
            }
            Op::HcInit(o) => {
                let p = EltParams {
                    cols: o.dim as u32,
                    n_hc: o.n_hc as u32,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.dummy(), self.val(o.out)];
                one(self.kernel("elementwise", "hc_init", &p, &s, per_token(o.items()))?)
            }
            Op::RmsNorm(o) => {
                let (rpt, fixed) = (o.rows.per_token, o.rows.fixed);
                let p = NormParams {
                    dim: o.dim as u32,
                    rows_per_token: rpt as u32,
                    fixed_rows: fixed as u32,
                    has_weight: o.weight.is_some() as u32,
                    eps: o.eps,
                    ..Default::default()
                };
                let w = match &o.weight {
                    Some(t) => self.small(t)?,
                    None => self.dummy(),
                };
                let s = [self.val(o.x), w, self.val(o.out)];
                let size = Size::Groups {
                    per_token: rpt as u32,
                    fixed: fixed as u32,
                };
                one(self.kernel("norm", "rms_norm", &p, &s, size)?)
            }
            Op::MatMul(o) => {
                let w = self.tensor(&o.w)?;
                let (x, out) = (self.range(o.x), self.range(o.out));
                // A product over fixed rows (the last-token head) reads a
                // constant step uniform saying how many rows there are.
                let fixed = o.rows.fixed_only().map(|r| r as u32);
                let max_tokens = fixed.map_or(self.g.graph.max_tokens, |r| r as usize);
                let fixed_step = fixed.map(|r| {
                    let u = super::StepUniform {
                        pos0: 0,
                        n_tokens: r,
                        ..Default::default()
                    };
                    self.b.uniform("fixed rows", &u)
                });
                let (mm, gpu, step) = self.matmul()?;
                let step = fixed_step.as_ref().unwrap_or(step);
                let d = mm
                    .dense(gpu, &w, o.groups, x, out, step, max_tokens)
                    .map_err(|e| BackendError::Device {
                        device: gpu.describe(),
                        msg: format!("matmul {} {:?} groups {}: {e}", w.name, w.ne, o.groups),
                    })?;
                one(Work::Dense(d, fixed))
            }
            Op::MoeExperts(o) if self.b.is_streamed(o) => {
                let s = super::streaming::record_streamed(self.b, self.g, o)?;
                one(Work::Streamed(Box::new(s)))
            }
            Op::MoeExperts(o) => {
                let gate = self.tensor(&o.gate)?;
                let up = self.tensor(&o.up)?;
                let down = self.tensor(&o.down)?;
                let (x, sel, wts, out) = (
                    self.range(o.x),
                    self.range(o.selected),
                    self.range(o.weights),
                    self.range(o.out),
                );
                let max_tokens = self.g.graph.max_tokens;
                let (mm, gpu, step) = self.matmul()?;
                let e = mm.experts(
                    gpu, &gate, &up, &down, o.clamp, o.k, x, sel, wts, out, step, max_tokens,
                )?;
                one(Work::Experts(e))
            }
            Op::HcMix(o) => {
                if o.n_hc > 8 {
                    return Err(unsupported(format!("{} HC streams (at most 8)", o.n_hc)));
                }
                let p = HcMixParams {
                    n_hc: o.n_hc as u32,
                    mix_dim: o.mix_dim() as u32,
                    sinkhorn_iters: o.sinkhorn_iters as u32,
                    has_post: o.post.is_some() as u32,
                    eps: o.eps,
                    ..Default::default()
                };
                let post = match o.post {
                    Some(v) => self.val(v),
                    None => self.b.dummy_write[0].clone(),
                };
                let comb = match o.comb {
                    Some(v) => self.val(v),
                    None => self.b.dummy_write[1].clone(),
                };
                let s = [
                    self.val(o.logits),
                    self.small(&o.scale)?,
                    self.small(&o.base)?,
                    self.val(o.pre),
                    post,
                    comb,
                ];
                one(self.kernel("hc_mix", "hc_mix", &p, &s, groups_per_token(1))?)
            }
            Op::HcCollapse(o) => {
                let p = HcParams {
                    n_hc: o.n_hc as u32,
                    dim: o.dim as u32,
                    ..Default::default()
                };
                let s = [
                    self.val(o.state),
                    self.dummy(),
                    self.val(o.pre),
                    self.dummy(),
                    self.val(o.out),
                ];
                one(self.kernel("hc", "hc_collapse", &p, &s, per_token(o.items()))?)
            }
            Op::HcExpand(o) => {
                let p = HcParams {
                    n_hc: o.n_hc as u32,
                    dim: o.dim as u32,
                    ..Default::default()
                };
                let s = [
                    self.val(o.state),
                    self.val(o.y),
                    self.val(o.post),
                    self.val(o.comb),
                    self.val(o.out),
                ];
                one(self.kernel("hc", "hc_expand", &p, &s, per_token(o.items()))?)
            }
            Op::Rope(o) => {
                let table = rope_table(&ops::rope::frequencies(&o.rope));
                let p = RopeParams {
                    heads: o.heads as u32,
                    head_dim: o.head_dim as u32,
                    n_rot: o.rope.n_rot as u32,
                    inverse: o.inverse as u32,
                };
                let tb = self
                    .b
                    .storage_init("rope table", bytemuck::cast_slice(&table));
                let s = [self.val(o.x), tb, self.val(o.out)];
                one(self.kernel("rope", "rope", &p, &s, per_token(o.items()))?)
            }
            Op::KvRound(o) => {
                if o.dim > 1024 {
                    return Err(unsupported(format!("KV rows of {} (at most 1024)", o.dim)));
                }
                let p = RoundParams {
                    dim: o.dim as u32,
                    rows_per_token: 1,
                    n_rot: o.n_rot as u32,
                    fp8: o.fp8 as u32,
                    f16: o.f16 as u32,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.val(o.out)];
                one(self.kernel("round", "kv_round", &p, &s, groups_per_token(1))?)
            }
            Op::HadamardFp4(o) => {
                if o.head_dim > 1024 || !o.head_dim.is_power_of_two() {
                    return Err(unsupported(format!("Hadamard width {}", o.head_dim)));
                }
                let p = RoundParams {
                    dim: o.head_dim as u32,
                    rows_per_token: o.blocks() as u32,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.val(o.out)];
                one(self.kernel(
                    "round",
                    "hadamard_fp4",
                    &p,
                    &s,
                    groups_per_token(o.blocks()),
                )?)
            }
            Op::Attention(o) => {
                if o.head_dim > 1024 {
                    return Err(unsupported(format!(
                        "head_dim {} (at most 1024)",
                        o.head_dim
                    )));
                }
                let p = AttnParams {
                    n_head: o.n_head as u32,
                    head_dim: o.head_dim as u32,
                    window: o.window as u32,
                    top_k: o.top_k as u32,
                    ratio: o.compressed.map_or(0, |c| c.ratio as u32),
                    has_sel: o.selected.is_some() as u32,
                    scale: 1.0 / (o.head_dim as f32).sqrt(),
                    chunk_rows: 0,
                };
                let comp = |r: &Self, set: usize| match o.compressed {
                    Some(c) => r.state_chunks(set, c.rows, false),
                    None => (vec![r.dummy(); MAX_STATE_CHUNKS], 1),
                };
                let p = AttnParams {
                    chunk_rows: comp(self, 0).1,
                    ..p
                };
                let sel = match o.selected {
                    Some(v) => self.val(v),
                    None => self.dummy(),
                };
                let sinks = self.small(&o.sinks)?;
                let storage = |r: &Self, set: usize| {
                    let (comp, _) = comp(r, set);
                    let mut s = vec![
                        r.val(o.q),
                        r.val(o.kv),
                        r.state(set, o.ring)?,
                        comp[0].clone(),
                        sel.clone(),
                        sinks.clone(),
                        r.val(o.out),
                    ];
                    s.extend_from_slice(&comp[1..]);
                    Ok(s)
                };
                let mut kv_states = vec![o.ring];
                kv_states.extend(o.compressed.map(|c| c.rows));
                let fam = self.kv_family("attention", &kv_states)?;
                let size = groups_per_token(o.n_head);
                one(self.kernel_sets(&fam, "attention", &p, storage, size)?)
            }
            Op::RingWrite(o) => {
                let p = RingParams {
                    window: o.window as u32,
                    dim: o.dim as u32,
                    ..Default::default()
                };
                self.check_f16_write(o.ring, self.f16_values.contains(&o.kv), "ring_write")?;
                let storage = |r: &Self, set: usize| Ok(vec![r.val(o.kv), r.state(set, o.ring)?]);
                let fam = self.kv_family("ring", &[o.ring])?;
                one(self.kernel_sets(&fam, "ring_write", &p, storage, per_token(o.dim))?)
            }
            Op::Compress(o) => {
                if o.head_dim > 1024 {
                    return Err(unsupported(format!("compressed rows of {}", o.head_dim)));
                }
                if o.rounding == RowRounding::HadamardFp4F16 && !o.head_dim.is_power_of_two() {
                    return Err(unsupported(format!("Hadamard width {}", o.head_dim)));
                }
                let mut consts = ops::load_f32(self.file, &o.ape);
                consts.resize(o.ratio * o.width(), 0.0);
                consts.extend(ops::load_f32(self.file, &o.norm));
                consts.extend(rope_table(&ops::rope::frequencies(&o.rope)));
                let p = CompressParams {
                    ratio: o.ratio as u32,
                    head_dim: o.head_dim as u32,
                    width: o.width() as u32,
                    overlapped: o.overlapped as u32,
                    n_rot: o.rope.n_rot as u32,
                    rounding: match o.rounding {
                        RowRounding::None => 0,
                        RowRounding::Fp8F16 => 1,
                        RowRounding::HadamardFp4F16 => 2,
                    },
                    eps: o.eps,
                    ..Default::default()
                };
                let chunk_rows = self.state_chunks(0, o.rows, true).1;
                let p = CompressParams { chunk_rows, ..p };
                let cb = self
                    .b
                    .storage_init("compressor constants", bytemuck::cast_slice(&consts));
                let storage = |r: &Self, set: usize| {
                    let mut s = vec![
                        r.val(o.kv),
                        r.val(o.gate),
                        cb.clone(),
                        r.state(set, o.state_kv)?,
                        r.state(set, o.state_score)?,
                    ];
                    s.extend(r.state_chunks(set, o.rows, true).0);
                    Ok(s)
                };
                self.check_f16_write(o.rows, o.rounding != RowRounding::None, "compress")?;
                let fam = self.kv_family("compress", &[o.rows])?;
                // One workgroup walks the tokens in order; one dispatch per
                // block of tokens (none past the step's last token).
                let mut out = Vec::new();
                let max_tokens = self.g.graph.max_tokens.max(1);
                for first in (0..max_tokens).step_by(COMPRESS_BLOCK_TOKENS) {
                    let p = CompressParams {
                        t0: first as u32,
                        t1: (first + COMPRESS_BLOCK_TOKENS) as u32,
                        ..p
                    };
                    let size = Size::TokenBlock {
                        first: first as u32,
                        count: 1,
                    };
                    out.push(self.kernel_sets(&fam, "compress", &p, storage, size)?);
                }
                Ok(out)
            }
            Op::IndexerTopK(o) => {
                let max_rows = self.b.layout.get(o.rows).rows;
                // Score rows of a block of tokens: the step's tokens run in
                // blocks (one dispatch each) small enough that the block's
                // scratch fits one binding; decode is one block of one.
                let row_bytes = (max_rows * 4).max(4) as u64;
                check_binding(&self.b.gpu, "one token's indexer scores", row_bytes)?;
                let max_tokens = self.g.graph.max_tokens.max(1);
                let block = ((self.b.chunk_bytes / row_bytes) as usize).clamp(1, max_tokens);
                let need = block as u64 * row_bytes;
                let scratch = match &self.scratch {
                    Some(s) if s.size() >= need => s.clone(),
                    _ => {
                        check_binding(&self.b.gpu, "indexer scores", need)?;
                        let s = self.b.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some("indexer scores"),
                            size: need,
                            usage: wgpu::BufferUsages::STORAGE,
                            mapped_at_creation: false,
                        });
                        self.scratch = Some(s.clone());
                        s
                    }
                };
                let p = IndexerParams {
                    ratio: o.ratio as u32,
                    top_k: o.top_k as u32,
                    n_head: o.n_head as u32,
                    head_dim: o.head_dim as u32,
                    max_rows: max_rows as u32,
                    ..Default::default()
                };
                let chunk_rows = self.state_chunks(0, o.rows, false).1;
                let p = IndexerParams { chunk_rows, ..p };
                let storage = |r: &Self, set: usize| {
                    let krows = r.state_chunks(set, o.rows, false).0;
                    let mut s = vec![
                        r.val(o.q),
                        r.val(o.weights),
                        krows[0].clone(),
                        scratch.clone(),
                        r.val(o.out),
                    ];
                    s.extend_from_slice(&krows[1..]);
                    Ok(s)
                };
                let fam = self.kv_family("indexer", &[o.rows])?;
                let mut out = Vec::new();
                for first in (0..max_tokens).step_by(block) {
                    let p = IndexerParams {
                        t0: first as u32,
                        ..p
                    };
                    let size = Size::TokenBlock {
                        first: first as u32,
                        count: block as u32,
                    };
                    out.push(self.kernel_sets(&fam, "indexer_topk", &p, storage, size)?);
                }
                Ok(out)
            }
            Op::Router(o) => {
                if o.n_expert > 512 || o.k > 32 {
                    return Err(unsupported(format!(
                        "router over {} experts choosing {} (at most 512 and 32)",
                        o.n_expert, o.k
                    )));
                }
                let p = RouterParams {
                    n_expert: o.n_expert as u32,
                    k: o.k as u32,
                    scale: o.scale,
                    normalize: o.normalize as u32,
                    has_bias: o.bias.is_some() as u32,
                    has_table: o.tid2eid.is_some() as u32,
                    table_row: o.table_cols() as u32,
                    _pad0: 0,
                };
                let bias = match &o.bias {
                    Some(t) => self.small(t)?,
                    None => self.dummy(),
                };
                let table = match &o.tid2eid {
                    Some(t) => self.small(t)?,
                    None => self.dummy(),
                };
                let s = [
                    self.val(o.logits),
                    self.val(o.tokens),
                    bias,
                    table,
                    self.val(o.selected),
                    self.val(o.weights),
                ];
                one(self.kernel("router", "router", &p, &s, groups_per_token(1))?)
            }
            Op::SwiGlu(o) => {
                let cols = o.cols;
                let p = EltParams {
                    cols: cols as u32,
                    clamp: o.clamp,
                    ..Default::default()
                };
                let s = [self.val(o.gate), self.val(o.up), self.val(o.out)];
                one(self.kernel("elementwise", "swiglu", &p, &s, per_token(cols))?)
            }
            Op::Add(o) => {
                let cols = o.cols;
                let p = EltParams {
                    cols: cols as u32,
                    ..Default::default()
                };
                let s = [self.val(o.a), self.val(o.b), self.val(o.out)];
                one(self.kernel("elementwise", "add", &p, &s, per_token(cols))?)
            }
            Op::Scale(o) => {
                let cols = o.cols;
                let p = EltParams {
                    cols: cols as u32,
                    factor: o.factor,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.dummy(), self.val(o.out)];
                one(self.kernel("elementwise", "scale", &p, &s, per_token(cols))?)
            }
            Op::TakeLast(o) => {
                let p = EltParams {
                    cols: o.cols as u32,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.dummy(), self.val(o.out)];
                let size = Size::Threads {
                    per_token: 0,
                    fixed: o.cols as u32,
                };
                one(self.kernel("elementwise", "take_last", &p, &s, size)?)
            }
            Op::GatherLast(o) => {
                let p = GatherParams {
                    cols: o.cols as u32,
                    states: o.states as u32,
                    ..Default::default()
                };
                let s = [self.val(o.x), self.val(o.out)];
                let size = Size::Threads {
                    per_token: 0,
                    fixed: (o.states * o.cols) as u32,
                };
                one(self.kernel("gather", "gather_last", &p, &s, size)?)
            }
            Op::V41(o) => self.v41(o),
        }
    }
}

/// The dispatch lists of `g`, split at its flush points.
pub(super) fn record(
    b: &mut WgpuBackend,
    g: &LoadedGraph,
) -> Result<Vec<Vec<(&'static str, Work)>>, BackendError> {
    let file_arc = b.file.clone();
    let file: &GgufFile = (*file_arc).as_ref();
    let mut r = Rec {
        b,
        g,
        file,
        scratch: None,
        f16_values: g
            .graph
            .ops()
            .filter_map(|op| match op {
                Op::KvRound(k) if k.f16 => Some(k.out),
                _ => None,
            })
            .collect(),
    };
    let mut segments = vec![Vec::new()];
    for node in &g.graph.nodes {
        match node {
            Node::Op(op) => {
                let w = r.op(op)?;
                let name = op.name();
                segments
                    .last_mut()
                    .expect("one segment")
                    .extend(w.into_iter().map(|w| (name, w)));
            }
            Node::Flush => {
                if !segments.last().expect("one segment").is_empty() {
                    segments.push(Vec::new());
                }
            }
        }
    }
    r.b.gpu.check()?;
    Ok(segments)
}
