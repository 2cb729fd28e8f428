// Raw-window ring update (ops::attention::RingWrite): the step's last
// `window` KV rows go to slot (pos mod window). Launch: one thread per
// value, 256 threads, grid-stride.

extern "C" __global__ void ring_write(const float* kv, float* ring, u32 window, u32 dim, const Step* st) {
    kv += (u64)st->row0 * dim;  // this session's rows
    const u32 n = st->n_tokens, first = n > window ? n - window : 0, total = (n - first) * dim;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = first + i / dim, k = i % dim;
        const u32 r = (st->pos0 + t) % window;
        ring[(u64)r * dim + k] = kv[(u64)t * dim + k];
    }
}
