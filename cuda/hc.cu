// Hyper-connection stream ops (ops::hc::{HcInit, HcCollapse, HcExpand}).
// Launch: one thread per output value of the live rows, 256 threads,
// grid-stride.

extern "C" __global__ void hc_init(const float* x, float* out, u32 n, u32 dim, const Step* st) {
    const u32 total = st->n_tokens * n * dim;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = i / (n * dim), k = i % dim;
        out[i] = x[(u64)t * dim + k];
    }
}

// out[t][k] = sum_s pre[t][s] * state[t][s][k]
extern "C" __global__ void hc_collapse(const float* state, const float* pre, float* out, u32 n, u32 dim,
                                       const Step* st) {
    const u32 total = st->n_tokens * dim;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = i / dim, k = i % dim;
        float a = 0.0f;
        for (u32 s = 0; s < n; s++) a += pre[t * n + s] * state[((u64)t * n + s) * dim + k];
        out[i] = a;
    }
}

// out[t][k] = post[t][k] * y[t] + sum_j comb[t][j][k] * state[t][j]
extern "C" __global__ void hc_expand(const float* state, const float* y, const float* post, const float* comb,
                                     float* out, u32 n, u32 dim, const Step* st) {
    const u32 total = st->n_tokens * n * dim;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = i / (n * dim), k = (i / dim) % n, e = i % dim;
        float a = post[t * n + k] * y[(u64)t * dim + e];
        for (u32 j = 0; j < n; j++) a += comb[(u64)t * n * n + j * n + k] * state[((u64)t * n + j) * dim + e];
        out[i] = a;
    }
}

// Lagged hyper-connections (DeepSeek V4.1): out[t] = [1, 0, ..., 0], the
// first attention collapses stream 0 only.
extern "C" __global__ void hc_one_hot(float* out, u32 n_hc, const Step* st) {
    const u32 total = st->n_tokens * n_hc;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
        out[i] = i % n_hc == 0 ? 1.0f : 0.0f;
}
