// Row routines for kernels that hold one row (<= MAXROW values) in workgroup
// memory: reductions, ds4's FP8 KV simulation, the Walsh-Hadamard transform
// and the FP4 round trip (MODEL.md 3.5.1; twins in quant::small_float).
// Every function is called by the whole workgroup in uniform control flow
// and ends with a barrier.

const MAXROW: u32 = 1024u;
var<workgroup> row: array<f32, MAXROW>;
var<workgroup> red: array<f32, WG>;

fn wg_sum(v: f32, tid: u32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { red[tid] += red[tid + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32, tid: u32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { red[tid] = max(red[tid], red[tid + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// FP8 (E4M3) round trip of row[0..n) in blocks of 64 with UE8M0 scales;
// one thread per block.
fn row_fp8(n: u32, tid: u32) {
    for (var b = tid * 64u; b < n; b += WG * 64u) {
        let end = min(b + 64u, n);
        var amax = 0.0;
        for (var j = b; j < end; j++) { amax = max(amax, abs(row[j])); }
        let scale = pow2_scale(max(amax, 1e-4), 448.0);
        for (var j = b; j < end; j++) {
            let v = clamp(row[j] / scale, -448.0, 448.0);
            row[j] = with_sign(round_e4m3_mag(abs(v)), v) * scale;
        }
    }
    workgroupBarrier();
}

// FP4 (E2M1) round trip of row[0..n) in blocks of 32.
fn row_fp4(n: u32, tid: u32) {
    for (var b = tid * 32u; b < n; b += WG * 32u) {
        let end = min(b + 32u, n);
        var amax = 0.0;
        for (var j = b; j < end; j++) { amax = max(amax, abs(row[j])); }
        // 6 * 2^-126: the CPU twin's floor.
        let scale = pow2_scale(max(amax, 7.052966104933725e-38), 6.0);
        for (var j = b; j < end; j++) {
            let v = clamp(row[j] / scale, -6.0, 6.0);
            row[j] = with_sign(round_e2m1_mag(abs(v)), v) * scale;
        }
    }
    workgroupBarrier();
}

fn row_f16(n: u32, tid: u32) {
    for (var j = tid; j < n; j += WG) { row[j] = round_f16(row[j]); }
    workgroupBarrier();
}

// Orthonormal Walsh-Hadamard transform of row[off..off+n) (n a power of
// two): butterflies with strides 1, 2, ..., n/2, then * 1/sqrt(n).
fn row_hadamard(off: u32, n: u32, tid: u32) {
    for (var h = 1u; h < n; h <<= 1u) {
        for (var q = tid; q < n / 2u; q += WG) {
            let i = off + (q / h) * 2u * h + q % h;
            let a = row[i];
            let b = row[i + h];
            row[i] = a + b;
            row[i + h] = a - b;
        }
        workgroupBarrier();
    }
    let s = 1.0 / sqrt(f32(n));
    for (var j = tid; j < n; j += WG) { row[off + j] *= s; }
    workgroupBarrier();
}
