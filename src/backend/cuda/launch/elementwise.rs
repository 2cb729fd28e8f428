//! cuda/elementwise.cu: add, scale, clamped SwiGLU, last-row select; one
//! thread per value of the live rows, grid-stride.

use super::{launch, per_token, Cx, Grid, THREADS};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::basic::{Add, Scale, TakeLast};
use crate::graph::ops::moe::SwiGlu;

pub fn add(cx: &mut Cx, o: &Add) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.cols));
    launch!(cx, Entry::Add, grid, THREADS, 0; o.a, o.b, o.out, o.cols)
}

pub fn scale(cx: &mut Cx, o: &Scale) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.cols));
    launch!(cx, Entry::Scale, grid, THREADS, 0; o.x, o.out, o.factor, o.cols)
}

pub fn swiglu(cx: &mut Cx, o: &SwiGlu) -> Result<(), BackendError> {
    let grid = Grid::Threads(per_token(o.cols));
    launch!(cx, Entry::SwiGlu, grid, THREADS, 0; o.gate, o.up, o.out, o.clamp, o.cols)
}

pub fn take_last(cx: &mut Cx, o: &TakeLast) -> Result<(), BackendError> {
    let grid = Grid::Threads(super::fixed(o.cols));
    launch!(cx, Entry::TakeLast, grid, THREADS, 0; o.x, o.out, o.cols)
}
