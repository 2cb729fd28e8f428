// DeepSeek V4.1's two-level top-k (twins: ops::candidate::{CandidateBlocks,
// CandidateTopK}); the same math as shaders/candidate.wgsl, with the block
// counts and scans of cuda/select.cuh.
// Launches: min(max_tokens, 64) blocks of SELECT_THREADS looping over the
// tokens, each with a scratch row of max_items keys.

// sum_h w[h] * max(0, q_h . k_r), heads in order; the whole warp calls it.
__device__ float v41_score(const float* q, const float* w, const float* keys, u32 t, u32 r, u32 nh, u32 hd) {
    float s = 0.0f;
    for (u32 h = 0; h < nh; h++) {
        const float* qh = q + ((u64)t * nh + h) * hd;
        float d = 0.0f;
        for (u32 i = threadIdx.x & 31; i < hd; i += 32) d += qh[i] * keys[(u64)r * hd + i];
        s += w[(u64)t * nh + h] * fmaxf(warp_sum(d), 0.0f);
    }
    return s;
}

// Writes to o[] (ascending, in key order of the walk) the ids of the items
// whose key is above the k-th largest of keys[0..n), or equal to it and
// among the first to reach k; `pinned` (or n: none) is always taken and
// takes part in no comparison; keys of 0 are never taken. `id` maps an item
// to the id written. Returns how many were written.
template <typename Id>
__device__ u32 candidate(const u32* keys, u32 n, u32 k, u32 pinned, int* o, u32* buf, Id id) {
    u32 thr = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const u32 cand = thr | (1u << bit);
        u32 c = 0;
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) c += keys[i] >= cand && i != pinned;
        if (block_count(c, buf) >= k) thr = cand;
    }
    u32 c_gt = 0;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) c_gt += keys[i] > thr && i != pinned;
    const u32 need_eq = k - block_count(c_gt, buf);
    u32 eq_seen = 0, taken = 0;
    for (u32 base = 0; base < n; base += SELECT_THREADS) {
        const u32 i = base + threadIdx.x;
        const u32 kk = i < n ? keys[i] : 0;
        const u32 live = i < n && kk != 0 && i != pinned;
        const u32 equal = live && kk == thr;
        u32 eq_tot, ch_tot;
        const u32 eq_rank = eq_seen + block_scan_excl(equal, buf, &eq_tot);
        const u32 chosen = (i < n && i == pinned) || (live && kk > thr) || (equal && eq_rank < need_eq);
        const u32 pos = taken + block_scan_excl(chosen, buf, &ch_tot);
        if (chosen) o[pos] = id(i);
        eq_seen += eq_tot;
        taken += ch_tot;
    }
    return taken;
}

struct V41Ident {
    __device__ int operator()(u32 i) const { return (int)i; }
};

// Level one: the newest block always, and the best topk_blocks - 1 others
// by their best row (ties: lower block); ids ascending, -1 padded.
extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
    candidate_blocks(const float* q, const float* w, const float* keys, int* out, u32* scratch, u32 ratio,
                         u32 nh, u32 hd, u32 kb, u32 bs, u32 max_items, const Step* st) {
    __shared__ u32 buf[SELECT_THREADS];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32* sk = scratch + (u64)blockIdx.x * max_items;
    for (u32 t = blockIdx.x; t < st->n_tokens; t += gridDim.x) {
        int* o = out + (u64)t * kb;
        const u32 v = (st->pos0 + t + 1) / ratio;
        const u32 nb = (v + bs - 1) / bs;
        if (v == 0 || nb <= kb || kb == 0) {
            for (u32 i = threadIdx.x; i < kb; i += blockDim.x) o[i] = i < nb ? (int)i : -1;
            continue;
        }
        const u32 last = (v - 1) / bs;
        for (u32 b = warp; b < nb; b += SELECT_THREADS / 32) {
            float m = -INFINITY;
            if (b != last) {
                const u32 end = min((b + 1) * bs, v);
                for (u32 r = b * bs; r < end; r++) m = fmaxf(m, v41_score(q, w, keys, t, r, nh, hd));
            }
            if (lane == 0) sk[b] = b == last ? 0u : max(order_key(m), 1u);
        }
        __syncthreads();
        candidate(sk, nb, kb - 1, last, o, buf, V41Ident{});
        __syncthreads();
    }
}

struct V41RowOf {
    const int* blocks;
    u32 bs;
    __device__ int operator()(u32 i) const { return (int)((u32)blocks[i / bs] * bs + i % bs); }
};

// Level two: the top_k best visible rows of the kept blocks (all of them
// when no more than top_k), ids ascending, -1 padded. Blocks are ascending
// and distinct (CandidateBlocks' output), so slot order is row order.
extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
    candidate_topk(const float* q, const float* w, const float* keys, const int* blocks, int* out,
                       u32* scratch, u32 ratio, u32 top_k, u32 nh, u32 hd, u32 kb, u32 bs, u32 max_items,
                       const Step* st) {
    __shared__ u32 buf[SELECT_THREADS];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32* sk = scratch + (u64)blockIdx.x * max_items;
    const u32 n = kb * bs;
    for (u32 t = blockIdx.x; t < st->n_tokens; t += gridDim.x) {
        int* o = out + (u64)t * top_k;
        const int* bt = blocks + (u64)t * kb;
        const u32 v = (st->pos0 + t + 1) / ratio;
        u32 valid = 0;
        for (u32 i = warp; i < n; i += SELECT_THREADS / 32) {
            const int b = bt[i / bs];
            const u32 r = (u32)b * bs + i % bs;
            const bool live = b >= 0 && r < v;
            const float s = live ? v41_score(q, w, keys, t, r, nh, hd) : 0.0f;
            if (lane == 0) {
                sk[i] = live ? max(order_key(s), 1u) : 0u;
                valid += live;
            }
        }
        __syncthreads();
        const u32 n_valid = block_count(valid, buf);
        const u32 taken = candidate(sk, n, min(top_k, n_valid), n, o, buf, V41RowOf{bt, bs});
        for (u32 i = taken + threadIdx.x; i < top_k; i += blockDim.x) o[i] = -1;
        __syncthreads();
    }
}
