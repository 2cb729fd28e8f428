// Attention with sinks (ops::attention::Attention): for token t at
// p = pos0 + t, softmax over the raw rows max(0, p-W+1)..=p (ring or this
// step's kv), the visible compressed rows (all, or the indexer's choice)
// and the head's sink logit. With `block` (a DSpark draft block) every row
// sees the ring's positions max(0, pos0-W)..pos0-1 and all the step's rows.
// Two passes like the CPU twin: the maximum
// first, then the weights and the weighted sum.
// Launch: grid (n_head, max_tokens), 256 threads (8 warps); each warp takes
// every 8th candidate row; lanes stride the head dims (head_dim <= 512);
// the q head and the per-warp sums live in shared memory.

#define ATT_WARPS 8
#define ATT_MAX_HD 512

__device__ __forceinline__ const float* att_row(u32 j, u32 n_win, u32 lo, u32 pos0, u32 t, const float* kv,
                                                const float* ring, const float* comp, const int* sel,
                                                u32 top_k, u32 n_vis, u32 window, u32 hd) {
    if (j < n_win) {
        const u32 s = lo + j;
        return s >= pos0 ? kv + (u64)(s - pos0) * hd : ring + (u64)(s % window) * hd;
    }
    const u32 c = j - n_win;
    if (sel) {
        const int r = sel[(u64)t * top_k + c];
        if (r < 0 || (u32)r >= n_vis) return nullptr;
        return comp + (u64)r * hd;
    }
    return comp + (u64)c * hd;
}

extern "C" __global__ void attention(const float* q, const float* kv, const float* ring, const float* comp,
                                     const int* sel, const float* sinks, float* out, u32 window, u32 ratio,
                                     u32 top_k, u32 n_head, u32 hd, u32 block, const Step* st) {
    __shared__ float qs[ATT_MAX_HD];
    __shared__ float part[ATT_WARPS][ATT_MAX_HD];
    __shared__ float wmax[ATT_WARPS], wden[ATT_WARPS];
    const u32 h = blockIdx.x, t = blockIdx.y;
    if (t >= st->n_tokens || hd > ATT_MAX_HD) return;
    // This session's rows start at row0 of the step's activations.
    const u64 row0 = st->row0;
    q += row0 * n_head * hd;
    kv += row0 * hd;
    out += row0 * n_head * hd;
    if (sel) sel += row0 * top_k;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 pos0 = st->pos0, p = pos0 + t;
    const u32 lo = block ? (pos0 > window ? pos0 - window : 0) : (p + 1 > window ? p + 1 - window : 0);
    const u32 n_win = (block ? pos0 + st->n_tokens - 1 : p) + 1 - lo;
    const u32 n_vis = (comp && ratio) ? (p + 1) / ratio : 0;
    const u32 n_comp = comp ? (sel ? top_k : n_vis) : 0;
    const u32 n_rows = n_win + n_comp;
    const float scale = 1.0f / sqrtf((float)hd);
    const u64 qw = (u64)n_head * hd;
    for (u32 i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[t * qw + (u64)h * hd + i];
    __syncthreads();

    // Pass 1: the largest logit (the sink included).
    float mx = -INFINITY;
    for (u32 j = warp; j < n_rows; j += ATT_WARPS) {
        const float* r = att_row(j, n_win, lo, pos0, t, kv, ring, comp, sel, top_k, n_vis, window, hd);
        if (!r) continue;
        float d = 0.0f;
        for (u32 i = lane; i < hd; i += 32) d += qs[i] * r[i];
        mx = fmaxf(mx, warp_sum(d) * scale);
    }
    if (lane == 0) wmax[warp] = mx;
    __syncthreads();
    float m = sinks[h];
    for (u32 w = 0; w < ATT_WARPS; w++) m = fmaxf(m, wmax[w]);

    // Pass 2: weights and the weighted sum (16 dims per lane at most).
    float acc[ATT_MAX_HD / 32];
#pragma unroll
    for (int k = 0; k < ATT_MAX_HD / 32; k++) acc[k] = 0.0f;
    float den = 0.0f;
    for (u32 j = warp; j < n_rows; j += ATT_WARPS) {
        const float* r = att_row(j, n_win, lo, pos0, t, kv, ring, comp, sel, top_k, n_vis, window, hd);
        if (!r) continue;
        float d = 0.0f;
        for (u32 i = lane; i < hd; i += 32) d += qs[i] * r[i];
        const float e = expf(warp_sum(d) * scale - m);
        den += e;
#pragma unroll
        for (int k = 0; k < ATT_MAX_HD / 32; k++) {
            const u32 i = lane + 32 * k;
            if (i < hd) acc[k] += e * r[i];
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_MAX_HD / 32; k++) {
        const u32 i = lane + 32 * k;
        if (i < hd) part[warp][i] = acc[k];
    }
    if (lane == 0) wden[warp] = den;
    __syncthreads();
    float total = expf(sinks[h] - m);
    for (u32 w = 0; w < ATT_WARPS; w++) total += wden[w];
    const float inv = 1.0f / total;
    for (u32 i = threadIdx.x; i < hd; i += blockDim.x) {
        float s = 0.0f;
        for (u32 w = 0; w < ATT_WARPS; w++) s += part[w][i];
        out[t * qw + (u64)h * hd + i] = s * inv;
    }
}
