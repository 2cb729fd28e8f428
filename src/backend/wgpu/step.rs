//! One step on the wgpu backend: the step's uniforms, token ids and row
//! table written, the recorded dispatch list encoded segment by segment
//! (each submitted as soon as it is encoded; a streamed routed pass splits
//! its segment), the logits read back. Also the read-backs of values and
//! state rows, and the per-dispatch profile.

use super::{to_f32, GraphHandle, RowRecord, StepUniform, WgpuBackend, Work};
use crate::backend::BackendError;
use crate::graph::{Segment, StepParams};

impl WgpuBackend {
    /// One step: row `t` is token `tokens[t]` at `rows[t].pos` of session
    /// `rows[t].state`; `segs` are the step's session pieces (checked).
    pub(super) fn run_step(
        &mut self,
        h: GraphHandle,
        tokens: &[u32],
        rows: &[RowRecord],
        segs: &[Segment],
    ) -> Result<(), BackendError> {
        let g = self.loaded(h)?;
        let graph = g.graph.clone();
        let n_rows = rows.len();
        if let Some(c) = &self.experts {
            let file = self.file.clone();
            c.begin_step_except((*file).as_ref(), tokens, &|gate, e| self.on_device(gate, e))
                .map_err(|e| BackendError::Weights(e.to_string()))?;
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        self.gpu
            .queue
            .write_buffer(g.buffer(graph.tokens), 0, bytemuck::cast_slice(&ids));
        let u = StepUniform {
            pos0: segs.first().map_or(0, |s| s.pos0 as u32),
            n_tokens: n_rows as u32,
            ..Default::default()
        };
        self.gpu
            .queue
            .write_buffer(&self.step, 0, bytemuck::bytes_of(&u));
        for s in segs {
            let u = StepUniform {
                pos0: s.pos0 as u32,
                n_tokens: s.n as u32,
                row0: s.row0 as u32,
                _pad: 0,
            };
            self.gpu
                .queue
                .write_buffer(&self.set_steps[s.state], 0, bytemuck::bytes_of(&u));
        }
        self.gpu
            .queue
            .write_buffer(&g.rows, 0, bytemuck::cast_slice(rows));
        let n = n_rows as u32;
        let logits = graph.value(graph.logits);
        let live = logits.live_rows(n_rows) * logits.cols;
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits readback"),
            size: (live * 4).max(4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let last = g.segments.len().saturating_sub(1);
        let profile = self.profile;
        for (i, seg) in g.segments.iter().enumerate() {
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            // Split at the streamed routed passes (none without streaming).
            let mut rest = &seg[..];
            loop {
                let cut = rest
                    .iter()
                    .position(|(_, w)| matches!(w, Work::Streamed(_)));
                let run = &rest[..cut.unwrap_or(rest.len())];
                if profile {
                    self.profile_segment(run, n, segs)?;
                } else if !run.is_empty() {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    for (_, w) in run {
                        w.encode(&mut pass, n, segs);
                    }
                }
                let Some(c) = cut else { break };
                if let Work::Streamed(se) = &rest[c].1 {
                    enc = self.routed_pass(enc, se, &tokens[..n_rows])?;
                }
                rest = &rest[c + 1..];
            }
            if i == last && live > 0 {
                enc.copy_buffer_to_buffer(
                    g.buffer(graph.logits),
                    0,
                    &staging,
                    0,
                    (live * 4) as u64,
                );
            }
            self.gpu.queue.submit([enc.finish()]);
        }
        let bytes = self.map_read(&staging, (live * 4) as u64)?;
        let g = &mut self.graphs[h.0];
        g.logits = to_f32(logits.dtype, &bytes);
        g.n_tokens = n_rows;
        Ok(())
    }

    /// Runs graph `h` over rows of session 0 at any positions (`rows[t].pos`),
    /// for graphs whose ops treat rows independently (RoPE): the row table
    /// of a step of sessions ([`Backend::run_rows`]) must give each session
    /// one block of consecutive positions, which the KV ops rely on.
    pub fn run_free_positions(
        &mut self,
        h: GraphHandle,
        tokens: &[u32],
        rows: &[RowRecord],
    ) -> Result<(), BackendError> {
        let graph = self.loaded(h)?.graph.clone();
        let p = StepParams {
            pos0: rows.first().map_or(0, |r| r.pos as usize),
            n_tokens: rows.len(),
        };
        crate::backend::check_step(&graph, tokens, &p)?;
        if let Some(t) = rows.iter().position(|r| r.state != 0) {
            return Err(BackendError::BadRows(format!(
                "row {t}: state {} (rows at free positions belong to set 0)",
                rows[t].state
            )));
        }
        let seg = Segment {
            row0: 0,
            n: p.n_tokens,
            pos0: p.pos0,
            state: 0,
        };
        self.run_step(h, tokens, rows, &[seg])
    }

    /// Copies `range` bytes of `buf` to the host (one submit and wait).
    pub(super) fn read_bytes(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, BackendError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: len.next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, len.next_multiple_of(4));
        self.gpu.queue.submit([enc.finish()]);
        self.map_read(&staging, len)
    }

    /// [`BackendOptions::wgpu_profile`]: runs each dispatch alone and waits for it, then
    /// prints wall time per op kind (stderr). Slow; for finding hot spots.
    fn profile_segment(
        &self,
        seg: &[(&'static str, Work)],
        n: u32,
        segs: &[Segment],
    ) -> Result<(), BackendError> {
        let mut t: Vec<(&str, f64, usize)> = Vec::new();
        for (name, w) in seg {
            let t0 = std::time::Instant::now();
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                w.encode(&mut pass, n, segs);
            }
            self.gpu.queue.submit([enc.finish()]);
            self.gpu.wait()?;
            let dt = t0.elapsed().as_secs_f64() * 1e3;
            match t.iter_mut().find(|e| e.0 == *name) {
                Some(e) => {
                    e.1 += dt;
                    e.2 += 1;
                }
                None => t.push((name, dt, 1)),
            }
        }
        for (name, ms, count) in t {
            eprintln!("wgpu profile: {name:<14} {count:>4} dispatches {ms:>9.2} ms");
        }
        Ok(())
    }

    pub(super) fn map_read(
        &self,
        staging: &wgpu::Buffer,
        len: u64,
    ) -> Result<Vec<u8>, BackendError> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.gpu.wait()?;
        let dev = |msg: String| BackendError::Device {
            device: self.gpu.describe(),
            msg,
        };
        rx.recv()
            .map_err(|_| dev("readback never completed".into()))?
            .map_err(|e| dev(format!("readback: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| dev(format!("readback: {e}")))?;
            view[..len as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }
}
