// Device read bandwidth probe (ds4-bench --bandwidth): every invocation XORs
// a grid-strided run of 16-byte words, so consecutive invocations read
// consecutive words, and stores one word so the loads cannot be dropped.

struct BandwidthParams {
    n_words: u32,      // vec4<u32> words in SRC
    n_threads: u32,    // invocations in the grid (the stride)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> P: BandwidthParams;
@group(0) @binding(1) var<storage, read> SRC: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> SINK: array<u32>;

@compute @workgroup_size(256)
fn read_all(@builtin(global_invocation_id) gid: vec3<u32>) {
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < P.n_words; i += P.n_threads) {
        acc ^= SRC[i];
    }
    SINK[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

// The same reads in contiguous runs per invocation (what a CPU emulator
// streams best; GPUs prefer read_all). The benchmark keeps the faster.
@compute @workgroup_size(256)
fn read_blocked(@builtin(global_invocation_id) gid: vec3<u32>) {
    let per = (P.n_words + P.n_threads - 1u) / P.n_threads;
    let start = gid.x * per;
    let end = min(start + per, P.n_words);
    var acc = vec4<u32>(0u);
    for (var i = start; i < end; i++) {
        acc ^= SRC[i];
    }
    SINK[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
