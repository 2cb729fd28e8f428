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
    // Only the live tokens' sums: `tt` is the same for the whole warp, so
    // the shuffles stay convergent, and a decode step (tt = 1) reduces one
    // accumulator instead of MM_TT.
#pragma unroll
    for (int k = 0; k < MM_TT; k++) {
        if ((u32)k < tt) {
            const float s = warp_sum(acc[k]);
            if (lane == 0) out[(u64)(t0 + k) * n_out + o] = s;
        }
    }
}

#define MATMUL_KERNEL(name, TY)                                                                              \
    extern "C" __global__ void matmul_##name(const u8* w, u32 row_bytes, u32 n_in, u32 n_out, u32 groups,    \
                                             const float* x, float* out, u32 fixed_rows, const Step* st) {   \
        matmul_impl<TY>(w, row_bytes, n_in, n_out, groups, x, out, fixed_rows, st);                          \
    }
FOR_EACH_WEIGHT_TYPE(MATMUL_KERNEL)

// ---- Tensor-core prefill (sm_80+, opt-in: DS4_CUDA_MMA=1) ----
// mma_<ty>: the same product for prefill steps of at least MMA_MIN_TOKENS
// (src/backend/cuda/record.rs) with `mma.sync.aligned.m16n8k16.row.col`
// (f16 operands, f32 accumulate). A block computes a tile of TC_M = 64
// weight rows x TC_N = 32 tokens; per 32-value unit of n_in, threads 0..63
// decode one weight row's unit each and threads 64..127 load 16 activations
// each, all rounded to f16 into shared memory; then each warp (16 rows)
// runs 2 k-halves x 4 token tiles of m16n8k16. Operands are rounded to f16
// (the CPU twin is f32): the tolerance covers that; values beyond f16's
// range would overflow, one reason this path is off by default.
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"), g = lane / 4, q = lane % 4:
//   A regs {a0a1, a2a3, a4a5, a6a7}: rows g, g+8, g, g+8; cols 2q(+1), +8 for a4..a7
//   B regs {b0b1, b2b3}: k = 2q(+1), 2q+8(+1); n = g
//   C c0..c3: rows g, g, g+8, g+8; n = 2q, 2q+1, 2q, 2q+1
// Launch: grid (ceil(n_out / 64), ceil(max_tokens / 32)), 128 threads. The
// tile must sit in one output group (checked when recording).

#define TC_M 64
#define TC_N 32
#define TC_PAD 40

__device__ __forceinline__ u32 pack_h2(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }

__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
#ifdef __CUDA_ARCH__
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();  // never recorded below sm_80
#endif
#else
    emu_mma_16816(d, a, b);  // tests/cuda_emu/emu.h: the same layout in software
#endif
}

template <int TY>
__device__ void mma_impl(const u8* w, u32 row_bytes, u32 n_in, u32 n_out, u32 groups, const float* x, float* out,
                         const Step* st) {
    __shared__ u16 tile_w[TC_M * TC_PAD];
    __shared__ u16 tile_x[TC_N * TC_PAD];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 o0 = blockIdx.x * TC_M, t0 = blockIdx.y * TC_N, n = st->n_tokens;
    if (t0 >= n) return;  // the whole block: no barrier is left waiting
    const u32 g = o0 / (n_out / groups), x_stride = groups * n_in, units = n_in / 32;
    const u32 gq = lane >> 2, q = lane & 3;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (u32 u = 0; u < units; u++) {
        if (tid < TC_M) {
            const u32 o = o0 + tid;
            float v[32];
            if (o < n_out) {
                decode32<TY>(w + (u64)o * row_bytes, u, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 32; i++) tile_w[tid * TC_PAD + i] = f32_to_f16(v[i]);
        } else {
            const u32 j = tid - TC_M, tk = j >> 1, c0 = (j & 1) * 16, t = t0 + tk;
            const float* xr = x + (u64)t * x_stride + (u64)g * n_in + 32 * u + c0;
#pragma unroll
            for (int i = 0; i < 16; i++) tile_x[tk * TC_PAD + c0 + i] = f32_to_f16(t < n ? xr[i] : 0.0f);
        }
        __syncthreads();
#pragma unroll
        for (u32 kk = 0; kk < 32; kk += 16) {
            const u16* ar = tile_w + (warp * 16 + gq) * TC_PAD + kk + 2 * q;
            const u32 a[4] = {pack_h2(ar[0], ar[1]), pack_h2(ar[8 * TC_PAD], ar[8 * TC_PAD + 1]),
                              pack_h2(ar[8], ar[9]), pack_h2(ar[8 * TC_PAD + 8], ar[8 * TC_PAD + 9])};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const u16* br = tile_x + (nt * 8 + gq) * TC_PAD + kk + 2 * q;
                const u32 b[2] = {pack_h2(br[0], br[1]), pack_h2(br[8], br[9])};
                mma_16816(acc[nt], a, b);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 o = o0 + warp * 16 + gq + (i >> 1) * 8, t = t0 + nt * 8 + 2 * q + (i & 1);
            if (o < n_out && t < n) out[(u64)t * n_out + o] = acc[nt][i];
        }
}

#define MMA_KERNEL(name, TY)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        mma_##name(const u8* w, u32 row_bytes, u32 n_in, u32 n_out, u32 groups, const float* x, float* out,  \
                   const Step* st) {                                                                          \
        mma_impl<TY>(w, row_bytes, n_in, n_out, groups, x, out, st);                                          \
    }
FOR_EACH_WEIGHT_TYPE(MMA_KERNEL)
