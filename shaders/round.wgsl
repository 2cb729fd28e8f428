// The official numerics' rounding steps on activations (ops::round): FP8
// round trips of rows in blocks (V4's KV rows: 64, the RoPE dims left
// alone, then f16; V4.1's window rows and FP8 GEMM inputs: 32 over the
// whole row) and FP4 round trips of indexer heads (V4: after a Hadamard
// rotation). One workgroup per row (fp8_round: per 1024-value segment of
// a row, MAXROW; blocks never straddle a segment).

struct RoundParams {
    // Row width: the row, or the head width for fp4_round.
    dim: u32,
    // Rows per token (heads for fp4_round; slots of the routed experts).
    rows_per_token: u32,
    n_rot: u32,
    fp8: u32,
    f16: u32,
    // FP8 block width (a divisor of MAXROW).
    block: u32,
    // fp4_round: Hadamard rotation of each head first.
    hadamard: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RoundParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn fp8_round(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    let g = group_id(wid, nwg);
    let segs = (prm.dim + MAXROW - 1u) / MAXROW;
    if (g >= step.n_tokens * prm.rows_per_token * segs) { return; }
    let j0 = (g % segs) * MAXROW;
    let n = min(MAXROW, prm.dim - j0);
    let base = (g / segs) * prm.dim + j0;
    for (var j = tid; j < n; j += WG) { row[j] = x[base + j]; }
    workgroupBarrier();
    // FP8 covers the row's first dim - n_rot values (none when n_rot > dim).
    let q = prm.dim - min(prm.n_rot, prm.dim);
    if (prm.fp8 != 0u && j0 < q) { row_fp8(min(n, q - j0), prm.block, tid); }
    if (prm.f16 != 0u) { row_f16(n, tid); }
    for (var j = tid; j < n; j += WG) { out[base + j] = row[j]; }
}

@compute @workgroup_size(WG)
fn fp4_round(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    let r = group_id(wid, nwg);
    if (r >= step.n_tokens * prm.rows_per_token) { return; }
    let n = prm.dim;
    let base = r * n;
    for (var j = tid; j < n; j += WG) { row[j] = x[base + j]; }
    workgroupBarrier();
    if (prm.hadamard != 0u) { row_hadamard(0u, n, tid); }
    row_fp4(n, 32u, false, tid);
    for (var j = tid; j < n; j += WG) { out[base + j] = row[j]; }
}
