//! shaders/attention.wgsl: `attention`, one workgroup per (token, head),
//! per session (its ring and its compressed rows).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::AttnParams;
use super::super::MAX_STATE_CHUNKS;
use super::{groups_per_token, supported, Bindings, Cx};
use crate::backend::kernels::{Entry, Family};
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::attention::Attention;

/// q, kv, ring, comp0, selected, sinks, out, comp1..7 (the compressed rows
/// beyond one binding), the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, R, R, R, R, R, W, R, R, R, R, R, R, R, R]);

/// Widest head the workgroup holds.
const MAX_HEAD_DIM: usize = 1024;

pub fn attention(cx: &mut Cx, o: &Attention) -> Result<Vec<Work>, BackendError> {
    let hd = o.head_dim;
    supported(hd <= MAX_HEAD_DIM, || {
        format!("head_dim {hd} (at most {MAX_HEAD_DIM})")
    })?;
    let comp = |r: &Cx, set: usize| match o.compressed {
        Some(c) => r.state_chunks(set, c.rows, false),
        None => (vec![r.dummy(); MAX_STATE_CHUNKS], 1),
    };
    let p = AttnParams {
        n_head: o.n_head as u32,
        head_dim: o.head_dim as u32,
        window: o.window as u32,
        top_k: o.top_k as u32,
        ratio: o.compressed.map_or(0, |c| c.ratio as u32),
        has_sel: o.selected.is_some() as u32,
        scale: 1.0 / (o.head_dim as f32).sqrt(),
        chunk_rows: comp(cx, 0).1,
        block: o.block as u32,
        ..Default::default()
    };
    let sel = o.selected.map_or_else(|| cx.dummy(), |v| cx.val(v));
    let sinks = cx.small(&o.sinks)?;
    let storage = |r: &Cx, set: usize| {
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
    let m = cx.kv_module(Family::Attention, &kv_states)?;
    let size = groups_per_token(o.n_head);
    Ok(vec![cx.kernel_sets(
        m,
        Entry::Attention,
        &p,
        storage,
        size,
    )?])
}
