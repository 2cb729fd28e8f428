//! shaders/gather.wgsl: `gather_last`, each session's last row (found in
//! the row table), one thread per value.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::GatherParams;
use super::{Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::{Size, Work};
use crate::backend::BackendError;
use crate::graph::ops::gather::GatherLast;

/// x, out, the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, W, R]);

pub fn gather_last(cx: &mut Cx, o: &GatherLast) -> Result<Vec<Work>, BackendError> {
    let p = GatherParams {
        cols: o.cols as u32,
        states: o.states as u32,
        ..Default::default()
    };
    let s = [cx.val(o.x), cx.val(o.out)];
    let size = Size::Threads {
        per_token: 0,
        fixed: (o.states * o.cols) as u32,
    };
    cx.one(Entry::GatherLast, &p, &s, size)
}
