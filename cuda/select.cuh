// Block-wide counts and scans of the top-k kernels (cuda/indexer.cu,
// cuda/candidate.cu), for blocks of SELECT_THREADS threads; every thread
// of the block calls them together (they synchronise).

#define SELECT_THREADS 256

// Sum of `v` over the block; every thread gets it.
__device__ u32 block_count(u32 v, u32* buf) {
    const u32 j = threadIdx.x;
    buf[j] = v;
    __syncthreads();
    for (u32 s = SELECT_THREADS / 2; s > 0; s >>= 1) {
        if (j < s) buf[j] += buf[j + s];
        __syncthreads();
    }
    const u32 total = buf[0];
    __syncthreads();
    return total;
}

// Exclusive prefix sum of `v` over the block; `total` gets the block sum.
__device__ u32 block_scan_excl(u32 v, u32* buf, u32* total) {
    const u32 j = threadIdx.x;
    buf[j] = v;
    __syncthreads();
    for (u32 off = 1; off < SELECT_THREADS; off <<= 1) {
        u32 a = j >= off ? buf[j - off] : 0;
        __syncthreads();
        buf[j] += a;
        __syncthreads();
    }
    const u32 incl = buf[j];
    *total = buf[SELECT_THREADS - 1];
    __syncthreads();
    return incl - v;
}
