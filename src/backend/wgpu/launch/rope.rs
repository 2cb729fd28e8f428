//! shaders/rope.wgsl: `rope`, one thread per value, angles from the host's
//! split frequencies (`params::rope_table`).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::{rope_table, RopeParams};
use super::{per_token, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::rope::{frequencies, Rope};

/// x, the rope table, out, the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, R, W, R]);

pub fn rope(cx: &mut Cx, o: &Rope) -> Result<Vec<Work>, BackendError> {
    let table = rope_table(&frequencies(&o.rope));
    let p = RopeParams {
        heads: o.heads as u32,
        head_dim: o.head_dim as u32,
        n_rot: o.rope.n_rot as u32,
        inverse: o.inverse as u32,
    };
    let tb = cx.constants("rope table", &table);
    let s = [cx.val(o.x), tb, cx.val(o.out)];
    cx.one(Entry::Rope, &p, &s, per_token(o.items()))
}
