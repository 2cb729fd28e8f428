// The official numerics' rounding steps (ops::round).
//
// fp8_round: one thread per FP8 block of a row (grid-stride over the
// step's rows_per_token rows of `dim` per token; V4's KV rows in blocks of
// 64 over the non-rotary dims then f16, V4.1's rows in blocks of 32 over
// the whole row; the routed experts' hidden rows, k per token). In place
// when x == out: each thread reads and writes only its own block.
// fp4_round: one block per head, blockDim = max(head_dim, 32) (head_dim a
// power of two <= 1024 for the Hadamard rotation, <= 1024 without), the
// head in shared memory; one thread per 32-value FP4 block.

extern "C" __global__ void fp8_round(const float* x, float* out, u32 dim, u32 n_rot, u32 block, u32 fp8,
                                     u32 to_f16, u32 rows_per_token, const Step* st) {
    const u32 nb = (dim + block - 1) / block;
    const u64 total = (u64)st->n_tokens * rows_per_token * nb;
    const u32 nq = dim > n_rot ? dim - n_rot : 0;  // FP8 covers the non-rotary dims
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 base = i / nb * dim;
        const u32 j0 = (u32)(i % nb) * block, j1 = min(j0 + block, dim);
        for (u32 j = j0; j < j1; j++) out[base + j] = x[base + j];
        if (fp8 && j0 < nq) fp8_block(out + base + j0, min(j1, nq) - j0);
        if (to_f16)
            for (u32 j = j0; j < j1; j++) out[base + j] = round_f16(out[base + j]);
    }
}

extern "C" __global__ void __launch_bounds__(1024) fp4_round(const float* x, float* out, u32 cols, u32 head_dim,
                                                            u32 hadamard, const Step* st) {
    extern __shared__ float buf[];
    const u32 heads = cols / head_dim, h = blockIdx.x;
    if (h >= st->n_tokens * heads) return;
    const u64 base = (u64)h * head_dim;
    const u32 j = threadIdx.x;
    if (j < head_dim) buf[j] = x[base + j];
    __syncthreads();
    if (hadamard) hadamard_shared(buf, head_dim);
    fp4_blocks_shared(buf, head_dim, 32, false);
    if (j < head_dim) out[base + j] = buf[j];
}
