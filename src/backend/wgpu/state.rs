//! The state buffers of the wgpu backend: one copy per state set (session)
//! of every state in the layout, each in chunks of whole rows no larger
//! than one binding, stored as f32 or, where every value is f16 and the
//! device has `shader-f16`, as f16 (converted at the `Backend` boundary).

use std::ops::Range;

use super::{bytes_of_f32, check_binding, Gpu, StepUniform, WgpuBackend, MAX_STATE_CHUNKS};
use crate::backend::BackendError;
use crate::graph::{StateId, StateLayout};

/// One state buffer on the device: chunks of `chunk_rows` whole rows each
/// (one chunk when the state fits one binding), f32 or f16 values.
pub struct GpuState {
    pub chunks: Vec<wgpu::Buffer>,
    pub chunk_rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Stored as f16 (the state holds only f16 values and the device has
    /// `shader-f16`); converted at the `Backend` API boundary.
    pub f16: bool,
}

impl GpuState {
    /// Bytes per stored value.
    pub(super) fn value_bytes(&self) -> usize {
        if self.f16 {
            2
        } else {
            4
        }
    }

    /// `data` as stored.
    pub(super) fn encode(&self, data: &[f32]) -> Vec<u8> {
        if self.f16 {
            data.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect()
        } else {
            bytes_of_f32(data).to_vec()
        }
    }

    /// Stored bytes as f32 values.
    pub(super) fn decode(&self, bytes: &[u8]) -> Vec<f32> {
        if self.f16 {
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect()
        } else {
            bytemuck::pod_collect_to_vec(bytes)
        }
    }

    /// (chunk, value offset inside it, values) pieces of the value range
    /// `r` of the whole state, in order.
    pub(super) fn pieces(&self, r: Range<usize>) -> Vec<(usize, usize, usize)> {
        let per = self.chunk_rows * self.cols;
        let mut out = Vec::new();
        let mut i = r.start;
        while i < r.end {
            let c = i / per;
            let off = i % per;
            let n = (per - off).min(r.end - i);
            out.push((c, off, n));
            i += n;
        }
        out
    }
}

impl WgpuBackend {
    /// Whether state `s` is stored as f16 on the device.
    pub fn state_is_f16(&self, s: StateId) -> bool {
        self.sets[0].get(s.0 as usize).is_some_and(|st| st.f16)
    }

    /// How many bindings (chunks of whole rows) state `s` spans.
    pub fn state_chunks(&self, s: StateId) -> usize {
        self.sets[0]
            .get(s.0 as usize)
            .map_or(0, |st| st.chunks.len())
    }
}

/// A step uniform buffer, written per step.
pub(super) fn step_buffer(gpu: &Gpu, label: &str) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: std::mem::size_of::<StepUniform>() as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// One set of state buffers for `layout`: chunks of whole rows of at most
/// `cap` bytes, f16 where allowed and every value is f16.
pub(super) fn make_states(
    gpu: &Gpu,
    layout: &StateLayout,
    cap: u64,
    f16_ok: bool,
) -> Result<Vec<GpuState>, BackendError> {
    let storage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let mut states = Vec::new();
    for d in &layout.states {
        let f16 = f16_ok && d.f16_values && d.cols % 2 == 0;
        let vb = if f16 { 2 } else { 4 };
        let row_bytes = (d.cols * vb).max(4) as u64;
        check_binding(gpu, &format!("a row of state {}", d.name), row_bytes)?;
        // Whole rows per chunk; every chunk but the last is full.
        let chunk_rows = ((cap / row_bytes) as usize).clamp(1, d.rows.max(1));
        let n_chunks = d.rows.div_ceil(chunk_rows).max(1);
        if n_chunks > MAX_STATE_CHUNKS {
            return Err(BackendError::Device {
                device: gpu.describe(),
                msg: format!(
                    "state {} needs {} bytes, {n_chunks} bindings of at most {cap} bytes; \
                     kernels bind at most {MAX_STATE_CHUNKS} (max_storage_buffer_binding_size {}); \
                     use a smaller --ctx",
                    d.name,
                    d.rows * d.cols * vb,
                    gpu.limits.max_storage_buffer_binding_size
                ),
            });
        }
        let chunks = (0..n_chunks)
            .map(|c| {
                let rows = chunk_rows.min(d.rows - (c * chunk_rows).min(d.rows));
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("{} chunk {c}", d.name)),
                    size: (rows * d.cols * vb).next_multiple_of(4).max(4) as u64,
                    usage: storage,
                    mapped_at_creation: false,
                })
            })
            .collect();
        states.push(GpuState {
            chunks,
            chunk_rows,
            cols: d.cols,
            f16,
        });
    }
    Ok(states)
}
