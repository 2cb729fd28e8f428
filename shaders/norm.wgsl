// RMS normalisation of `dim`-wide rows, one workgroup per row:
// out = x / sqrt(mean(x^2) + eps) (* w). The CPU twin sums squares in f64;
// here the sum is an f32 reduction (reduce.wgsl: subgroups or a tree; the
// tolerance table records the difference).

struct NormParams {
    dim: u32,
    // Rows = n_tokens * rows_per_token + fixed_rows.
    rows_per_token: u32,
    fixed_rows: u32,
    has_weight: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: NormParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            ids: ReduceIds) {
    let tid = reduce_enter(ids);
    let row = group_id(wid, nwg);
    let rows = step.n_tokens * prm.rows_per_token + prm.fixed_rows;
    if (row >= rows) { return; }
    let base = row * prm.dim;
    var ss = 0.0;
    for (var j = tid; j < prm.dim; j += WG) {
        let v = x[base + j];
        ss += v * v;
    }
    let scale = 1.0 / sqrt(wg_sum(ss) / f32(prm.dim) + prm.eps);
    for (var j = tid; j < prm.dim; j += WG) {
        var v = x[base + j] * scale;
        if (prm.has_weight != 0u) { v *= w[j]; }
        out[base + j] = v;
    }
}
