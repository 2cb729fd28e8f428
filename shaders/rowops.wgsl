// Row routines for kernels that hold one row (<= MAXROW values) in workgroup
// memory: reductions, the FP8 and FP4 block round trips, the Walsh-Hadamard
// transform (MODEL.md 3.5.1, docs/V41.md; twins in quant::small_float).
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

// FP8 (E4M3) round trip of row[0..n) in blocks of `block` (a short last
// block) with UE8M0 scales; one thread per block.
fn row_fp8(n: u32, block: u32, tid: u32) {
    for (var b = tid * block; b < n; b += WG * block) {
        let end = min(b + block, n);
        var amax = 0.0;
        for (var j = b; j < end; j++) { amax = max(amax, abs(row[j])); }
        let s = fp8_scale(amax);
        for (var j = b; j < end; j++) { row[j] = fp8_value(row[j], s); }
    }
    workgroupBarrier();
}

// FP4 (E2M1) round trip of row[0..n) in blocks of `block`, UE8M0 scales or
// (`e4m3`) E4M3 ones; one thread per block.
fn row_fp4(n: u32, block: u32, e4m3: bool, tid: u32) {
    for (var b = tid * block; b < n; b += WG * block) {
        let end = min(b + block, n);
        var amax = 0.0;
        for (var j = b; j < end; j++) { amax = max(amax, abs(row[j])); }
        let s = fp4_scale(amax, e4m3);
        for (var j = b; j < end; j++) { row[j] = fp4_value(row[j], s); }
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
