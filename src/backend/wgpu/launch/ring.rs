//! shaders/ring.wgsl: `ring_write`, the last `window` rows of each
//! session's step into its ring, one thread per value.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::RingParams;
use super::{per_token, Bindings, Cx};
use crate::backend::kernels::{Entry, Family};
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::attention::RingWrite;

/// kv, ring, the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, W, R]);

pub fn ring_write(cx: &mut Cx, o: &RingWrite) -> Result<Vec<Work>, BackendError> {
    let p = RingParams {
        window: o.window as u32,
        dim: o.dim as u32,
        ..Default::default()
    };
    cx.check_f16_write(o.ring, cx.f16_values.contains(&o.kv), "ring_write")?;
    let storage = |r: &Cx, set: usize| Ok(vec![r.val(o.kv), r.state(set, o.ring)?]);
    let m = cx.kv_module(Family::Ring, &[o.ring])?;
    let w = cx.kernel_sets(m, Entry::RingWrite, &p, storage, per_token(o.dim))?;
    Ok(vec![w])
}
