// DeepSeek V4.1's two-level top-k (twins: ops::v41::{CandidateBlocks,
// CandidateTopK}), one workgroup per token. A row's score is
// sum_h w[h] * max(0, q_h . k_r), as the indexer's. Selections go through
// order-preserving u32 keys in a scratch row per token (0 = not a
// candidate: no real score maps to it) and a bitwise search for the k-th
// largest key, then one ordered walk writes the chosen ids ascending, ties
// to the lower id (shaders/indexer.wgsl does the same).

struct V41SelectParams {
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
@group(0) @binding(1) var<uniform> prm: V41SelectParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read> keys0: array<f32>;
// CandidateBlocks' output (v41_candidate_topk only), [T, topk_blocks].
@group(0) @binding(5) var<storage, read> blocks: array<i32>;
@group(0) @binding(6) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<i32>;
// Keys beyond one binding: chunks of chunk_rows whole rows (the index keys
// grow with the context; docs/ARCHITECTURE.md, "Chunked state bindings").
@group(0) @binding(8) var<storage, read> keys1: array<f32>;
@group(0) @binding(9) var<storage, read> keys2: array<f32>;
@group(0) @binding(10) var<storage, read> keys3: array<f32>;
@group(0) @binding(11) var<storage, read> keys4: array<f32>;
@group(0) @binding(12) var<storage, read> keys5: array<f32>;
@group(0) @binding(13) var<storage, read> keys6: array<f32>;
@group(0) @binding(14) var<storage, read> keys7: array<f32>;
@group(0) @binding(15) var<storage, read> row_table: array<RowRecord>;

// Value `o` of chunk `c` of the chunked keys.
fn keys_load(c: u32, o: u32) -> f32 {
    switch c {
        case 1u: { return keys1[o]; }
        case 2u: { return keys2[o]; }
        case 3u: { return keys3[o]; }
        case 4u: { return keys4[o]; }
        case 5u: { return keys5[o]; }
        case 6u: { return keys6[o]; }
        case 7u: { return keys7[o]; }
        default: { return keys0[o]; }
    }
}

var<workgroup> cnt: array<u32, WG>;

fn wg_count(v: u32, tid: u32) -> u32 {
    cnt[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { cnt[tid] += cnt[tid + s]; }
        workgroupBarrier();
    }
    let r = cnt[0];
    workgroupBarrier();
    return r;
}

// Exclusive prefix sum over the workgroup; returns this thread's offset.
fn wg_scan(v: u32, tid: u32) -> u32 {
    cnt[tid] = v;
    workgroupBarrier();
    for (var s = 1u; s < WG; s <<= 1u) {
        var add = 0u;
        if (tid >= s) { add = cnt[tid - s]; }
        workgroupBarrier();
        cnt[tid] += add;
        workgroupBarrier();
    }
    let incl = cnt[tid];
    workgroupBarrier();
    return incl - v;
}

// Order-preserving map of f32 to u32.
fn order_key(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn score(t: u32, r: u32) -> f32 {
    let nh = prm.n_head;
    let hd = prm.head_dim;
    // The row's chunk once per row; the sums are as with one binding.
    let kc = r / prm.chunk_rows;
    let ko = (r % prm.chunk_rows) * hd;
    var s = 0.0;
    for (var h = 0u; h < nh; h++) {
        var d = 0.0;
        let qb = (t * nh + h) * hd;
        for (var j = 0u; j < hd; j++) { d += q[qb + j] * keys_load(kc, ko + j); }
        s += wts[t * nh + h] * max(d, 0.0);
    }
    return s;
}

// The k-th largest of the n keys at scratch[sb..] (0 when fewer than k are
// non-zero), and how many keys equal to it are to be taken.
fn kth_key(sb: u32, n: u32, k: u32, tid: u32) -> vec2<u32> {
    var thr = 0u;
    for (var bit = 31i; bit >= 0i; bit--) {
        let cand = thr | (1u << u32(bit));
        var c = 0u;
        for (var r = tid; r < n; r += WG) { c += select(0u, 1u, scratch[sb + r] >= cand); }
        if (wg_count(c, tid) >= k) { thr = cand; }
    }
    var c_gt = 0u;
    for (var r = tid; r < n; r += WG) { c_gt += select(0u, 1u, scratch[sb + r] > thr); }
    return vec2<u32>(thr, k - wg_count(c_gt, tid));
}

// Level one: the newest block (key 0, always taken) and the best
// topk_blocks - 1 others by their best row; ids ascending, -1 padded.
@compute @workgroup_size(WG)
fn v41_candidate_blocks(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    var taken = 0u;
    var eq_seen = 0u;
    for (var b0 = 0u; b0 < nb; b0 += WG) {
        let b = b0 + tid;
        var above = false;
        var equal = false;
        if (b < nb) {
            let kk = scratch[sb + b];
            above = kk > sel.x || b == last;
            equal = kk == sel.x && b != last;
        }
        let eq_before = wg_scan(select(0u, 1u, equal), tid);
        let eq_total = wg_count(select(0u, 1u, equal), tid);
        let chosen = above || (equal && eq_seen + eq_before < sel.y);
        let pos = wg_scan(select(0u, 1u, chosen), tid);
        let n_chosen = wg_count(select(0u, 1u, chosen), tid);
        if (chosen) { out[o + taken + pos] = i32(b); }
        taken += n_chosen;
        eq_seen += eq_total;
    }
}

// Level two: the top_k best visible rows of the kept blocks (all of them
// when no more than top_k), ids ascending, -1 padded. Blocks are ascending
// and distinct (CandidateBlocks' output), so slot order is row order.
@compute @workgroup_size(WG)
fn v41_candidate_topk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    var taken = 0u;
    var eq_seen = 0u;
    for (var i0 = 0u; i0 < n; i0 += WG) {
        let i = i0 + tid;
        var above = false;
        var equal = false;
        if (i < n) {
            let kk = scratch[sb + i];
            above = kk > sel.x && kk != 0u;
            equal = kk == sel.x && kk != 0u;
        }
        let eq_before = wg_scan(select(0u, 1u, equal), tid);
        let eq_total = wg_count(select(0u, 1u, equal), tid);
        let chosen = above || (equal && eq_seen + eq_before < sel.y);
        let pos = wg_scan(select(0u, 1u, chosen), tid);
        let n_chosen = wg_count(select(0u, 1u, chosen), tid);
        if (chosen) {
            out[o + taken + pos] = i32(u32(blocks[t * kb + i / bs]) * bs + i % bs);
        }
        taken += n_chosen;
        eq_seen += eq_total;
    }
    for (var i = taken + tid; i < k; i += WG) { out[o + i] = -1; }
}
