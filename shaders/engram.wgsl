// DeepSeek V4.1's Engram gate on every HC stream (twin:
// ops::engram::EngramGate). The Engram rows themselves are fed by the host
// (docs/V41.md, "Engram on the GPU backends"): no kernel reads a table.

struct EngramParams {
    n_hc: u32,
    dim: u32,
    eps: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: EngramParams;
// The HC state [T, n_hc, dim].
@group(0) @binding(2) var<storage, read> state: array<f32>;
// `wkv(rows)`: n_hc keys then the shared value, [T, (n_hc + 1) dim].
@group(0) @binding(3) var<storage, read> kv: array<f32>;
// The official q_weight and k_weight, [n_hc, dim] each.
@group(0) @binding(4) var<storage, read> qw: array<f32>;
@group(0) @binding(5) var<storage, read> kw: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// One workgroup per (token, stream h): the three sums over dim, then
// gate = sigmoid(signed sqrt(max(|dot|, 1e-6))) with
// dot = sum(x * qw * kw * key) * rstd(x) * rstd(key) / sqrt(dim), and
// out = x + gate * value.
@compute @workgroup_size(WG)
fn engram_gate(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) tid: u32) {
    let g = group_id(wid, nwg);
    let n = prm.n_hc;
    let d = prm.dim;
    if (g >= step.n_tokens * n) { return; }
    let t = g / n;
    let h = g % n;
    let xb = g * d;
    let kb = t * (n + 1u) * d + h * d;
    let vb = t * (n + 1u) * d + n * d;
    var raw = 0.0;
    var xx = 0.0;
    var kk = 0.0;
    for (var j = tid; j < d; j += WG) {
        let x = state[xb + j];
        let k = kv[kb + j];
        raw += x * (qw[h * d + j] * kw[h * d + j]) * k;
        xx += x * x;
        kk += k * k;
    }
    raw = wg_sum(raw, tid);
    xx = wg_sum(xx, tid);
    kk = wg_sum(kk, tid);
    let fd = f32(d);
    let rstd = 1.0 / sqrt(xx / fd + prm.eps) / sqrt(kk / fd + prm.eps);
    let dot = raw * rstd / sqrt(fd);
    let gate = sigmoid(with_sign(sqrt(max(abs(dot), 1e-6)), dot));
    for (var j = tid; j < d; j += WG) {
        out[xb + j] = state[xb + j] + gate * kv[vb + j];
    }
}
