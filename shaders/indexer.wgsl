// The lightning indexer (MODEL.md 3.5.4), one workgroup per token:
// score[r] = sum_h w[h] * max(0, q_h . k_r) over the visible rows (kept in
// a scratch row per token), then the top_k rows (ties to the lower index)
// written in increasing order, -1 padded. The k-th largest score is found
// by a bitwise search over order-preserving u32 keys, so no sort is needed
// (shaders/select.wgsl).

struct IndexerParams {
    ratio: u32,
    top_k: u32,
    n_head: u32,
    head_dim: u32,
    // Scratch floats per token (the capacity of the indexer rows).
    max_rows: u32,
    // Rows per chunk binding of the indexer rows (keys0..keys7).
    chunk_rows: u32,
    // First token of this dispatch's block (scratch row 0 is this token's).
    t0: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: IndexerParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read> keys0: array<kvt>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<i32>;
// Rows beyond one binding: chunks of chunk_rows whole rows (keys1..keys7
// and keys_load, src/backend/wgpu/shaders.rs).
//#chunks keys 7 read kvt
@group(0) @binding(14) var<storage, read> row_table: array<RowRecord>;

@compute @workgroup_size(WG)
fn indexer_topk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let tl = prm.t0 + group_id(wid, nwg);
    if (tl >= step.n_tokens) { return; }
    // This session's rows start at step.row0 in the step's activations.
    let t = step.row0 + tl;
    let k = prm.top_k;
    let n = (row_table[t].pos + 1u) / prm.ratio;
    let o = t * k;
    if (n <= k) {
        for (var i = tid; i < k; i += WG) { out[o + i] = select(-1, i32(i), i < n); }
        return;
    }
    let sb = (tl - prm.t0) * prm.max_rows;
    for (var r = tid; r < n; r += WG) { scratch[sb + r] = order_key(score(t, r)); }
    storageBarrier();
    workgroupBarrier();
    let sel = kth_key(sb, n, k, tid);
    var walk = Walk(0u, 0u);
    for (var b = 0u; b < n; b += WG) {
        let r = b + tid;
        var above = false;
        var equal = false;
        if (r < n) {
            let kk = scratch[sb + r];
            above = kk > sel.x;
            equal = kk == sel.x;
        }
        let slot = walk_block(&walk, above, equal, sel.y, tid);
        if (slot >= 0) { out[o + u32(slot)] = i32(r); }
    }
}
