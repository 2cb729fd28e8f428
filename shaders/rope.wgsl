// Partial rotary embedding of the last n_rot dims of every head, with the
// YaRN-blended frequencies computed on the host in f64 (MODEL.md 3.4.1),
// each stored as turns per position in three parts (shaders/rope_angle.wgsl
// builds the angle).

struct RopeParams {
    heads: u32,
    head_dim: u32,
    n_rot: u32,
    inverse: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RopeParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
// The rope table, 3 floats per pair: turns per position hi, mid, lo.
@group(0) @binding(3) var<storage, read> consts: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> row_table: array<RowRecord>;

@compute @workgroup_size(WG)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let w = prm.heads * prm.head_dim;
    if (i >= step.n_tokens * w) { return; }
    let t = i / w;
    let d = i % prm.head_dim;
    let tail = prm.head_dim - prm.n_rot;
    if (d < tail) {
        out[i] = x[i];
        return;
    }
    let k = (d - tail) / 2u;
    let first = i - ((d - tail) & 1u);
    let cs = cos_sin(k, row_table[t].pos, 0u);
    var s = cs.y;
    if (prm.inverse != 0u) { s = -s; }
    let x0 = x[first];
    let x1 = x[first + 1u];
    if (((d - tail) & 1u) == 0u) {
        out[i] = x0 * cs.x - x1 * s;
    } else {
        out[i] = x0 * s + x1 * cs.x;
    }
}
