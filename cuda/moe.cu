// Routed experts (ops::moe::MoeExperts) with the expert indices and weights
// read on the GPU:
//   expert_rows_<ty>: y[slot][o] = W_e[o] . x_in(slot), e = selected[slot];
//     x_in = x[slot / k] (per_slot = 0: gate and up) or x[slot] (down).
//     Launch: grid (ceil(n_out / 8), max_tokens * k), 256 threads, one warp
//     per output row, lanes over 32-value units, warp-shuffle reduction.
//   expert_gate_up_<ty> (gate and up of one type, the decode path): one
//     launch reads the gate row and the up row f of the selected expert and
//     writes h[slot][f] = w[slot] * swiglu(g, u, clamp) directly.
//     Launch: grid (ceil(ff / 8), max_tokens * k), 256 threads, one warp per
//     row pair; each lane decodes gate unit u and up unit u (32 values each)
//     into two accumulators, reduced with warp shuffles. Same sums in the
//     same order as two expert_rows launches, so results are identical.
//   expert_swiglu: h[slot][f] = w[slot] * swiglu(g, u, clamp); grid-stride
//     (after two expert_rows launches, when gate and up differ in type).
//   expert_sum: out[t] = sum over slots i in order of y[t*k+i]; grid-stride.
// An index outside 0..n_expert yields zeros (never a wild read), except -2:
// SSD streaming runs a pass whose experts exceed the device slots in rounds,
// and -2 marks the entries of other rounds, whose outputs stay as written.

#define EX_ROWS 8

template <int TY>
__device__ void expert_rows_impl(const u8* w, u32 row_bytes, u64 slab_bytes, u32 n_expert, u32 n_in, u32 n_out,
                                 const float* x, u32 per_slot, const int* sel, u32 k, float* y, const Step* st) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 o = blockIdx.x * EX_ROWS + warp, slot = blockIdx.y;
    if (o >= n_out || slot >= st->n_tokens * k) return;
    const int e = sel[slot];
    if (e == -2) return;  // another round's entry (SSD streaming): left as written
    float acc = 0.0f;
    if (e >= 0 && (u32)e < n_expert) {
        const u8* row = w + (u64)e * slab_bytes + (u64)o * row_bytes;
        const float* xin = x + (u64)(per_slot ? slot : slot / k) * n_in;
        if (n_in % 32 == 0) {
            for (u32 u = lane; u < n_in / 32; u += 32) {
                float v[32];
                decode32<TY>(row, u, v);
                acc += dot32(v, xin + 32 * u);
            }
        } else {
            for (u32 i = lane; i < n_in; i += 32) acc += decode1<TY>(row, i) * xin[i];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(u64)slot * n_out + o] = acc;
}

#define EXPERT_KERNEL(name, TY)                                                                             \
    extern "C" __global__ void expert_rows_##name(const u8* w, u32 row_bytes, u64 slab_bytes, u32 n_expert,  \
                                                  u32 n_in, u32 n_out, const float* x, u32 per_slot,         \
                                                  const int* sel, u32 k, float* y, const Step* st) {         \
        expert_rows_impl<TY>(w, row_bytes, slab_bytes, n_expert, n_in, n_out, x, per_slot, sel, k, y, st);  \
    }
FOR_EACH_WEIGHT_TYPE(EXPERT_KERNEL)

template <int TY>
__device__ void expert_gate_up_impl(const u8* gate, const u8* up, u32 row_bytes, u64 slab_bytes, u32 n_expert,
                                    u32 n_in, u32 ff, const float* x, const int* sel, const float* wts, u32 k,
                                    float clamp, float* h, const Step* st) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 f = blockIdx.x * EX_ROWS + warp, slot = blockIdx.y;
    if (f >= ff || slot >= st->n_tokens * k) return;
    const int e = sel[slot];
    if (e == -2) return;  // another round's entry (SSD streaming): left as written
    float ag = 0.0f, au = 0.0f;
    if (e >= 0 && (u32)e < n_expert) {
        const u64 off = (u64)e * slab_bytes + (u64)f * row_bytes;
        const u8* grow = gate + off;
        const u8* urow = up + off;
        const float* xin = x + (u64)(slot / k) * n_in;
        if (n_in % 32 == 0) {
            for (u32 u = lane; u < n_in / 32; u += 32) {
                float v[32];
                decode32<TY>(grow, u, v);
                ag += dot32(v, xin + 32 * u);
                decode32<TY>(urow, u, v);
                au += dot32(v, xin + 32 * u);
            }
        } else {
            for (u32 i = lane; i < n_in; i += 32) {
                ag += decode1<TY>(grow, i) * xin[i];
                au += decode1<TY>(urow, i) * xin[i];
            }
        }
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0) h[(u64)slot * ff + f] = wts[slot] * swiglu_value(ag, au, clamp);
}

#define GATE_UP_KERNEL(name, TY)                                                                              \
    extern "C" __global__ void expert_gate_up_##name(const u8* gate, const u8* up, u32 row_bytes,             \
                                                     u64 slab_bytes, u32 n_expert, u32 n_in, u32 ff,          \
                                                     const float* x, const int* sel, const float* wts, u32 k, \
                                                     float clamp, float* h, const Step* st) {                 \
        expert_gate_up_impl<TY>(gate, up, row_bytes, slab_bytes, n_expert, n_in, ff, x, sel, wts, k, clamp,   \
                                h, st);                                                                       \
    }
FOR_EACH_WEIGHT_TYPE(GATE_UP_KERNEL)

extern "C" __global__ void expert_swiglu(const float* g, const float* u, const float* wts, float* h, u32 ff,
                                         u32 k, float clamp, const Step* st) {
    const u32 total = st->n_tokens * k * ff;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        h[i] = wts[i / ff] * swiglu_value(g[i], u[i], clamp);
    }
}

extern "C" __global__ void expert_sum(const float* y, float* out, u32 d, u32 k, const Step* st) {
    const u32 total = st->n_tokens * d;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = i / d, c = i % d;
        float a = 0.0f;
        for (u32 s = 0; s < k; s++) a += y[((u64)t * k + s) * d + c];
        out[i] = a;
    }
}
