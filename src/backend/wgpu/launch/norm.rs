//! shaders/norm.wgsl: `rms_norm`, one workgroup per norm row.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::NormParams;
use super::{Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::{Size, Work};
use crate::backend::BackendError;
use crate::graph::ops::norm::RmsNorm;

/// x, weight, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, W]);

pub fn rms_norm(cx: &mut Cx, o: &RmsNorm) -> Result<Vec<Work>, BackendError> {
    let (rpt, fixed) = (o.rows.per_token as u32, o.rows.fixed as u32);
    let p = NormParams {
        dim: o.dim as u32,
        rows_per_token: rpt,
        fixed_rows: fixed,
        has_weight: o.weight.is_some() as u32,
        eps: o.eps,
        ..Default::default()
    };
    let w = cx.small_opt(&o.weight)?;
    let s = [cx.val(o.x), w, cx.val(o.out)];
    let size = Size::Groups {
        per_token: rpt,
        fixed,
    };
    cx.one(Entry::RmsNorm, &p, &s, size)
}
