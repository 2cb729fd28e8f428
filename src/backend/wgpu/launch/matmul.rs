//! shaders/matmul.wgsl: the dense products, recorded by `wgpu/matmul.rs`
//! (its own pipelines: one per weight type) with the geometry the op
//! carries.

use super::Cx;
use crate::backend::wgpu::matmul::DenseShape;
use crate::backend::wgpu::{StepUniform, Work};
use crate::backend::BackendError;
use crate::graph::ops::matmul::MatMul;

pub fn matmul(cx: &mut Cx, o: &MatMul) -> Result<Vec<Work>, BackendError> {
    let w = cx.tensor(&o.w)?;
    let (x, out) = (cx.range(o.x), cx.range(o.out));
    let shape = DenseShape {
        n_in: o.in_dim(),
        n_out: o.out_dim(),
        groups: o.groups,
    };
    // A product over fixed rows (the last-token head) reads a constant
    // step uniform saying how many rows there are.
    let fixed = o.rows.fixed_only().map(|r| r as u32);
    let max_tokens = fixed.map_or(cx.max_tokens(), |r| r as usize);
    let fixed_step = fixed.map(|r| {
        let u = StepUniform {
            pos0: 0,
            n_tokens: r,
            ..Default::default()
        };
        cx.b.uniform("fixed rows", &u)
    });
    let (mm, gpu, step) = cx.matmul()?;
    let step = fixed_step.as_ref().unwrap_or(step);
    let d = mm
        .dense(gpu, &w, shape, x, out, step, max_tokens)
        .map_err(|e| BackendError::Device {
            device: gpu.describe(),
            msg: format!("matmul {} {:?} groups {}: {e}", w.name, w.ne, o.groups),
        })?;
    Ok(vec![Work::Dense(d, fixed)])
}
