// Lightning indexer top-k (ops::indexer::IndexerTopK): score every visible
// compressed row, keep the top_k (ties to the lower row index), write them
// in increasing row order, -1 padded.
// Launch: grid = min(max_tokens, 64) blocks looping over tokens, 256 threads
// (8 warps). Scores go to `scratch` (max_rows keys per block) as total-order
// keys; the k-th largest key is found by a 4-pass 8-bit radix select, then
// one ordered block scan (cuda/select.cuh) writes the chosen rows.

extern "C" __global__ void indexer_topk(const float* q, const float* weights, const float* rows, int* out,
                                        u32* scratch, u32 ratio, u32 top_k, u32 n_head, u32 hd, u32 max_rows,
                                        const Step* st) {
    __shared__ u32 hist[256];
    __shared__ u32 scan_buf[SELECT_THREADS];
    __shared__ u32 sel_prefix, sel_need;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32* keys = scratch + (u64)blockIdx.x * max_rows;
    // This session's rows start at row0 of the step's activations.
    q += (u64)st->row0 * n_head * hd;
    weights += (u64)st->row0 * n_head;
    out += (u64)st->row0 * top_k;
    for (u32 t = blockIdx.x; t < st->n_tokens; t += gridDim.x) {
        int* o = out + (u64)t * top_k;
        const u32 n = min((st->pos0 + t + 1) / ratio, max_rows);
        if (n <= top_k) {
            for (u32 i = threadIdx.x; i < top_k; i += blockDim.x) o[i] = i < n ? (int)i : -1;
            continue;
        }
        // Scores: s = sum_h w[h] * max(0, q_h . k_r), heads in order.
        for (u32 r = warp; r < n; r += SELECT_THREADS / 32) {
            const float* kr = rows + (u64)r * hd;
            float s = 0.0f;
            for (u32 h = 0; h < n_head; h++) {
                const float* qh = q + ((u64)t * n_head + h) * hd;
                float d = 0.0f;
                for (u32 i = lane; i < hd; i += 32) d += qh[i] * kr[i];
                s += weights[(u64)t * n_head + h] * fmaxf(warp_sum(d), 0.0f);
            }
            if (lane == 0) keys[r] = order_key(s);
        }
        __syncthreads();
        // Radix select of the top_k-th largest key, most significant byte first.
        if (threadIdx.x == 0) {
            sel_prefix = 0;
            sel_need = top_k;
        }
        for (int pass = 3; pass >= 0; pass--) {
            for (u32 b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            const u32 shift = 8 * pass, hi_mask = pass == 3 ? 0u : (0xffffffffu << (shift + 8));
            const u32 prefix = sel_prefix;
            for (u32 r = threadIdx.x; r < n; r += blockDim.x) {
                const u32 kk = keys[r];
                if ((kk & hi_mask) == (prefix & hi_mask)) atomicAdd(&hist[(kk >> shift) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                u32 need = sel_need, b = 256;
                while (b > 0) {
                    b--;
                    if (hist[b] >= need) break;
                    need -= hist[b];
                }
                sel_prefix = prefix | (b << shift);
                sel_need = need;
            }
            __syncthreads();
        }
        const u32 thr = sel_prefix, n_eq = sel_need;  // take the first n_eq rows equal to thr
        // Ordered pass: chosen = key > thr, or key == thr among the first n_eq.
        u32 eq_before = 0, placed = 0;
        for (u32 base = 0; base < n; base += SELECT_THREADS) {
            const u32 r = base + threadIdx.x;
            const u32 kk = r < n ? keys[r] : 0;
            const u32 is_eq = r < n && kk == thr;
            u32 eq_tot, ch_tot;
            const u32 eq_rank = eq_before + block_scan_excl(is_eq, scan_buf, &eq_tot);
            const u32 chosen = r < n && (kk > thr || (is_eq && eq_rank < n_eq));
            const u32 pos = placed + block_scan_excl(chosen, scan_buf, &ch_tot);
            if (chosen && pos < top_k) o[pos] = (int)r;
            eq_before += eq_tot;
            placed += ch_tot;
        }
        for (u32 i = placed + threadIdx.x; i < top_k; i += blockDim.x) o[i] = -1;
        __syncthreads();
    }
}
