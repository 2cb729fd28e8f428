// DeepSeek V4.1's compressor of a kv-source layer (twin:
// ops::source_compress::SourceCompress); the same math as shaders/source_compress.wgsl.
// Launch: one 256-thread block, sequential over the step's tokens (the
// state carries).

// Rotates the tail pairs of buf[0..n) (n_rot dims) at `pos` in place.
__device__ void v41_rope(float* buf, u32 n, u32 n_rot, const double* freqs, double pos) {
    const u32 tail = n - n_rot;
    for (u32 k = threadIdx.x; k < n_rot / 2; k += blockDim.x) {
        double sn, cs;
        sincos(pos * freqs[k], &sn, &cs);
        const double x0 = buf[tail + 2 * k], x1 = buf[tail + 2 * k + 1];
        buf[tail + 2 * k] = (float)(x0 * cs - x1 * sn);
        buf[tail + 2 * k + 1] = (float)(x0 * sn + x1 * cs);
    }
}

// RMS norm of buf[0..n) in place (f64 sum of squares, as the twin), times
// `weight`; `scratch` holds 32 doubles of shared memory.
__device__ void v41_rms_norm(float* buf, u32 n, const float* weight, float eps, double* scratch) {
    double ss = 0.0;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) ss += (double)buf[j] * (double)buf[j];
    const float s = (float)(1.0 / sqrt(block_sum_d(ss, scratch) / (double)n + (double)eps));
    __syncthreads();
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) buf[j] = buf[j] * s * weight[j];
    __syncthreads();
}

// The kv source's compressor: latent (ratio 1: the token's projection;
// ratio r: the softmax pool of a whole group, kept in the frontier), RMS
// norm, index key rope(k_norm(wk . latent)) and the roped latent, both at
// row position / r (capacity rows; later ones are dropped as by the twin);
// under model numerics both rounded through FP4 after their RoPE.
extern "C" __global__ void __launch_bounds__(256)
    source_compress(const float* kv, const float* gate, const float* norm, const float* wk,
                 const float* index_norm, float* st_kv, float* st_score, float* rows, float* index_rows,
                 const double* freqs, u32 r, u32 hd, u32 ihd, u32 n_rot, float eps, u32 capacity,
                 u32 round_rows, const Step* st) {
    __shared__ float row[1024];
    __shared__ float key[1024];
    __shared__ double scratch[32];
    for (u32 t = 0; t < st->n_tokens; t++) {
        const u32 p = st->pos0 + t;
        if (r > 1) {
            const u32 slot = p % r;
            for (u32 j = threadIdx.x; j < hd; j += blockDim.x) {
                st_kv[(u64)slot * hd + j] = kv[(u64)t * hd + j];
                st_score[(u64)slot * hd + j] = gate[(u64)t * hd + j];
            }
            __syncthreads();
            if ((p + 1) % r != 0) continue;
            for (u32 j = threadIdx.x; j < hd; j += blockDim.x) {
                float mx = -INFINITY;
                for (u32 s = 0; s < r; s++) mx = fmaxf(mx, st_score[(u64)s * hd + j]);
                float num = 0.0f, den = 0.0f;
                for (u32 s = 0; s < r; s++) {
                    const float e = expf(st_score[(u64)s * hd + j] - mx);
                    den += e;
                    num += e * st_kv[(u64)s * hd + j];
                }
                row[j] = num / den;
            }
        } else {
            for (u32 j = threadIdx.x; j < hd; j += blockDim.x) row[j] = kv[(u64)t * hd + j];
        }
        __syncthreads();
        const u32 w = p / (r > 1 ? r : 1);
        if (w >= capacity) continue;
        v41_rms_norm(row, hd, norm, eps, scratch);
        // One warp per index dim: key[i] = wk[i] . row.
        const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (u32 i = warp; i < ihd; i += blockDim.x / 32) {
            float a = 0.0f;
            for (u32 j = lane; j < hd; j += 32) a += wk[(u64)i * hd + j] * row[j];
            a = warp_sum(a);
            if (lane == 0) key[i] = a;
        }
        __syncthreads();
        v41_rms_norm(key, ihd, index_norm, eps, scratch);
        const double at = (double)w * (double)(r > 1 ? r : 1);
        v41_rope(key, ihd, n_rot, freqs, at);
        v41_rope(row, hd, n_rot, freqs, at);
        __syncthreads();
        if (round_rows) {
            // Model numerics: the index key in FP4 blocks of 32 (UE8M0
            // scales), the latent in FP4 blocks of 16 (E4M3 scales).
            for (u32 b = threadIdx.x * 32; b < ihd; b += blockDim.x * 32) round_block(key + b, min(32u, ihd - b), 1);
            for (u32 b = threadIdx.x * 16; b < hd; b += blockDim.x * 16) round_block(row + b, min(16u, hd - b), 2);
            __syncthreads();
        }
        for (u32 i = threadIdx.x; i < ihd; i += blockDim.x) index_rows[(u64)w * ihd + i] = key[i];
        for (u32 j = threadIdx.x; j < hd; j += blockDim.x) rows[(u64)w * hd + j] = row[j];
        __syncthreads();
    }
}
