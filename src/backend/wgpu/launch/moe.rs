//! shaders/moe.wgsl: the routed experts, recorded by `wgpu/matmul.rs`
//! (its own pipelines: one per weight type) with the geometry the op
//! carries ([`MoeExperts::dims`]). Under V4.1's model numerics the
//! weighted hidden rows go through shaders/round.wgsl's FP8 round trip
//! between the up and down products.

use super::{round, unsupported, Cx};
use crate::backend::wgpu::{streaming, Work};
use crate::backend::BackendError;
use crate::graph::ops::moe::MoeExperts;

/// The routed experts; a streamed layer's pass (`--ssd-streaming`) reads
/// its device slots (`wgpu/streaming.rs`).
pub fn moe_experts(cx: &mut Cx, o: &MoeExperts) -> Result<Vec<Work>, BackendError> {
    if cx.b.is_streamed(o) {
        if o.down_fp8 {
            return Err(unsupported(
                "the FP8 round trip of the experts' down input (V4.1 model numerics) under --ssd-streaming".into(),
            ));
        }
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
    let mut e = mm.experts(
        gpu,
        [&gate, &up, &down],
        o.dims(),
        o.clamp,
        o.k,
        o.down_fp8,
        x,
        sel,
        wts,
        out,
        step,
        max_tokens,
    )?;
    if let (Some(r), Some(hq)) = (o.down_rounding(), &e.hidden_q) {
        let bufs = [e.hidden.clone(), hq.clone()];
        let mut w = round::fp8_rows(cx, &r, o.k, &bufs)?;
        e.round_hidden = w.pop().map(Box::new);
    }
    Ok(vec![Work::Experts(e)])
}
