// Element-wise kernels over `n` live values: add, scale.

struct EltParams {
    // Values per token row.
    cols: u32,
    // Scale factor (scale kernel).
    factor: f32,
    _pad0: u32,
    _pad1: u32,
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
