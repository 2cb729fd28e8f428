// The device's read bandwidth for `ds4-bench --bandwidth --backend cuda`
// (twin of shaders/bandwidth.wgsl): every thread sums (xor) 16-byte words
// of a buffer, grid-strided so each warp reads 512 consecutive bytes per
// step (coalesced), and writes its one result so the loads are not elided.
//
// Launch: grid = 32 blocks per SM (bounded by the words), 256 threads.

extern "C" __global__ void read_all(const uint4* src, u64 n_words, u32* sink) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u32 acc = 0;
    for (u64 i = tid; i < n_words; i += stride) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    sink[tid] = acc;
}
