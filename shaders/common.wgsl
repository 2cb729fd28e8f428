// Shared by every module: the per-step uniform and small numeric helpers.
// The program prepends this file to each kernel family before handing the
// module to wgpu (see src/backend/wgpu/shaders.rs).

// Twin of `StepUniform` in src/backend/wgpu/gpu.rs (checked by tests/wgpu_naga.rs).
struct StepUniform {
    pos0: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

// Threads per workgroup of the element-wise and row kernels. Kernels never
// assume a subgroup size; reductions go through workgroup memory.
const WG: u32 = 256u;

// The linear invocation index of a 1-D dispatch that may be split over the
// y dimension (more than 65535 workgroups).
fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn silu(x: f32) -> f32 {
    return x * sigmoid(x);
}
