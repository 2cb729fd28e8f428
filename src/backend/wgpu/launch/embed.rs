//! shaders/embed.wgsl: `embed`, one thread per value of the live rows, the
//! table in chunks of whole rows (one dispatch each).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::EmbedParams;
use super::{per_token, unsupported, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::basic::Embed;
use crate::quant::GgmlType;

/// table chunk, tokens, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, W]);

pub fn embed(cx: &mut Cx, o: &Embed) -> Result<Vec<Work>, BackendError> {
    let ty = match o.table.ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Bf16 => 2,
        other => return Err(unsupported(format!("embedding tables of type {other:?}"))),
    };
    let dim = o.dim();
    let mut out = Vec::new();
    for (buf, row0, n_rows) in table(cx, o)? {
        let p = EmbedParams {
            dim: dim as u32,
            ty,
            row0,
            n_rows,
        };
        let s = [buf, cx.val(o.tokens), cx.val(o.out)];
        out.push(cx.kernel(Entry::Embed, &p, &s, per_token(dim))?);
    }
    Ok(out)
}

/// The embedding table in chunks of whole rows no larger than one binding:
/// (buffer, first row, rows), uploaded once.
fn table(cx: &mut Cx, o: &Embed) -> Result<Vec<(wgpu::Buffer, u32, u32)>, BackendError> {
    let t = &o.table;
    if let Some(c) = cx.b.tables.get(&t.name) {
        return Ok(c.clone());
    }
    let gpu = &cx.b.gpu;
    let rb = t.row_bytes();
    let n_rows = o.vocab();
    // Even row counts keep every chunk's start on a u32 word for F16/BF16.
    let per = ((gpu.max_binding() as usize / rb.max(1)) & !1).max(2);
    let bytes = t.bytes(cx.file);
    let mut chunks = Vec::new();
    let mut r0 = 0;
    while r0 < n_rows {
        let rows = per.min(n_rows - r0);
        let src = &bytes[r0 * rb..(r0 + rows) * rb];
        let size = (src.len().next_multiple_of(4)).max(4) as u64;
        // Streamed from the mmap into the mapped buffer: no second copy.
        let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
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
                        device: gpu.describe(),
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
    cx.b.tables.insert(t.name.clone(), chunks.clone());
    Ok(chunks)
}
