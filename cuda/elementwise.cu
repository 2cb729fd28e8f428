// Element-wise ops over the live token rows (ops::basic, ops::moe::SwiGlu).
// Launch: 1-D grid-stride, 256 threads, grid sized for the graph capacity.

extern "C" __global__ void add(const float* a, const float* b, float* out, u32 cols, const Step* st) {
    const u32 n = st->n_tokens * cols;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = a[i] + b[i];
    }
}

extern "C" __global__ void scale(const float* x, float* out, float factor, u32 cols, const Step* st) {
    const u32 n = st->n_tokens * cols;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = x[i] * factor;
    }
}

extern "C" __global__ void swiglu(const float* g, const float* u, float* out, float clamp, u32 cols,
                                  const Step* st) {
    const u32 n = st->n_tokens * cols;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = swiglu_value(g[i], u[i], clamp);
    }
}

// out[0..cols) = x[n_tokens-1][0..cols).
extern "C" __global__ void take_last(const float* x, float* out, u32 cols, const Step* st) {
    const u32 base = (st->n_tokens - 1) * cols;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x) {
        out[i] = x[base + i];
    }
}
