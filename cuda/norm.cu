// RMS norm (ops::norm::RmsNorm): sum of squares in f64 like the CPU twin.
// Launch: one block of 256 threads per row, grid = rows capacity; rows past
// the live count (fixed_rows, else rows_per_token per token) return at once.
// `w` may be null (unweighted).

extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, u32 dim, float eps,
                                    u32 rows_per_token, u32 fixed_rows, const Step* st) {
    __shared__ double scratch[32];
    const u32 r = blockIdx.x;
    if (r >= (fixed_rows > 0 ? fixed_rows : rows_per_token * st->n_tokens)) return;
    const float* xr = x + (u64)r * dim;
    float* o = out + (u64)r * dim;
    double ss = 0.0;
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, scratch);
    const float s = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        o[i] = w ? xr[i] * s * w[i] : xr[i] * s;
    }
}
