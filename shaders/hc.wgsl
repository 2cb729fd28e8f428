// Hyper-connection init, collapse and expand (MODEL.md 3.3, 3.10).

struct HcParams {
    n_hc: u32,
    dim: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: HcParams;
@group(0) @binding(2) var<storage, read> state: array<f32>;
// One row per token: the block's output for expand, x for init.
@group(0) @binding(3) var<storage, read> y: array<f32>;
// `pre` for collapse, `post` for expand.
@group(0) @binding(4) var<storage, read> wts: array<f32>;
@group(0) @binding(5) var<storage, read> comb: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// out[t][s] = x[t] for every stream s.
@compute @workgroup_size(WG)
fn hc_init(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let row = prm.n_hc * prm.dim;
    if (i >= step.n_tokens * row) { return; }
    let t = i / row;
    out[i] = y[t * prm.dim + i % prm.dim];
}

// out[t] = sum_s pre[t][s] * state[t][s]
@compute @workgroup_size(WG)
fn hc_collapse(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let n = prm.n_hc;
    let d = prm.dim;
    if (i >= step.n_tokens * d) { return; }
    let t = i / d;
    let j = i % d;
    var acc = 0.0;
    for (var s = 0u; s < n; s++) {
        acc += wts[t * n + s] * state[(t * n + s) * d + j];
    }
    out[i] = acc;
}

// out[t][k] = post[t][k] * y[t] + sum_j comb[t][j][k] * state[t][j]
@compute @workgroup_size(WG)
fn hc_expand(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let n = prm.n_hc;
    let d = prm.dim;
    if (i >= step.n_tokens * n * d) { return; }
    let t = i / (n * d);
    let k = (i / d) % n;
    let e = i % d;
    var acc = wts[t * n + k] * y[t * d + e];
    for (var j = 0u; j < n; j++) {
        acc += comb[t * n * n + j * n + k] * state[(t * n + j) * d + e];
    }
    out[i] = acc;
}

// Lagged hyper-connections (DeepSeek V4.1): out[t] = [1, 0, ..., 0], the
// first attention collapses stream 0 only.
@compute @workgroup_size(WG)
fn hc_one_hot(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= step.n_tokens * prm.n_hc) { return; }
    out[i] = select(0.0, 1.0, i % prm.n_hc == 0u);
}
