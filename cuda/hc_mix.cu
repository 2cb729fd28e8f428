// Hyper-connection mixer (ops::hc::HcMix): pre/post weights and the
// Sinkhorn-normalised stream mixer, per token. Launch: one thread per
// token (n_hc <= 8, the work is tiny), 64 threads per block.

#define HC_MAX 8

extern "C" __global__ void hc_mix(const float* logits, const float* scale, const float* base, float* pre,
                                  float* post, float* comb, u32 n, u32 mix_dim, u32 iters, float eps,
                                  const Step* st) {
    const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= st->n_tokens || n > HC_MAX) return;
    const float* m = logits + (u64)t * mix_dim;
    for (u32 s = 0; s < n; s++) pre[t * n + s] = sigmoidf(m[s] * scale[0] + base[s]) + eps;
    if (post) {
        for (u32 s = 0; s < n; s++) post[t * n + s] = 2.0f * sigmoidf(m[n + s] * scale[1] + base[n + s]);
    }
    if (!comb) return;
    float c[HC_MAX * HC_MAX];
    for (u32 i = 0; i < n * n; i++) c[i] = m[2 * n + i] * scale[2] + base[2 * n + i];
    // Row softmax (+eps), then column / row normalisation (ops::hc::sinkhorn).
    for (u32 r = 0; r < n; r++) {
        float mx = -INFINITY, sum = 0.0f;
        for (u32 j = 0; j < n; j++) mx = fmaxf(mx, c[r * n + j]);
        for (u32 j = 0; j < n; j++) {
            c[r * n + j] = expf(c[r * n + j] - mx);
            sum += c[r * n + j];
        }
        for (u32 j = 0; j < n; j++) c[r * n + j] = c[r * n + j] / sum + eps;
    }
    const u32 rounds = iters > 0 ? iters : 1;  // the first column pass always runs
    for (u32 it = 0; it < rounds; it++) {
        if (it > 0) {
            for (u32 r = 0; r < n; r++) {
                float s = 0.0f;
                for (u32 j = 0; j < n; j++) s += c[r * n + j];
                for (u32 j = 0; j < n; j++) c[r * n + j] /= s + eps;
            }
        }
        for (u32 j = 0; j < n; j++) {
            float s = 0.0f;
            for (u32 r = 0; r < n; r++) s += c[r * n + j];
            for (u32 r = 0; r < n; r++) c[r * n + j] /= s + eps;
        }
    }
    for (u32 i = 0; i < n * n; i++) comb[(u64)t * n * n + i] = c[i];
}
