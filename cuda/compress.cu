// The KV compressor (ops::compress::Compress): sequential over the step's
// tokens (the state carries from one token to the next), so one block does
// a whole op. Launch: 1 block of 1024 threads; thread j owns column j of the
// state (width <= 1024) and dim j of the emitted row (head_dim <= 1024, a
// power of two for the Hadamard rounding).

#define EMPTY_SCORE (-1e30f)

extern "C" __global__ void __launch_bounds__(1024) compress(const float* kv, const float* gate, const float* ape, const float* norm,
                                    float* state_kv, float* state_score, float* rows, const double* freqs,
                                    u32 ratio, u32 hd, u32 overlapped, u32 n_rot, u32 rounding, float eps,
                                    const Step* st) {
    __shared__ float row[1024];
    __shared__ double scratch[32];
    const u32 j = threadIdx.x, m = ratio, c = overlapped ? 2 * hd : hd, cur = overlapped ? m : 0;
    kv += (u64)st->row0 * c;  // this session's rows
    gate += (u64)st->row0 * c;
    for (u32 t = 0; t < st->n_tokens; t++) {
        const u32 p = st->pos0 + t, i = p % m, slot = cur + i;
        if (j < c) {
            state_kv[(u64)slot * c + j] = kv[(u64)t * c + j];
            state_score[(u64)slot * c + j] = gate[(u64)t * c + j] + ape[(u64)i * c + j];
        }
        __syncthreads();
        if ((p + 1) % m != 0) continue;
        const u32 w = (p + 1) / m - 1;
        // Per-dim softmax pool over the candidate slots (overlapped: the
        // previous window's first half, the current window's second half).
        float pooled = 0.0f;
        if (j < hd) {
            float mx = -INFINITY;
            for (u32 k = 0; k < m; k++) mx = fmaxf(mx, state_score[(u64)k * c + j]);
            if (overlapped)
                for (u32 k = 0; k < m; k++) mx = fmaxf(mx, state_score[(u64)(m + k) * c + hd + j]);
            float num = 0.0f, den = 0.0f;
            for (u32 k = 0; k < m; k++) {
                const float e = expf(state_score[(u64)k * c + j] - mx);
                den += e;
                num += e * state_kv[(u64)k * c + j];
            }
            if (overlapped) {
                for (u32 k = 0; k < m; k++) {
                    const float e = expf(state_score[(u64)(m + k) * c + hd + j] - mx);
                    den += e;
                    num += e * state_kv[(u64)(m + k) * c + hd + j];
                }
            }
            pooled = den > 0.0f ? num / den : 0.0f;
        }
        // RMS norm (f64 sum of squares), weighted.
        const double ss = block_sum_d(j < hd ? (double)pooled * (double)pooled : 0.0, scratch);
        const float s = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
        if (j < hd) row[j] = pooled * s * norm[j];
        __syncthreads();
        // RoPE at position w * ratio on the tail pairs.
        const u32 tail = hd - n_rot;
        float v = 0.0f;
        if (j < hd) {
            v = row[j];
            if (j >= tail) {
                const u32 k = (j - tail) / 2, first = j - ((j - tail) & 1);
                double sn, cs;
                sincos((double)(w * m) * freqs[k], &sn, &cs);
                const double x0 = row[first], x1 = row[first + 1];
                v = ((j - tail) & 1) ? (float)(x0 * sn + x1 * cs) : (float)(x0 * cs - x1 * sn);
            }
        }
        __syncthreads();
        if (j < hd) row[j] = v;
        __syncthreads();
        if (rounding == 1) {
            // FP8 on the non-rotary dims in 64-value blocks (one warp each), then f16.
            const u32 warp = j >> 5, lane = j & 31, i0 = 64 * warp + 2 * lane, i1 = i0 + 1;
            const u32 nq = hd - n_rot;
            float a = i0 < hd ? row[i0] : 0.0f, b = i1 < hd ? row[i1] : 0.0f;
            if (64 * warp < nq) fp8_block_roundtrip_warp(a, b, i0 < nq, i1 < nq);
            __syncthreads();
            if (i0 < hd) row[i0] = round_f16(a);
            if (i1 < hd) row[i1] = round_f16(b);
            __syncthreads();
        } else if (rounding == 2) {
            // Hadamard + FP4 (32-value blocks, one warp each), then f16.
            hadamard_shared(row, hd);
            float x = j < hd ? row[j] : 0.0f;
            x = fp4_block_roundtrip_warp(x);
            if (j < hd) row[j] = round_f16(x);
            __syncthreads();
        }
        if (j < hd) rows[(u64)w * hd + j] = row[j];
        // The finished window becomes the previous one; its slots reset.
        if (overlapped) {
            for (u32 e = j; e < m * c; e += blockDim.x) {
                const float a = state_kv[(u64)m * c + e], b = state_score[(u64)m * c + e];
                state_kv[e] = a;
                state_score[e] = b;
            }
        }
        __syncthreads();
        for (u32 e = j; e < m * c; e += blockDim.x) {
            state_kv[(u64)cur * c + e] = 0.0f;
            state_score[(u64)cur * c + e] = EMPTY_SCORE;
        }
        __syncthreads();
    }
}
