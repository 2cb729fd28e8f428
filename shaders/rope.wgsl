// Partial rotary embedding of the last n_rot dims of every head, with the
// YaRN-blended frequencies computed on the host in f64 (MODEL.md 3.4.1).
//
// The angle pos * freq must be good at large positions, where an f32 product
// is off by pos * 2^-24 radians. The host stores each frequency as turns per
// position split in three parts (hi and mid with 12 significant bits, lo the
// rest); with pos split in 12-bit halves every partial product is exact in
// f32, and only the reduced fractions are summed.

struct RopeParams {
    heads: u32,
    head_dim: u32,
    n_rot: u32,
    inverse: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: RopeParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
// 3 floats per pair: turns per position hi, mid, lo.
@group(0) @binding(3) var<storage, read> freqs: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> row_table: array<RowRecord>;

fn centered_fract(v: f32) -> f32 {
    return v - round(v);
}

// (cos, sin) of 2*pi*pos*turns for pair k.
fn rope_cos_sin(k: u32, pos: u32) -> vec2<f32> {
    let hi = freqs[3u * k];
    let mid = freqs[3u * k + 1u];
    let lo = freqs[3u * k + 2u];
    let ph = f32(pos >> 12u);
    let pl = f32(pos & 0xfffu);
    var turns = centered_fract(ph * hi * 4096.0) + centered_fract(ph * mid * 4096.0)
        + centered_fract(pl * hi) + centered_fract(pl * mid) + centered_fract(f32(pos) * lo);
    turns = centered_fract(turns);
    let a = turns * 6.283185307179586;
    return vec2<f32>(cos(a), sin(a));
}

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
    let cs = rope_cos_sin(k, row_table[t].pos);
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
