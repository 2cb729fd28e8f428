// Hyper-connection mixer (MODEL.md 3.2): from the mixer logits of a token
// to the collapse weights `pre`, the write-back weights `post` and the
// Sinkhorn-normalised stream mixer `comb`. One workgroup per token; the
// mixer lives in workgroup memory (a dynamically indexed private array is
// very slow on some drivers) and one thread runs the sequential Sinkhorn.

struct HcMixParams {
    n_hc: u32,
    // (2 + n) * n, or n for the output head (pre only).
    mix_dim: u32,
    sinkhorn_iters: u32,
    has_post: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// Largest stream count the private mixer array holds.
const MAX_HC: u32 = 8u;

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: HcMixParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read> hc_scale: array<f32>;
@group(0) @binding(4) var<storage, read> hc_base: array<f32>;
@group(0) @binding(5) var<storage, read_write> pre: array<f32>;
@group(0) @binding(6) var<storage, read_write> post: array<f32>;
@group(0) @binding(7) var<storage, read_write> comb: array<f32>;

var<workgroup> c: array<f32, 64>;

@compute @workgroup_size(WG)
fn hc_mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) tid: u32) {
    let t = group_id(wid, nwg);
    if (t >= step.n_tokens || tid != 0u) { return; }
    let n = prm.n_hc;
    let m0 = t * prm.mix_dim;
    for (var s = 0u; s < n; s++) {
        pre[t * n + s] = sigmoid(logits[m0 + s] * hc_scale[0] + hc_base[s]) + prm.eps;
    }
    if (prm.has_post == 0u) { return; }
    for (var s = 0u; s < n; s++) {
        post[t * n + s] = 2.0 * sigmoid(logits[m0 + n + s] * hc_scale[1] + hc_base[n + s]);
    }
    for (var i = 0u; i < n * n; i++) {
        c[i] = logits[m0 + 2u * n + i] * hc_scale[2] + hc_base[2u * n + i];
    }
    // Row softmax (+eps), then column normalisation, then iters-1 rounds of
    // row and column normalisation: the CPU twin's order exactly.
    for (var r = 0u; r < n; r++) {
        var mx = c[r * n];
        for (var j = 1u; j < n; j++) { mx = max(mx, c[r * n + j]); }
        var sum = 0.0;
        for (var j = 0u; j < n; j++) {
            let e = exp(c[r * n + j] - mx);
            c[r * n + j] = e;
            sum += e;
        }
        for (var j = 0u; j < n; j++) { c[r * n + j] = c[r * n + j] / sum + prm.eps; }
    }
    for (var it = 0u; it < max(prm.sinkhorn_iters, 1u); it++) {
        if (it > 0u) {
            for (var r = 0u; r < n; r++) {
                var s = 0.0;
                for (var j = 0u; j < n; j++) { s += c[r * n + j]; }
                for (var j = 0u; j < n; j++) { c[r * n + j] /= s + prm.eps; }
            }
        }
        for (var j = 0u; j < n; j++) {
            var s = 0.0;
            for (var r = 0u; r < n; r++) { s += c[r * n + j]; }
            for (var r = 0u; r < n; r++) { c[r * n + j] /= s + prm.eps; }
        }
    }
    for (var i = 0u; i < n * n; i++) { comb[t * n * n + i] = c[i]; }
}
