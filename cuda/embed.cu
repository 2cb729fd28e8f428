// Embedding lookup (ops::basic::Embed): out[t] = table[tokens[t]], decoded
// from the stored type. Launch: one thread per 32-value unit of the live
// rows (per value for widths that are not whole units), 256 threads,
// grid-stride.

template <int TY>
__device__ void embed_impl(const u8* table, u32 row_bytes, u32 dim, const int* tokens, float* out,
                           const Step* st) {
    if (dim % 32 != 0) {
        // Odd widths (float types only): one thread per value.
        const u32 n = st->n_tokens * dim;
        for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            const u32 t = i / dim;
            out[i] = decode1<TY>(table + (u64)(u32)tokens[t] * row_bytes, i % dim);
        }
        return;
    }
    const u32 units = dim / 32, n = st->n_tokens * units;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u32 t = i / units, u = i % units;
        const u8* row = table + (u64)(u32)tokens[t] * row_bytes;
        float v[32];
        decode32<TY>(row, u, v);
#pragma unroll
        for (int k = 0; k < 32; k++) out[(u64)t * dim + 32 * u + k] = v[k];
    }
}

#define EMBED_KERNEL(name, TY)                                                                          \
    extern "C" __global__ void embed_##name(const u8* table, u32 row_bytes, u32 dim, const int* tokens, \
                                            float* out, const Step* st) {                               \
        embed_impl<TY>(table, row_bytes, dim, tokens, out, st);                                         \
    }
FOR_EACH_WEIGHT_TYPE(EMBED_KERNEL)
