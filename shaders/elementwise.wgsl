// Element-wise kernels over the live token rows: add, scale, clamped
// SwiGLU, last-row select.

struct EltParams {
    // Values per token row.
    cols: u32,
    factor: f32,
    clamp: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: EltParams;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= step.n_tokens * prm.cols) { return; }
    out[i] = a[i] + b[i];
}

@compute @workgroup_size(WG)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= step.n_tokens * prm.cols) { return; }
    out[i] = a[i] * prm.factor;
}

// h = silu(min(g, c)) * clamp(u, -c, c); no clamp when c <= 1e-6.
@compute @workgroup_size(WG)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= step.n_tokens * prm.cols) { return; }
    let c = prm.clamp;
    if (c > 1e-6) {
        out[i] = silu(min(a[i], c)) * clamp(b[i], -c, c);
    } else {
        out[i] = silu(a[i]) * b[i];
    }
}

@compute @workgroup_size(WG)
fn take_last(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = linear_id(gid, nwg);
    if (j >= prm.cols || step.n_tokens == 0u) { return; }
    out[j] = a[(step.n_tokens - 1u) * prm.cols + j];
}
