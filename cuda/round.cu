// The official numerics' rounding steps (ops::round).
//
// kv_round: one block per row, one warp per 64-value FP8 block (two values
// per lane), blockDim = 32 * ceil(dim / 64) <= 1024.
// hadamard_fp4: one block per head, blockDim = max(head_dim, 32) (head_dim a
// power of two <= 1024), the head in shared memory; one warp per 32-value
// FP4 block (lanes past a short head add nothing to the block maximum).
// block_round: one block per head of `dim` values (rows_per_token per
// token), one thread per `block`-value block of it, read and written in
// global memory (V4.1's rows reach 8192 values); x may be out (in place).

extern "C" __global__ void __launch_bounds__(1024) kv_round(const float* x, float* out, u32 dim, u32 n_rot, u32 fp8, u32 to_f16,
                                    const Step* st) {
    const u32 r = blockIdx.x;
    if (r >= st->n_tokens) return;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 i0 = 64 * warp + 2 * lane, i1 = i0 + 1;
    const u32 nq = dim > n_rot ? dim - n_rot : 0;  // FP8 covers the non-rotary dims
    const float* xr = x + (u64)r * dim;
    float a = i0 < dim ? xr[i0] : 0.0f, b = i1 < dim ? xr[i1] : 0.0f;
    if (fp8 && 64 * warp < nq) fp8_block_roundtrip_warp(a, b, i0 < nq, i1 < nq);
    if (to_f16) {
        a = round_f16(a);
        b = round_f16(b);
    }
    if (i0 < dim) out[(u64)r * dim + i0] = a;
    if (i1 < dim) out[(u64)r * dim + i1] = b;
}

extern "C" __global__ void __launch_bounds__(1024) hadamard_fp4(const float* x, float* out, u32 cols, u32 head_dim, const Step* st) {
    extern __shared__ float buf[];
    const u32 heads = cols / head_dim, h = blockIdx.x;
    if (h >= st->n_tokens * heads) return;
    const u64 base = (u64)h * head_dim;
    const u32 j = threadIdx.x;
    if (j < head_dim) buf[j] = x[base + j];
    hadamard_shared(buf, head_dim);
    float v = j < head_dim ? buf[j] : 0.0f;
    v = fp4_block_roundtrip_warp(v);  // v = 0 past the head: no effect on the max
    if (j < head_dim) out[base + j] = v;
}

// The official act_quant / fp4_act_quant round trip (twin:
// ops::round::BlockRound), written beside the input.
extern "C" __global__ void __launch_bounds__(256)
    block_round(const float* x, float* out, u32 dim, u32 rows_per_token, u32 block, u32 format, const Step* st) {
    const u32 r = blockIdx.x;
    if (r >= st->n_tokens * rows_per_token) return;
    const u64 base = (u64)r * dim;
    for (u32 b = threadIdx.x * block; b < dim; b += blockDim.x * block) {
        const u32 n = min(block, dim - b);
        for (u32 j = 0; j < n; j++) out[base + b + j] = x[base + b + j];
        round_block(out + base + b, n, format);
    }
}
