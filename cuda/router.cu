// MoE router (ops::moe::Router): s_e = sqrt(softplus(logit_e)); experts from
// the hash table (first layers) or the k largest s_e + bias_e (ties to the
// lower index, by rank counting over total-order keys); weights s/sum*scale.
// Launch: one block of 256 threads per token (n_expert <= 1024).

#define ROUTER_MAX_E 1024

__device__ __forceinline__ float softplus_ds4(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return expf(x);
    return log1pf(expf(x));
}

extern "C" __global__ void router(const float* logits, const int* tokens, const float* bias, const int* table,
                                  u32 table_cols, int* sel, float* weights, u32 n_expert, u32 k, float scale,
                                  u32 normalize, const Step* st) {
    __shared__ float s[ROUTER_MAX_E];
    __shared__ u32 key[ROUTER_MAX_E];
    const u32 t = blockIdx.x;
    if (t >= st->n_tokens || n_expert > ROUTER_MAX_E) return;
    for (u32 e = threadIdx.x; e < n_expert; e += blockDim.x) {
        s[e] = sqrtf(softplus_ds4(logits[(u64)t * n_expert + e]));
        key[e] = order_key(s[e] + (bias ? bias[e] : 0.0f));
    }
    __syncthreads();
    int* chosen = sel + (u64)t * k;
    if (table) {
        for (u32 i = threadIdx.x; i < k; i += blockDim.x) chosen[i] = table[(u64)tokens[t] * table_cols + i];
    } else {
        for (u32 e = threadIdx.x; e < n_expert; e += blockDim.x) {
            u32 rank = 0;
            for (u32 o = 0; o < n_expert; o++) rank += (key[o] > key[e]) || (key[o] == key[e] && o < e);
            if (rank < k) chosen[rank] = (int)e;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (u32 i = 0; i < k; i++) sum += s[chosen[i]];
        const float denom = normalize ? fmaxf(sum, 1.0f / 16384.0f) : 1.0f;
        for (u32 i = 0; i < k; i++) weights[(u64)t * k + i] = s[chosen[i]] / denom * scale;
    }
}
