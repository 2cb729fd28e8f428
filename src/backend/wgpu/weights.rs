//! Weight tensors on the GPU: the GGUF bytes exactly as stored (kernels decode
//! blocks in the shader, shaders/quant.wgsl), split into chunks that each fit
//! one storage binding.
//!
//! A chunk holds whole rows (2-D tensors) or whole expert slabs (3-D tensors),
//! so a kernel bound to one chunk never needs a row from another. The Flash
//! Q8_0 head (4096 × 129280, ~560 MB) and each layer's routed-expert tensors
//! (~550 MB) exceed lavapipe's 128 MiB binding limit and become 5 chunks; on
//! a GPU with a larger limit they are one buffer.
//!
//! With `--ssd-streaming` a streamed layer's expert tensors are not uploaded:
//! [`GpuTensor::slots`] makes room for a fixed number of expert slabs that
//! the backend fills from the routed-expert cache as passes need them
//! (docs/SSD_STREAMING.md).
//!
//! Upload streams from the caller's slice (the mmap) in pieces of
//! [`UPLOAD_PIECE`] bytes through `Queue::write_buffer`, waiting for the queue
//! every [`UPLOAD_FLUSH`] bytes, so the host never holds a second full copy of
//! a tensor: at most one flush window of staging memory.

use super::gpu::Gpu;
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Bytes handed to one `write_buffer` call.
pub const UPLOAD_PIECE: u64 = 16 << 20;
/// Bytes written between two waits for the queue (bounds staging memory).
pub const UPLOAD_FLUSH: u64 = 128 << 20;
/// Largest chunk, whatever the adapter allows: byte offsets in the kernels are
/// u32, and Vulkan clamps bindings to i32::MAX anyway.
pub const MAX_CHUNK: u64 = 1 << 31;

/// The weight types the WGSL decoders read (their GGUF type id is the
/// pipeline constant `WTYPE`).
pub fn gpu_decodable(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Bf16 | Q8_0 | Q2K | Q4K | Iq2Xxs | Mxfp4)
}

/// One storage buffer holding `count` consecutive units (rows or slabs)
/// starting at unit `first`.
pub struct WeightChunk {
    pub buffer: wgpu::Buffer,
    pub first: u64,
    pub count: u64,
}

/// A weight tensor resident on the device.
pub struct GpuTensor {
    pub name: String,
    pub ty: GgmlType,
    pub ne: [u64; 4],
    /// Bytes of one row of `ne[0]` elements.
    pub row_bytes: u64,
    /// Rows per chunk unit: 1 for matrices, `ne[1]` for 3-D (expert) tensors.
    pub unit_rows: u64,
    pub chunks: Vec<WeightChunk>,
}

fn err(gpu: &Gpu, name: &str, msg: String) -> BackendError {
    BackendError::Device {
        device: gpu.describe(),
        msg: format!("weight {name}: {msg}"),
    }
}

impl GpuTensor {
    /// Whether the tensor's leading dimensions are `dims` (a check of the
    /// uploaded tensor against the op's geometry).
    pub fn holds(&self, dims: &[u64]) -> bool {
        self.ne[..dims.len()] == *dims
    }

    /// Uploads `bytes` (the tensor's data as stored in the GGUF file) in
    /// chunks no larger than the device's storage binding limit. `progress`
    /// receives the number of bytes uploaded so far.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        ne: [u64; 4],
        bytes: &[u8],
        progress: &mut dyn FnMut(u64),
    ) -> Result<GpuTensor, BackendError> {
        Self::upload_chunked(gpu, name, ty, ne, bytes, gpu.max_binding(), progress)
    }

    /// [`GpuTensor::upload`] with an explicit chunk limit in bytes: tests use
    /// it to get multi-chunk tensors without allocating hundreds of MiB.
    pub fn upload_chunked(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        ne: [u64; 4],
        bytes: &[u8],
        max_chunk_bytes: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<GpuTensor, BackendError> {
        if !gpu_decodable(ty) {
            return Err(BackendError::Unsupported {
                backend: "wgpu".into(),
                what: format!("weight {name} of type {ty}"),
            });
        }
        let row_bytes = ty.row_bytes(ne[0]).ok_or_else(|| {
            err(
                gpu,
                name,
                format!("{} elements is not a whole number of {ty} blocks", ne[0]),
            )
        })?;
        let is_3d = ne[2] > 1 || ne[3] > 1;
        let unit_rows = if is_3d { ne[1] } else { 1 };
        let units = if is_3d {
            ne[2] * ne[3]
        } else {
            ne[1] * ne[2] * ne[3]
        };
        let unit_bytes = row_bytes * unit_rows;
        let total = unit_bytes.checked_mul(units);
        if total != Some(bytes.len() as u64) || unit_bytes == 0 {
            return Err(err(
                gpu,
                name,
                format!("{} data bytes do not match {ty} {:?}", bytes.len(), ne),
            ));
        }
        // Each buffer is padded to a whole word plus one spare word: unaligned
        // loads read the word after a field (and then discard its bytes).
        let limit = max_chunk_bytes.min(MAX_CHUNK);
        let per_chunk = limit.saturating_sub(8) / unit_bytes;
        if per_chunk == 0 {
            return Err(err(
                gpu,
                name,
                format!(
                    "one {} of {unit_bytes} bytes exceeds the storage binding limit {limit}",
                    if is_3d { "expert slab" } else { "row" }
                ),
            ));
        }
        let mut chunks = Vec::new();
        let mut done = 0u64;
        let mut since_flush = 0u64;
        let mut first = 0u64;
        while first < units {
            let count = per_chunk.min(units - first);
            let start = (first * unit_bytes) as usize;
            let data = &bytes[start..start + (count * unit_bytes) as usize];
            let size = (data.len() as u64).div_ceil(4) * 4 + 4;
            let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let vscope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            if let Some(e) = pollster::block_on(vscope.pop()) {
                return Err(err(
                    gpu,
                    name,
                    format!("cannot create a buffer of {size} bytes: {e}"),
                ));
            }
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(err(
                    gpu,
                    name,
                    format!("out of memory for {size} bytes: {e}"),
                ));
            }
            let mut off = 0usize;
            while off < data.len() {
                let n = (UPLOAD_PIECE as usize).min(data.len() - off);
                let piece = &data[off..off + n];
                if n % 4 == 0 {
                    gpu.queue.write_buffer(&buffer, off as u64, piece);
                } else {
                    // The tail: write_buffer wants whole words.
                    let mut tail = piece.to_vec();
                    tail.resize(n.div_ceil(4) * 4, 0);
                    gpu.queue.write_buffer(&buffer, off as u64, &tail);
                }
                off += n;
                done += n as u64;
                since_flush += n as u64;
                if since_flush >= UPLOAD_FLUSH {
                    gpu.queue.submit(None);
                    gpu.wait()?;
                    since_flush = 0;
                }
                progress(done);
            }
            chunks.push(WeightChunk {
                buffer,
                first,
                count,
            });
            first += count;
        }
        gpu.queue.submit(None);
        gpu.check()?;
        Ok(GpuTensor {
            name: name.to_string(),
            ty,
            ne,
            row_bytes,
            unit_rows,
            chunks,
        })
    }

    /// The device slots of a streamed expert tensor (`--ssd-streaming`):
    /// room for `slots` expert slabs of the 3-D tensor `ne` (`ne[2]` experts),
    /// in chunks of whole slabs like an uploaded tensor, holding nothing
    /// until [`GpuTensor::write_slab`] fills a slot. Its `ne[2]` is `slots`,
    /// so the routed kernels index it by slot id.
    pub fn slots(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        ne: [u64; 4],
        slots: usize,
    ) -> Result<GpuTensor, BackendError> {
        let row_bytes = ty.row_bytes(ne[0]).unwrap_or(0);
        let unit_bytes = row_bytes * ne[1];
        // write_buffer writes whole words at word offsets.
        if !gpu_decodable(ty) || unit_bytes == 0 || unit_bytes % 4 != 0 || ne[3] > 1 {
            return Err(BackendError::Unsupported {
                backend: "wgpu".into(),
                what: format!(
                    "streaming expert tensor {name} ({ty} {ne:?}: slabs of {unit_bytes} bytes)"
                ),
            });
        }
        let limit = gpu.max_binding().min(MAX_CHUNK);
        let per_chunk = limit.saturating_sub(8) / unit_bytes;
        if per_chunk == 0 {
            return Err(err(
                gpu,
                name,
                format!("one expert slab of {unit_bytes} bytes exceeds the binding limit {limit}"),
            ));
        }
        let units = slots as u64;
        let mut chunks = Vec::new();
        let mut first = 0u64;
        while first < units {
            let count = per_chunk.min(units - first);
            let size = count * unit_bytes + 4;
            let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            if let Some(e) = pollster::block_on(oom.pop()) {
                return Err(err(
                    gpu,
                    name,
                    format!("out of memory for {size} bytes of expert slots: {e}"),
                ));
            }
            chunks.push(WeightChunk {
                buffer,
                first,
                count,
            });
            first += count;
        }
        Ok(GpuTensor {
            name: format!("{name} (slots)"),
            ty,
            ne: [ne[0], ne[1], units, 1],
            row_bytes,
            unit_rows: ne[1],
            chunks,
        })
    }

    /// Queues the write of one expert slab into slot `slot` (ordered before
    /// the next submit's work, after the previous one's).
    pub fn write_slab(
        &self,
        queue: &wgpu::Queue,
        slot: u64,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let unit = self.unit_rows * self.row_bytes;
        let chunk = self
            .chunks
            .iter()
            .find(|c| (c.first..c.first + c.count).contains(&slot));
        match chunk {
            Some(c) if bytes.len() as u64 == unit => {
                queue.write_buffer(&c.buffer, (slot - c.first) * unit, bytes);
                Ok(())
            }
            _ => Err(BackendError::Weights(format!(
                "{}: slot {slot} of {} bytes written with {} bytes",
                self.name,
                unit,
                bytes.len()
            ))),
        }
    }

    /// Bytes of the tensor's data (without padding).
    pub fn data_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| c.count * self.unit_rows * self.row_bytes)
            .sum()
    }
}
