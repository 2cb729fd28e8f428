//! shaders/router.wgsl: `router`, one workgroup per token.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::RouterParams;
use super::{groups_per_token, supported, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::moe::Router;

/// logits, tokens, bias, hash table, selected, weights.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, R, R, W, W]);

/// Most experts and choices the workgroup ranks.
const MAX_EXPERTS: usize = 512;
const MAX_K: usize = 32;

pub fn router(cx: &mut Cx, o: &Router) -> Result<Vec<Work>, BackendError> {
    let (n, k) = (o.n_expert, o.k);
    supported(n <= MAX_EXPERTS && k <= MAX_K, || {
        format!("router over {n} experts choosing {k} (at most {MAX_EXPERTS} and {MAX_K})")
    })?;
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
    let s = [
        cx.val(o.logits),
        cx.val(o.tokens),
        cx.small_opt(&o.bias)?,
        cx.small_opt(&o.tid2eid)?,
        cx.val(o.selected),
        cx.val(o.weights),
    ];
    cx.one(Entry::Router, &p, &s, groups_per_token(1))
}
