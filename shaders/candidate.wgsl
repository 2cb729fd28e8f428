// DeepSeek V4.1's two-level top-k (twins: ops::candidate::{CandidateBlocks,
// CandidateTopK}), one workgroup per token, with the indexer's scores and
// selection (shaders/select.wgsl). A scratch key of 0 marks an item that is
// not a candidate (no real score maps to it).

struct CandidateParams {
    ratio: u32,
    top_k: u32,
    n_head: u32,
    head_dim: u32,
    topk_blocks: u32,
    block_size: u32,
    // Scratch keys per token.
    max_items: u32,
    // First token of this dispatch's block (scratch row 0 is this token's).
    t0: u32,
    // Rows per chunk binding of the keys (keys0..7).
    chunk_rows: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: CandidateParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read> keys0: array<f32>;
// CandidateBlocks' output (candidate_topk only), [T, topk_blocks].
@group(0) @binding(5) var<storage, read> blocks: array<i32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<i32>;
// Keys beyond one binding: chunks of chunk_rows whole rows (the index keys
// grow with the context; docs/ARCHITECTURE.md, "Chunked state bindings"):
// keys1..keys7 and keys_load (src/backend/wgpu/shaders.rs).
//#chunks keys 8 read f32
@group(0) @binding(15) var<storage, read> row_table: array<RowRecord>;

// Level one: the newest block (key 0, always taken) and the best
// topk_blocks - 1 others by their best row; ids ascending, -1 padded.
@compute @workgroup_size(WG)
fn candidate_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) tid: u32) {
    let t = prm.t0 + group_id(wid, nwg);
    if (t >= step.n_tokens) { return; }
    let kb = prm.topk_blocks;
    let bs = prm.block_size;
    let o = t * kb;
    let v = (row_table[t].pos + 1u) / prm.ratio;
    let nb = (v + bs - 1u) / bs;
    if (v == 0u || nb <= kb || kb == 0u) {
        for (var i = tid; i < kb; i += WG) { out[o + i] = select(-1, i32(i), i < nb); }
        return;
    }
    let last = (v - 1u) / bs;
    let sb = (t - prm.t0) * prm.max_items;
    for (var b = tid; b < nb; b += WG) {
        var m = -3.4028235e38;
        var key = 0u;
        if (b != last) {
            for (var r = b * bs; r < min((b + 1u) * bs, v); r++) { m = max(m, score(t, r)); }
            key = max(order_key(m), 1u);
        }
        scratch[sb + b] = key;
    }
    storageBarrier();
    workgroupBarrier();
    let sel = kth_key(sb, nb, kb - 1u, tid);
    var walk = Walk(0u, 0u);
    for (var b0 = 0u; b0 < nb; b0 += WG) {
        let b = b0 + tid;
        var above = false;
        var equal = false;
        if (b < nb) {
            let kk = scratch[sb + b];
            above = kk > sel.x || b == last;
            equal = kk == sel.x && b != last;
        }
        let slot = walk_block(&walk, above, equal, sel.y, tid);
        if (slot >= 0) { out[o + u32(slot)] = i32(b); }
    }
}

// Level two: the top_k best visible rows of the kept blocks (all of them
// when no more than top_k), ids ascending, -1 padded. Blocks are ascending
// and distinct (CandidateBlocks' output), so slot order is row order.
@compute @workgroup_size(WG)
fn candidate_topk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) tid: u32) {
    let t = prm.t0 + group_id(wid, nwg);
    if (t >= step.n_tokens) { return; }
    let kb = prm.topk_blocks;
    let bs = prm.block_size;
    let k = prm.top_k;
    let o = t * k;
    let v = (row_table[t].pos + 1u) / prm.ratio;
    let n = kb * bs;
    let sb = (t - prm.t0) * prm.max_items;
    var valid = 0u;
    for (var i = tid; i < n; i += WG) {
        let b = blocks[t * kb + i / bs];
        let r = u32(b) * bs + i % bs;
        var key = 0u;
        if (b >= 0 && r < v) {
            key = max(order_key(score(t, r)), 1u);
            valid += 1u;
        }
        scratch[sb + i] = key;
    }
    let n_valid = wg_count(valid, tid);
    storageBarrier();
    workgroupBarrier();
    // Fewer candidates than top_k: the search's k is their count, so the
    // threshold is the smallest of them and every one is taken.
    let sel = kth_key(sb, n, min(k, n_valid), tid);
    var walk = Walk(0u, 0u);
    for (var i0 = 0u; i0 < n; i0 += WG) {
        let i = i0 + tid;
        var above = false;
        var equal = false;
        if (i < n) {
            let kk = scratch[sb + i];
            above = kk > sel.x && kk != 0u;
            equal = kk == sel.x && kk != 0u;
        }
        let slot = walk_block(&walk, above, equal, sel.y, tid);
        if (slot >= 0) { out[o + u32(slot)] = i32(u32(blocks[t * kb + i / bs]) * bs + i % bs); }
    }
    for (var i = walk.taken + tid; i < k; i += WG) { out[o + i] = -1; }
}
