// The output head's input in a step of several sessions (twin of
// `GatherLast::compute` in src/graph/ops/gather.rs): the last row of each
// state's piece into that state's row, zeros for a state with no row.
// `row_state` is the step's per-row state (the row table's `state`
// column); null means every row belongs to state 0, the one state set a
// single-session backend holds. Launch: one thread per output value, 256
// threads, grid-stride.

extern "C" __global__ void gather_last(const float* x, float* out, const u32* row_state, u32 cols,
                                       u32 states, const Step* st) {
    const u32 n = st->n_tokens, total = states * cols;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 s = i / cols, j = i % cols;
        float v = 0.0f;
        for (u32 t = 0; t < n; t++) {
            const u32 rs = row_state ? row_state[t] : 0u;
            if (rs == s) v = x[(u64)t * cols + j];
        }
        out[i] = v;
    }
}
