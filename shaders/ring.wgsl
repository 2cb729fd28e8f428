// Stores the step's raw KV rows in the ring (slot = position mod window);
// of a step longer than the window only the last `window` rows survive.

struct RingParams {
    window: u32,
    dim: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RingParams;
@group(0) @binding(2) var<storage, read> kv: array<f32>;
@group(0) @binding(3) var<storage, read_write> ring: array<kvt>;
@group(0) @binding(4) var<storage, read> row_table: array<RowRecord>;

@compute @workgroup_size(WG)
fn ring_write(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let n = step.n_tokens;
    let d = prm.dim;
    let first = select(0u, n - prm.window, n > prm.window);
    if (i >= (n - first) * d) { return; }
    // This session's rows start at step.row0 in the step's activations.
    let t = step.row0 + first + i / d;
    let j = i % d;
    let r = row_table[t].pos % prm.window;
    ring[r * d + j] = kvt(kv[t * d + j]);
}
