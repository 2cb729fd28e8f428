// DeepSeek V4.1's Engram gate (twin: ops::engram::EngramGate); the same
// math as shaders/engram.wgsl. The Engram rows are fed by the host
// (docs/V41.md): no kernel reads a table. Launch: one 256-thread block per
// (token, stream).

// gate_h = sigmoid(signed sqrt(max(|dot|, 1e-6))), dot = sum(x qw kw key)
// * rstd(x) * rstd(key) / sqrt(dim) (sums in f64 as the twin); out = x +
// gate_h * value.
extern "C" __global__ void __launch_bounds__(256)
    engram_gate(const float* state, const float* kv, const float* qw, const float* kw, float* out, u32 n,
                    u32 d, float eps, const Step* st) {
    __shared__ double scratch[32];
    const u32 g = blockIdx.x;
    if (g >= st->n_tokens * n) return;
    const u32 t = g / n, h = g % n;
    const float* x = state + (u64)g * d;
    const float* key = kv + ((u64)t * (n + 1) + h) * d;
    const float* value = kv + ((u64)t * (n + 1) + n) * d;
    double raw = 0.0, xx = 0.0, kk = 0.0;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        const double a = x[j], k = key[j];
        raw += a * ((double)qw[(u64)h * d + j] * (double)kw[(u64)h * d + j]) * k;
        xx += a * a;
        kk += k * k;
    }
    raw = block_sum_d(raw, scratch);
    __syncthreads();
    xx = block_sum_d(xx, scratch);
    __syncthreads();
    kk = block_sum_d(kk, scratch);
    const double rstd = 1.0 / sqrt(xx / d + (double)eps) / sqrt(kk / d + (double)eps);
    const double dot = raw * rstd / sqrt((double)d);
    const double mag = sqrt(fmax(fabs(dot), 1e-6));
    const float gate = (float)(1.0 / (1.0 + exp(dot < 0.0 ? mag : -mag)));
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) out[(u64)g * d + j] = x[j] + gate * value[j];
}
