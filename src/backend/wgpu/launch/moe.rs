//! shaders/moe.wgsl: the routed experts, recorded by `wgpu/matmul.rs`
//! (its own pipelines: one per weight type) with the geometry the op
//! carries ([`MoeExperts::dims`]).

use super::Cx;
use crate::backend::wgpu::{streaming, Work};
use crate::backend::BackendError;
use crate::graph::ops::moe::MoeExperts;

/// The routed experts; a streamed layer's pass (`--ssd-streaming`) reads
/// its device slots (`wgpu/streaming.rs`).
pub fn moe_experts(cx: &mut Cx, o: &MoeExperts) -> Result<Vec<Work>, BackendError> {
    if cx.b.is_streamed(o) {
        let s = streaming::record_streamed(cx.b, cx.g, o)?;
        return Ok(vec![Work::Streamed(Box::new(s))]);
    }
    let gate = cx.tensor(&o.gate)?;
    let up = cx.tensor(&o.up)?;
    let down = cx.tensor(&o.down)?;
    let (x, sel, wts, out) = (
        cx.range(o.x),
        cx.range(o.selected),
        cx.range(o.weights),
        cx.range(o.out),
    );
    let max_tokens = cx.max_tokens();
    let (mm, gpu, step) = cx.matmul()?;
    let e = mm.experts(
        gpu,
        [&gate, &up, &down],
        o.dims(),
        o.clamp,
        o.k,
        o.mid_fp8,
        x,
        sel,
        wts,
        out,
        step,
        max_tokens,
    )?;
    Ok(vec![Work::Experts(e)])
}
