// The official numerics' rounding steps on activations: KV rows (FP8 on
// the non-rotary dims, then f16) and indexer heads (Hadamard + FP4).
// One workgroup per row.

struct RoundParams {
    // Row width: the KV dim, or the head width for hadamard_fp4.
    dim: u32,
    // Rows per token (cols / head_dim for hadamard_fp4, 1 for kv_round).
    rows_per_token: u32,
    n_rot: u32,
    fp8: u32,
    f16: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RoundParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn kv_round(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) tid: u32) {
    let r = group_id(wid, nwg);
    if (r >= step.n_tokens * prm.rows_per_token) { return; }
    let n = prm.dim;
    let base = r * n;
    for (var j = tid; j < n; j += WG) { row[j] = x[base + j]; }
    workgroupBarrier();
    if (prm.fp8 != 0u && prm.n_rot <= n) { row_fp8(n - prm.n_rot, tid); }
    if (prm.f16 != 0u) { row_f16(n, tid); }
    for (var j = tid; j < n; j += WG) { out[base + j] = row[j]; }
}

@compute @workgroup_size(WG)
fn hadamard_fp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = group_id(wid, nwg);
    if (r >= step.n_tokens * prm.rows_per_token) { return; }
    let n = prm.dim;
    let base = r * n;
    for (var j = tid; j < n; j += WG) { row[j] = x[base + j]; }
    workgroupBarrier();
    row_hadamard(0u, n, tid);
    row_fp4(n, tid);
    for (var j = tid; j < n; j += WG) { out[base + j] = row[j]; }
}
