// The MoE router (MODEL.md 3.7), one thread per token: s_e =
// sqrt(softplus(logit_e)); experts from the hash table, or the k largest
// s_e + bias_e (ties to the lower index); weights s / sum(s) * scale.

struct RouterParams {
    n_expert: u32,
    k: u32,
    scale: f32,
    normalize: u32,
    has_bias: u32,
    has_table: u32,
    // Entries per token row of the hash table.
    table_row: u32,
    _pad0: u32,
}

// Largest expert count the private arrays hold.
const MAX_EXPERT: u32 = 512u;

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RouterParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read> tokens: array<i32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> table: array<i32>;
@group(0) @binding(6) var<storage, read_write> selected: array<i32>;
@group(0) @binding(7) var<storage, read_write> weights: array<f32>;

// ln(1 + y) for y >= 0 with a small relative error: GPU log() only bounds
// the absolute error near 1 (2^-21 in Vulkan), which is useless for small
// y, so below 1 the atanh series ln(1+y) = 2 atanh(y / (2 + y)) is summed
// (z <= 1/3; terms to z^13 leave < 1e-7 relative).
fn log1p(y: f32) -> f32 {
    if (y >= 1.0) { return log(1.0 + y); }
    let z = y / (2.0 + y);
    let z2 = z * z;
    var s = 1.0 / 13.0;
    s = 1.0 / 11.0 + z2 * s;
    s = 1.0 / 9.0 + z2 * s;
    s = 1.0 / 7.0 + z2 * s;
    s = 1.0 / 5.0 + z2 * s;
    s = 1.0 / 3.0 + z2 * s;
    s = 1.0 + z2 * s;
    return 2.0 * z * s;
}

// ds4's softplus: exact at both ends.
fn softplus(x: f32) -> f32 {
    if (x > 20.0) { return x; }
    if (x < -20.0) { return exp(x); }
    return log1p(exp(x));
}

var<workgroup> score: array<f32, MAX_EXPERT>;
var<workgroup> taken: array<u32, 16>;

@compute @workgroup_size(WG)
fn router(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) tid: u32) {
    let t = group_id(wid, nwg);
    if (t >= step.n_tokens) { return; }
    let e = prm.n_expert;
    let k = prm.k;
    for (var x = tid; x < e; x += WG) { score[x] = sqrt(softplus(logits[t * e + x])); }
    if (tid < 16u) { taken[tid] = 0u; }
    workgroupBarrier();
    if (tid != 0u) { return; }
    for (var i = 0u; i < k; i++) {
        var best = 0u;
        if (prm.has_table != 0u) {
            best = u32(table[u32(tokens[t]) * prm.table_row + i]);
        } else {
            var best_v = 0.0;
            var found = false;
            for (var x = 0u; x < e; x++) {
                if ((taken[x / 32u] & (1u << (x % 32u))) != 0u) { continue; }
                var v = score[x];
                if (prm.has_bias != 0u) { v += bias[x]; }
                if (!found || v > best_v) {
                    best = x;
                    best_v = v;
                    found = true;
                }
            }
            taken[best / 32u] |= 1u << (best % 32u);
        }
        selected[t * k + i] = i32(best);
    }
    var sum = 0.0;
    for (var i = 0u; i < k; i++) { sum += score[u32(selected[t * k + i])]; }
    var denom = 1.0;
    if (prm.normalize != 0u) { denom = max(sum, 1.0 / 16384.0); }
    for (var i = 0u; i < k; i++) {
        weights[t * k + i] = score[u32(selected[t * k + i])] / denom * prm.scale;
    }
}
