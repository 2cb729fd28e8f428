// The official numerics' rounding steps on activations: KV rows (FP8 on
// the non-rotary dims, then f16) and indexer heads (Hadamard + FP4), one
// workgroup per row held in workgroup memory; and the block round trip of
// V4.1's activations (block_round), one workgroup per row, one thread per
// block, in global memory (rows reach 8192 values).

struct RoundParams {
    // Row width: the KV dim, or the head width for hadamard_fp4.
    dim: u32,
    // Rows per token (cols / head_dim for hadamard_fp4, 1 for kv_round).
    rows_per_token: u32,
    n_rot: u32,
    fp8: u32,
    f16: u32,
    // block_round: values per block and the format (0: E4M3 with a UE8M0
    // scale, 1: E2M1 with a UE8M0 scale, 2: E2M1 with an E4M3 scale).
    block: u32,
    format: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RoundParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Whether the step has a row `r` (one per token and row of it).
fn has_row(r: u32) -> bool {
    return r < step.n_tokens * prm.rows_per_token;
}

// Copies row `r` of x (prm.dim values) into workgroup memory; false, with
// nothing read, when the step has no row `r`. Called by the whole workgroup.
fn load_row(r: u32, tid: u32) -> bool {
    if (!has_row(r)) { return false; }
    let n = prm.dim;
    let base = r * n;
    for (var j = tid; j < n; j += WG) { row[j] = x[base + j]; }
    workgroupBarrier();
    return true;
}

// Writes the workgroup's row back as row `r` of out.
fn store_row(r: u32, tid: u32) {
    let n = prm.dim;
    let base = r * n;
    for (var j = tid; j < n; j += WG) { out[base + j] = row[j]; }
}

@compute @workgroup_size(WG)
fn kv_round(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) tid: u32) {
    let r = group_id(wid, nwg);
    if (!load_row(r, tid)) { return; }
    let n = prm.dim;
    if (prm.fp8 != 0u && prm.n_rot <= n) { row_fp8(n - prm.n_rot, tid); }
    if (prm.f16 != 0u) { row_f16(n, tid); }
    store_row(r, tid);
}

@compute @workgroup_size(WG)
fn hadamard_fp4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = group_id(wid, nwg);
    if (!load_row(r, tid)) { return; }
    row_hadamard(0u, prm.dim, tid);
    row_fp4(prm.dim, tid);
    store_row(r, tid);
}

// The official act_quant / fp4_act_quant round trip (twin:
// ops::round::BlockRound).
@compute @workgroup_size(WG)
fn block_round(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    // One workgroup per head of dim values.
    let r = group_id(wid, nwg);
    if (!has_row(r)) { return; }
    let n = prm.dim;
    let base = r * n;
    for (var b = tid * prm.block; b < n; b += WG * prm.block) {
        let end = min(b + prm.block, n);
        var amax = 0.0;
        for (var j = b; j < end; j++) { amax = max(amax, abs(x[base + j])); }
        var fmax = 6.0;
        var scale = 1.0;
        if (prm.format == 0u) {
            fmax = 448.0;
            scale = pow2_scale(max(amax, 1e-4), 448.0);
        } else if (prm.format == 1u) {
            // 6 * 2^-126: the CPU twin's floor.
            scale = pow2_scale(max(amax, 7.052966104933725e-38), 6.0);
        } else {
            // 6 * 2^-9, then the nearest E4M3 value of amax / 6.
            scale = round_e4m3_mag(min(max(amax, 0.01171875) / 6.0, 448.0));
        }
        for (var j = b; j < end; j++) {
            let v = clamp(x[base + j] / scale, -fmax, fmax);
            var m = 0.0;
            if (prm.format == 0u) { m = round_e4m3_mag(abs(v)); } else { m = round_e2m1_mag(abs(v)); }
            out[base + j] = with_sign(m, v) * scale;
        }
    }
}
