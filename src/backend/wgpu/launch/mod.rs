//! The dispatches of each kernel family, one file per `shaders/<family>.wgsl`
//! (`launch/<family>.rs`): each holds its family's bind group layout
//! ([`Bindings`], in WGSL declaration order) and, per op, the function that
//! checks what its kernel supports, fills the family's `#[repr(C)]`
//! parameter struct (`wgpu/params.rs`, checked field by field against the
//! WGSL by tests/wgpu_naga.rs), binds its buffers and sizes its dispatch.
//! `record.rs` calls them from its one match over the ops.
//!
//! [`Cx`] is what they share: the backend and the graph being recorded,
//! with the pipelines, bind groups and uniforms built once here.

use std::sync::Arc;

use super::kernels::{scoped, Access};
use super::matmul::{BufRange, MatmulKernels};
use super::shaders::Module;
use super::weights::GpuTensor;
use super::{check_binding, LoadedGraph, Size, WgpuBackend, Work, MAX_STATE_CHUNKS};
use crate::backend::kernels::{Entry, Family};
use crate::backend::BackendError;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops;
use crate::graph::{StateId, ValueId};
use crate::quant::GgmlType;

pub mod attention;
pub mod candidate;
pub mod compress;
pub mod elementwise;
pub mod embed;
pub mod engram;
pub mod gather;
pub mod hc;
pub mod hc_mix;
pub mod indexer;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod ring;
pub mod rope;
pub mod round;
pub mod router;
pub mod source_compress;

/// A family's bind group after its two uniforms (binding 0 the step, 1 the
/// parameters): its storage buffers in WGSL declaration order, then, where
/// `row_table`, the step's row table.
pub struct Bindings {
    pub storage: &'static [Access],
    /// The family reads each row's position and state from the row table.
    pub row_table: bool,
}

impl Bindings {
    /// Storage buffers only.
    pub const fn of(storage: &'static [Access]) -> Bindings {
        Bindings {
            storage,
            row_table: false,
        }
    }

    /// Storage buffers, the row table last (its `R` included).
    pub const fn with_rows(storage: &'static [Access]) -> Bindings {
        Bindings {
            storage,
            row_table: true,
        }
    }
}

/// The bindings of a family recorded through [`Cx::kernel`]; `None` for the
/// matrix products (`matmul.rs`) and the bandwidth probe, which build their
/// own pipelines.
pub fn bindings(f: Family) -> Option<&'static Bindings> {
    Some(match f {
        Family::Elementwise => &elementwise::BINDINGS,
        Family::Embed => &embed::BINDINGS,
        Family::Norm => &norm::BINDINGS,
        Family::HcMix => &hc_mix::BINDINGS,
        Family::Hc => &hc::BINDINGS,
        Family::Rope => &rope::BINDINGS,
        Family::Round => &round::BINDINGS,
        Family::Ring => &ring::BINDINGS,
        Family::Attention => &attention::BINDINGS,
        Family::Compress => &compress::BINDINGS,
        Family::Indexer => &indexer::BINDINGS,
        Family::Router => &router::BINDINGS,
        Family::Gather => &gather::BINDINGS,
        Family::Engram => &engram::BINDINGS,
        Family::SourceCompress => &source_compress::BINDINGS,
        Family::Candidate => &candidate::BINDINGS,
        Family::Matmul | Family::Moe | Family::Bandwidth => return None,
    })
}

/// Threads per workgroup of every WGSL kernel (`WG` in shaders/common.wgsl).
pub const WG: usize = 256;

/// One thread per item, `n` items per token.
pub fn per_token(n: usize) -> Size {
    Size::Threads {
        per_token: n as u32,
        fixed: 0,
    }
}

/// One workgroup per item, `n` items per token.
pub fn groups_per_token(n: usize) -> Size {
    Size::Groups {
        per_token: n as u32,
        fixed: 0,
    }
}

/// One workgroup per live token of the block `first..first + count`.
pub fn token_block(first: usize, count: usize) -> Size {
    Size::TokenBlock {
        first: first as u32,
        count: count as u32,
    }
}

pub fn unsupported(what: String) -> BackendError {
    BackendError::Unsupported {
        backend: "wgpu".into(),
        what,
    }
}

/// `Ok` when the kernel supports the op (`ok`), else an `Unsupported`
/// error saying `what` it was asked.
pub fn supported(ok: bool, what: impl FnOnce() -> String) -> Result<(), BackendError> {
    if ok {
        Ok(())
    } else {
        Err(unsupported(what()))
    }
}

/// What the dispatches of a graph read and build: the backend, the graph,
/// and the file its weights come from.
pub struct Cx<'a> {
    pub b: &'a mut WgpuBackend,
    pub g: &'a LoadedGraph,
    pub file: &'a GgufFile,
    /// Score scratch of this graph (indexer, V4.1's select; created on
    /// first use, shared: their ops run one after another).
    pub scratch: Option<wgpu::Buffer>,
    /// Values holding only f16 numbers (outputs of an f16 `KvRound`).
    pub f16_values: Vec<ValueId>,
}

impl Cx<'_> {
    pub fn val(&self, v: ValueId) -> wgpu::Buffer {
        self.g.buffer(v).clone()
    }

    /// The buffers of `vs`, in order.
    pub fn vals(&self, vs: &[ValueId]) -> Vec<wgpu::Buffer> {
        vs.iter().map(|&v| self.val(v)).collect()
    }

    /// The most tokens a step of the graph has.
    pub fn max_tokens(&self) -> usize {
        self.g.graph.max_tokens
    }

    /// State `s` of set `set` bound whole (ring, compressor frontier: sizes
    /// that do not grow with the context).
    pub fn state(&self, set: usize, s: StateId) -> Result<wgpu::Buffer, BackendError> {
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

    /// The module of KV family `family` for the storage of `states` (all
    /// f32 or all f16; the f16 module is `<stem>_f16`).
    pub fn kv_module(&self, family: Family, states: &[StateId]) -> Result<Module, BackendError> {
        let f16: Vec<bool> = states.iter().map(|&s| self.b.state_is_f16(s)).collect();
        if f16.iter().all(|&x| x) {
            Ok(Module { family, f16: true })
        } else if f16.iter().all(|&x| !x) {
            Ok(Module::of(family))
        } else {
            Err(unsupported(format!(
                "{family} over states of mixed f16/f32 storage ({})",
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
    pub fn check_f16_write(&self, s: StateId, rounded: bool, op: &str) -> Result<(), BackendError> {
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
    pub fn state_chunks(&self, set: usize, s: StateId, writable: bool) -> (Vec<wgpu::Buffer>, u32) {
        self.state_chunks_at(set, s, writable.then_some(0))
    }

    /// [`Self::state_chunks`] where a writable state's unused chunk `i`
    /// gets `dummy_write[base + i]` (`Some(base)`; a second writable
    /// chunked state in the same kernel uses `base = MAX_STATE_CHUNKS`).
    pub fn state_chunks_at(
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

    /// [`Self::state_chunks_at`] of set 0 for a kernel that reads the
    /// state as f32 (V4.1's, which run one session per backend), refusing
    /// one stored as f16.
    pub fn f32_chunks(
        &self,
        s: StateId,
        op: &str,
        write_base: Option<usize>,
    ) -> Result<(Vec<wgpu::Buffer>, u32), BackendError> {
        self.f32_only(s, op)?;
        Ok(self.state_chunks_at(0, s, write_base))
    }

    /// Refuses state `s` stored as f16 for a kernel that reads it as f32.
    pub fn f32_only(&self, s: StateId, op: &str) -> Result<(), BackendError> {
        if self.b.state_is_f16(s) {
            return Err(unsupported(format!(
                "{op} over state {} stored as f16",
                self.b.layout.get(s).name
            )));
        }
        Ok(())
    }

    pub fn range(&self, v: ValueId) -> BufRange {
        BufRange::whole(self.g.buffer(v))
    }

    /// The matrix-product pipelines (created on first use), the device and
    /// the step uniform.
    pub fn matmul(
        &mut self,
    ) -> Result<(Arc<MatmulKernels>, &super::Gpu, &wgpu::Buffer), BackendError> {
        let k = self.b.pipes.matmul(&self.b.gpu)?;
        let b = &*self.b;
        Ok((k, &b.gpu, &b.step))
    }

    /// A matrix or expert tensor uploaded as stored (cached by name).
    pub fn tensor(&mut self, t: &TensorRef) -> Result<Arc<GpuTensor>, BackendError> {
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

    /// Bound where an op has no such input.
    pub fn dummy(&self) -> wgpu::Buffer {
        self.b.dummy_read.clone()
    }

    /// Bound where an op has no such output (`i`: distinct per writable
    /// binding of one kernel).
    pub fn dummy_write(&self, i: usize) -> wgpu::Buffer {
        self.b.dummy_write[i].clone()
    }

    /// A small tensor widened to f32 (cached by name).
    pub fn small(&mut self, t: &TensorRef) -> Result<wgpu::Buffer, BackendError> {
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

    /// [`Cx::small`], or the read dummy for an absent tensor.
    pub fn small_opt(&mut self, t: &Option<TensorRef>) -> Result<wgpu::Buffer, BackendError> {
        match t {
            Some(t) => self.small(t),
            None => Ok(self.dummy()),
        }
    }

    /// A read-only storage buffer holding `data` (constants of one op).
    pub fn constants(&self, label: &str, data: &[f32]) -> wgpu::Buffer {
        self.b.storage_init(label, bytemuck::cast_slice(data))
    }

    /// The graph's score scratch, at least `need` bytes (`what` names it in
    /// an error).
    pub fn score_scratch(&mut self, what: &str, need: u64) -> Result<wgpu::Buffer, BackendError> {
        if let Some(s) = &self.scratch {
            if s.size() >= need {
                return Ok(s.clone());
            }
        }
        check_binding(&self.b.gpu, what, need)?;
        let s = self.b.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size: need,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        self.scratch = Some(s.clone());
        Ok(s)
    }

    /// Tokens per dispatch of a selection kernel whose scratch holds
    /// `row_bytes` per token (`what` names one token's row in an error):
    /// as many as fit one binding, decode being one block of one.
    pub fn scratch_block(&self, what: &str, row_bytes: u64) -> Result<usize, BackendError> {
        check_binding(&self.b.gpu, what, row_bytes)?;
        let max_tokens = self.max_tokens().max(1);
        Ok(((self.b.chunk_bytes / row_bytes) as usize).clamp(1, max_tokens))
    }

    /// A kernel run in blocks of `block` tokens, one dispatch each (none
    /// past the graph's last token; the kernels check the step's):
    /// `one(cx, first)` records the block from token `first`.
    pub fn per_block(
        &mut self,
        block: usize,
        mut one: impl FnMut(&mut Self, usize) -> Result<Work, BackendError>,
    ) -> Result<Vec<Work>, BackendError> {
        let firsts = (0..self.max_tokens().max(1)).step_by(block);
        firsts.map(|first| one(self, first)).collect()
    }

    /// The pipeline and bind group layout of `entry` in `module`.
    fn pipeline(
        &mut self,
        module: Module,
        entry: Entry,
    ) -> Result<
        (
            wgpu::ComputePipeline,
            wgpu::BindGroupLayout,
            &'static Bindings,
        ),
        BackendError,
    > {
        let family = module.family;
        let layout = bindings(family)
            .ok_or_else(|| unsupported(format!("kernel family {family} in a dispatch list")))?;
        let (pipeline, bgl) = self
            .b
            .pipes
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pipeline(&self.b.gpu, module, entry, layout.storage)?;
        Ok((pipeline, bgl, layout))
    }

    /// A dispatch of `entry` (its family's f32 module) over `storage`, its
    /// parameters `params` in a uniform written once.
    pub fn kernel<P: bytemuck::Pod>(
        &mut self,
        entry: Entry,
        params: &P,
        storage: &[wgpu::Buffer],
        size: Size,
    ) -> Result<Work, BackendError> {
        let (pipeline, layout, b) = self.pipeline(Module::of(entry.family()), entry)?;
        let pbuf = self.b.uniform(entry.name(), params);
        let bind = self.bind(entry, b, &layout, &self.b.step, &pbuf, storage)?;
        Ok(Work::Kernel {
            pipeline,
            bind,
            size,
        })
    }

    /// [`Cx::kernel`] as a one-dispatch list.
    pub fn one<P: bytemuck::Pod>(
        &mut self,
        entry: Entry,
        params: &P,
        storage: &[wgpu::Buffer],
        size: Size,
    ) -> Result<Vec<Work>, BackendError> {
        Ok(vec![self.kernel(entry, params, storage, size)?])
    }

    /// A per-session dispatch of `entry` in `module`: one bind group per
    /// state set, each binding that set's step uniform and the buffers
    /// `storage(set)` gives.
    pub fn kernel_sets<P: bytemuck::Pod>(
        &mut self,
        module: Module,
        entry: Entry,
        params: &P,
        storage: impl Fn(&Self, usize) -> Result<Vec<wgpu::Buffer>, BackendError>,
        size: Size,
    ) -> Result<Work, BackendError> {
        let (pipeline, layout, b) = self.pipeline(module, entry)?;
        let pbuf = self.b.uniform(entry.name(), params);
        let mut binds = Vec::with_capacity(self.b.sets.len());
        for set in 0..self.b.sets.len() {
            let s = storage(self, set)?;
            let step = &self.b.set_steps[set];
            binds.push(self.bind(entry, b, &layout, step, &pbuf, &s)?);
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
        entry: Entry,
        b: &Bindings,
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
        if b.row_table {
            entries.push(wgpu::BindGroupEntry {
                binding: 2 + storage.len() as u32,
                resource: self.g.rows.as_entire_binding(),
            });
        }
        let gpu = &self.b.gpu;
        let family = entry.family();
        scoped(gpu, &format!("bind group of {family}::{entry}"), || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(entry.name()),
                layout,
                entries: &entries,
            })
        })
    }
}
