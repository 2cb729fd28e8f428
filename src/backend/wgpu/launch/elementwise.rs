//! shaders/elementwise.wgsl: add, scale, clamped SwiGLU, last-row select;
//! one thread per value of the live rows.

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::EltParams;
use super::{per_token, Bindings, Cx};
use crate::backend::kernels::Entry;
use crate::backend::wgpu::{Size, Work};
use crate::backend::BackendError;
use crate::graph::ops::basic::{Add, Scale, TakeLast};
use crate::graph::ops::moe::SwiGlu;

/// a, b, out.
pub const BINDINGS: Bindings = Bindings::of(&[R, R, W]);

/// The parameters of `cols` values per row.
fn params(cols: usize) -> EltParams {
    EltParams {
        cols: cols as u32,
        ..Default::default()
    }
}

pub fn add(cx: &mut Cx, o: &Add) -> Result<Vec<Work>, BackendError> {
    let s = cx.vals(&[o.a, o.b, o.out]);
    cx.one(Entry::Add, &params(o.cols), &s, per_token(o.cols))
}

pub fn scale(cx: &mut Cx, o: &Scale) -> Result<Vec<Work>, BackendError> {
    let p = EltParams {
        factor: o.factor,
        ..params(o.cols)
    };
    let s = [cx.val(o.x), cx.dummy(), cx.val(o.out)];
    cx.one(Entry::Scale, &p, &s, per_token(o.cols))
}

pub fn swiglu(cx: &mut Cx, o: &SwiGlu) -> Result<Vec<Work>, BackendError> {
    let p = EltParams {
        clamp: o.clamp,
        ..params(o.cols)
    };
    let s = cx.vals(&[o.gate, o.up, o.out]);
    cx.one(Entry::SwiGlu, &p, &s, per_token(o.cols))
}

/// One thread per value of the last row.
pub fn take_last(cx: &mut Cx, o: &TakeLast) -> Result<Vec<Work>, BackendError> {
    let s = [cx.val(o.x), cx.dummy(), cx.val(o.out)];
    let size = Size::Threads {
        per_token: 0,
        fixed: o.cols as u32,
    };
    cx.one(Entry::TakeLast, &params(o.cols), &s, size)
}
