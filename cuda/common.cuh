// Shared helpers of every CUDA kernel family (prepended by
// src/backend/cuda/kernels.rs). No system headers: NVRTC compiles these
// alone, so f16 conversions use PTX `cvt` directly.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Per-step parameters, written to device memory before every step (a
// captured CUDA graph replays with new values). Twin: cuda::StepDev. The
// per-session kernels (RoPE, ring write, attention, compressor, indexer)
// read the Step of their session's state set: its rows are n_tokens rows
// from row0 of the step's activations, at positions pos0.. (row0 is 0 in
// the step-wide Step every other kernel reads).
struct Step {
    u32 pos0;
    u32 n_tokens;
    u32 row0;
    u32 pad0;
};

// Rows of a value this step: fixed rows (> 0) or the step's token count.
__device__ __forceinline__ u32 live_rows(u32 fixed_rows, const Step* st) {
    return fixed_rows > 0 ? fixed_rows : st->n_tokens;
}

#ifdef __CUDA_ARCH__
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
// Host build of these helpers (tests/cuda_host.rs checks the decoders and
// small-float rounding against the CPU twins with a C++ compiler).
inline float f16_to_f32(u16 h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}

inline u16 f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    u16 h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
#endif

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// f16 storage rounding (round to nearest even, as quant::f16).
__device__ __forceinline__ float round_f16(float x) {
    return f16_to_f32(f32_to_f16(x));
}

__device__ __forceinline__ float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float siluf(float x) {
    return x * sigmoidf(x);
}

// ops::moe::swiglu: silu(min(g, c)) * clamp(u, -c, c); no clamp when c <= 1e-6.
__device__ __forceinline__ float swiglu_value(float g, float u, float c) {
    if (c > 1e-6f) {
        return siluf(fminf(g, c)) * fminf(fmaxf(u, -c), c);
    }
    return siluf(g) * u;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the total. `scratch` holds 32 doubles of shared memory.
__device__ double block_sum_d(double v, double* scratch) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < nw ? scratch[lane] : 0.0;
    t = warp_sum_d(t);
    return t;
}

// Total-order key of an f32 (f32::total_cmp): larger key = larger value.
__device__ __forceinline__ u32 order_key(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// ---- small floats (quant::small_float) ----

// exp2(ceil(log2(amax / fmax))): log2 in double rounded to f32 reproduces the
// CPU's f32 log2; the power of two is built exactly.
__device__ __forceinline__ float pow2_scale(float amax, float fmax) {
    float r = amax / fmax;
    float l = (float)log2((double)r);
    return ldexpf(1.0f, (int)ceilf(l));
}

// Nearest E4M3 value of a in [0, 448], ties to the even code.
__device__ __forceinline__ float e4m3_round_abs(float a) {
    if (a < 0.015625f) {  // 2^-6: subnormal codes
        return rintf(a * 512.0f) * 0.001953125f;
    }
    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127;
    e = min(e, 8);
    float m = (a / ldexpf(1.0f, e) - 1.0f) * 8.0f;
    u32 code = (u32)((e + 7) * 8) + (u32)rintf(m);
    int ce = (int)(code >> 3);
    float cm = (float)(code & 7);
    return ce == 0 ? cm * 0.001953125f : (1.0f + cm / 8.0f) * ldexpf(1.0f, ce - 7);
}

__device__ __forceinline__ float round_e4m3(float v) {
    if (isnan(v)) return v;
    return copysignf(e4m3_round_abs(fminf(fabsf(v), 448.0f)), v);
}

__device__ __forceinline__ float round_e2m1(float v) {
    if (isnan(v)) return v;
    float a = fminf(fabsf(v), 6.0f);
    u32 code;
    if (a < 2.0f) code = (u32)rintf(a * 2.0f);
    else if (a < 4.0f) code = 4u + (u32)rintf(a - 2.0f);
    else code = 6u + (u32)rintf((a - 4.0f) * 0.5f);
    const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return copysignf(vals[code], v);
}

// The official act_quant / fp4_act_quant round trip of v[0..n) as one
// block, in place (twin: ops::round::BlockFormat::round): format 0: E4M3
// with a UE8M0 scale, 1: E2M1 with a UE8M0 scale, 2: E2M1 with an E4M3
// scale (not a power of two: a true division by it).
__device__ __forceinline__ void round_block(float* v, u32 n, u32 format) {
    float amax = 0.0f;
    for (u32 j = 0; j < n; j++) amax = fmaxf(amax, fabsf(v[j]));
    float scale, fmax = 6.0f;
    if (format == 0) {
        fmax = 448.0f;
        scale = pow2_scale(fmaxf(amax, 1e-4f), 448.0f);
    } else if (format == 1) {
        scale = pow2_scale(fmaxf(amax, 7.052966104933725e-38f), 6.0f);  // 6 * 2^-126
    } else {
        scale = round_e4m3(fmaxf(amax, 0.01171875f) / 6.0f);  // 6 * 2^-9
    }
    for (u32 j = 0; j < n; j++) {
        const float q = fminf(fmaxf(v[j] / scale, -fmax), fmax);
        v[j] = (format == 0 ? round_e4m3(q) : round_e2m1(q)) * scale;
    }
}

// FP8 (E4M3) round trip of one 64-value block held two values per lane by
// one warp (a block may be short: `valid` masks the missing values).
__device__ __forceinline__ void fp8_block_roundtrip_warp(float& a, float& b, bool va, bool vb) {
    float m = fmaxf(va ? fabsf(a) : 0.0f, vb ? fabsf(b) : 0.0f);
    m = fmaxf(warp_max(m), 1e-4f);
    float s = pow2_scale(m, 448.0f);
    if (va) a = round_e4m3(fminf(fmaxf(a / s, -448.0f), 448.0f)) * s;
    if (vb) b = round_e4m3(fminf(fmaxf(b / s, -448.0f), 448.0f)) * s;
}

// FP4 (E2M1) round trip of one 32-value block, one value per lane.
__device__ __forceinline__ float fp4_block_roundtrip_warp(float v) {
    float m = fmaxf(warp_max(fabsf(v)), 7.052966104933725e-38f);
    float s = pow2_scale(m, 6.0f);
    return round_e2m1(fminf(fmaxf(v / s, -6.0f), 6.0f)) * s;
}

// In-place normalised Walsh-Hadamard transform of buf[0..n) in shared
// memory (n a power of two, n <= blockDim.x); the same butterflies as
// quant::small_float::hadamard_inplace, so results are bit-identical.
__device__ void hadamard_shared(float* buf, u32 n) {
    const u32 j = threadIdx.x;
    for (u32 h = 1; h < n; h <<= 1) {
        __syncthreads();
        float a = 0.0f, b = 0.0f;
        bool lead = j < n && (j & h) == 0;
        if (lead) {
            a = buf[j];
            b = buf[j + h];
        }
        __syncthreads();
        if (lead) {
            buf[j] = a + b;
            buf[j + h] = a - b;
        }
    }
    __syncthreads();
    if (j < n) buf[j] *= 1.0f / sqrtf((float)n);
    __syncthreads();
}
