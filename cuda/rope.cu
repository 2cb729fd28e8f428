// Partial rotary embedding (ops::rope::Rope) on the tail of every head, in
// f64 like the CPU twin; `freqs` are ops::rope::frequencies, uploaded once.
// Launch: one thread per value of the live rows, 256 threads, grid-stride.

extern "C" __global__ void rope(const float* x, float* out, const double* freqs, u32 n_pairs, u32 heads,
                                u32 head_dim, u32 inverse, const Step* st) {
    const u32 w = heads * head_dim, total = st->n_tokens * w, tail = head_dim - 2 * n_pairs;
    x += (u64)st->row0 * w;  // this session's rows
    out += (u64)st->row0 * w;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 t = i / w, d = i % head_dim;
        if (d < tail) {
            out[i] = x[i];
            continue;
        }
        const u32 k = (d - tail) / 2, first = i - ((d - tail) & 1);
        const double a = (double)(st->pos0 + t) * freqs[k];
        double s, c;
        sincos(a, &s, &c);
        if (inverse) s = -s;
        const double x0 = x[first], x1 = x[first + 1];
        out[i] = ((d - tail) & 1) ? (float)(x0 * s + x1 * c) : (float)(x0 * c - x1 * s);
    }
}
