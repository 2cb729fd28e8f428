// Matrix x activations with weights decoded from the stored type
// (ops::matmul::MatMul, groups included): out[t][o] = W[o] . x[t][g*in..].
//
// Launch: grid (ceil(n_out / 8), ceil(max_tokens / MM_TT)), 256 threads.
// Each warp owns one weight row; lane l decodes 32-value units l, l+32, ...
// once and applies each to the block's tile of up to MM_TT tokens (weights
// are read once per token tile: decode = 1 tile, bandwidth-bound; prefill
// reuses every decoded unit MM_TT times). Partial sums are reduced with warp
// shuffles. Widths that are not whole units (float types) take a scalar
// path; otherwise x rows are 16-byte aligned (slots are 256-byte aligned).

#define MM_TT 8
#define MM_ROWS 8

template <int TY>
__device__ void matmul_impl(const u8* w, u32 row_bytes, u32 n_in, u32 n_out, u32 groups, const float* x,
                            float* out, u32 fixed_rows, const Step* st) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 o = blockIdx.x * MM_ROWS + warp;
    const u32 t0 = blockIdx.y * MM_TT, n = live_rows(fixed_rows, st);
    if (o >= n_out || t0 >= n) return;
    const u32 tt = min((u32)MM_TT, n - t0);
    const u32 g = o / (n_out / groups), x_stride = groups * n_in, units = n_in / 32;
    const u8* row = w + (u64)o * row_bytes;
    float acc[MM_TT];
#pragma unroll
    for (int k = 0; k < MM_TT; k++) acc[k] = 0.0f;
    if (n_in % 32 == 0) {
        // Fast path: whole units, 16-byte loads of weights and activations.
        for (u32 u = lane; u < units; u += 32) {
            float v[32];
            decode32<TY>(row, u, v);
#pragma unroll
            for (int k = 0; k < MM_TT; k++) {
                if ((u32)k < tt) acc[k] += dot32(v, x + (u64)(t0 + k) * x_stride + (u64)g * n_in + 32 * u);
            }
        }
    } else {
        // Odd widths (float types only): one value per lane per step.
        for (u32 i = lane; i < n_in; i += 32) {
            const float wv = decode1<TY>(row, i);
#pragma unroll
            for (int k = 0; k < MM_TT; k++) {
                if ((u32)k < tt) acc[k] += wv * x[(u64)(t0 + k) * x_stride + (u64)g * n_in + i];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MM_TT; k++) {
        const float s = warp_sum(acc[k]);
        if (lane == 0 && (u32)k < tt) out[(u64)(t0 + k) * n_out + o] = s;
    }
}

#define MATMUL_KERNEL(name, TY)                                                                              \
    extern "C" __global__ void matmul_##name(const u8* w, u32 row_bytes, u32 n_in, u32 n_out, u32 groups,    \
                                             const float* x, float* out, u32 fixed_rows, const Step* st) {   \
        matmul_impl<TY>(w, row_bytes, n_in, n_out, groups, x, out, fixed_rows, st);                          \
    }
FOR_EACH_WEIGHT_TYPE(MATMUL_KERNEL)
