// Shared by every module: the per-step uniform and small numeric helpers.
// The program prepends this file to each kernel family before handing the
// module to wgpu (see src/backend/wgpu/shaders.rs).

// Twin of `StepUniform` in src/backend/wgpu/gpu.rs (checked by tests/wgpu_naga.rs).
struct StepUniform {
    pos0: u32,
    n_tokens: u32,
    // The first row of these tokens in the step's activations (0 except in
    // the per-session uniform of a step of several sessions).
    row0: u32,
    _pad0: u32,
}

// One row of the step (twin of `RowRecord` in src/backend/wgpu/gpu.rs): its
// absolute position and its session state. Kernels take a row's own
// position from `row_table[t].pos`. The per-session kernels (ring write,
// attention, compressor, indexer) run once per session of the step against
// that session's state buffers, with a uniform of their own: `n_tokens` and
// `pos0` of the session's rows, `row0` their first row in the step; `pos0`
// tells which raw rows attention finds in the step rather than in the ring.
struct RowRecord {
    pos: u32,
    state: u32,
}

// Threads per workgroup of every kernel here. Kernels never assume a
// subgroup size; reductions go through workgroup memory.
const WG: u32 = 256u;

// Dispatches larger than 65535 workgroups are split over y; these give the
// linear thread / workgroup index back.
fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn group_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// A large negative logit (exp() of it minus any real max is 0).
const NEG_BIG: f32 = -3.0e38;

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn silu(x: f32) -> f32 {
    return x * sigmoid(x);
}

// 2^k for -126 <= k <= 127, exactly.
fn pow2i(k: i32) -> f32 {
    return bitcast<f32>(u32(k + 127) << 23u);
}

// Unbiased exponent of a finite f32 (-127 for zero and subnormals).
fn exponent_of(a: f32) -> i32 {
    return i32((bitcast<u32>(a) >> 23u) & 0xffu) - 127;
}

fn with_sign(mag: f32, like: f32) -> f32 {
    return select(mag, -mag, like < 0.0);
}

// Rounds to the nearest f16 value (ties to even; overflow to infinity), as
// quant::f16::f32_to_f16_bits followed by the widening. WGSL's round() is
// ties-to-even and scaling by powers of two is exact, so the value is
// round(a / ulp) * ulp with the f16 ulp of a's binade.
fn round_f16(x: f32) -> f32 {
    if (x != x) { return x; }
    let a = abs(x);
    if (a >= 65520.0) { return with_sign(bitcast<f32>(0x7f800000u), x); }
    let e = max(exponent_of(a), -14);
    return with_sign(round(a * pow2i(10 - e)) * pow2i(e - 10), x);
}

// Nearest E4M3FN value of a magnitude already clamped to 448 (ties to the
// even code): 3 mantissa bits, subnormal unit 2^-9.
fn round_e4m3_mag(a: f32) -> f32 {
    let e = max(exponent_of(a), -6);
    return round(a * pow2i(3 - e)) * pow2i(e - 3);
}

// Nearest E2M1 value of a magnitude already clamped to 6 (ties to even).
fn round_e2m1_mag(a: f32) -> f32 {
    var q = 2.0;
    if (a < 2.0) { q = 0.5; } else if (a < 4.0) { q = 1.0; }
    return round(a / q) * q;
}

// The UE8M0 block scale 2^ceil(log2(amax / fmax)), literally as the CPU twin.
fn pow2_scale(amax: f32, fmax: f32) -> f32 {
    return exp2(ceil(log2(amax / fmax)));
}

// Widens f16 bits (low 16 bits of h) exactly, with integer operations only
// (unpack2x16float needs a capability some adapters lack).
fn f16_bits_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        return bitcast<f32>(s | bitcast<u32>(f32(m) * pow2i(-24)));
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
