// The lightning indexer (MODEL.md 3.5.4), one workgroup per token:
// score[r] = sum_h w[h] * max(0, q_h . k_r) over the visible rows (kept in
// a scratch row per token), then the top_k rows (ties to the lower index)
// written in increasing order, -1 padded. The k-th largest score is found
// by a bitwise search over order-preserving u32 keys, so no sort is needed.

struct IndexerParams {
    ratio: u32,
    top_k: u32,
    n_head: u32,
    head_dim: u32,
    // Scratch floats per token (the capacity of the indexer rows).
    max_rows: u32,
    // Rows per chunk binding of the indexer rows (krows0..krows7).
    chunk_rows: u32,
    // First token of this dispatch's block (scratch row 0 is this token's).
    t0: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: IndexerParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read> krows0: array<kvt>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<i32>;
// Rows beyond one binding: chunks of chunk_rows whole rows.
@group(0) @binding(7) var<storage, read> krows1: array<kvt>;
@group(0) @binding(8) var<storage, read> krows2: array<kvt>;
@group(0) @binding(9) var<storage, read> krows3: array<kvt>;
@group(0) @binding(10) var<storage, read> krows4: array<kvt>;
@group(0) @binding(11) var<storage, read> krows5: array<kvt>;
@group(0) @binding(12) var<storage, read> krows6: array<kvt>;
@group(0) @binding(13) var<storage, read> krows7: array<kvt>;
@group(0) @binding(14) var<storage, read> row_table: array<RowRecord>;

// Value `o` of chunk `c` of the chunked krows rows.
fn krows_load(c: u32, o: u32) -> f32 {
    switch c {
        case 1u: { return f32(krows1[o]); }
        case 2u: { return f32(krows2[o]); }
        case 3u: { return f32(krows3[o]); }
        case 4u: { return f32(krows4[o]); }
        case 5u: { return f32(krows5[o]); }
        case 6u: { return f32(krows6[o]); }
        case 7u: { return f32(krows7[o]); }
        default: { return f32(krows0[o]); }
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
fn key(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(WG)
fn indexer_topk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let tl = prm.t0 + group_id(wid, nwg);
    if (tl >= step.n_tokens) { return; }
    // This session's rows start at step.row0 in the step's activations.
    let t = step.row0 + tl;
    let k = prm.top_k;
    let nh = prm.n_head;
    let hd = prm.head_dim;
    let n = (row_table[t].pos + 1u) / prm.ratio;
    let o = t * k;
    if (n <= k) {
        for (var i = tid; i < k; i += WG) { out[o + i] = select(-1, i32(i), i < n); }
        return;
    }
    let sb = (tl - prm.t0) * prm.max_rows;
    for (var r = tid; r < n; r += WG) {
        var s = 0.0;
        let kc = r / prm.chunk_rows;
        let ko = (r % prm.chunk_rows) * hd;
        for (var h = 0u; h < nh; h++) {
            var d = 0.0;
            let qb = t * nh * hd + h * hd;
            for (var j = 0u; j < hd; j++) { d += q[qb + j] * krows_load(kc, ko + j); }
            s += wts[t * nh + h] * max(d, 0.0);
        }
        scratch[sb + r] = key(s);
    }
    storageBarrier();
    workgroupBarrier();
    // Largest T with count(key >= T) >= k: the k-th largest key.
    var thr = 0u;
    for (var bit = 31i; bit >= 0i; bit--) {
        let cand = thr | (1u << u32(bit));
        var c = 0u;
        for (var r = tid; r < n; r += WG) { c += select(0u, 1u, scratch[sb + r] >= cand); }
        if (wg_count(c, tid) >= k) { thr = cand; }
    }
    var c_gt = 0u;
    for (var r = tid; r < n; r += WG) { c_gt += select(0u, 1u, scratch[sb + r] > thr); }
    let need_eq = k - wg_count(c_gt, tid);
    // Walk the rows in order, block by block: a row is chosen if its key is
    // above the threshold, or equal to it and among the first need_eq equal.
    var taken = 0u;
    var eq_seen = 0u;
    for (var b = 0u; b < n; b += WG) {
        let r = b + tid;
        var above = false;
        var equal = false;
        if (r < n) {
            let kk = scratch[sb + r];
            above = kk > thr;
            equal = kk == thr;
        }
        let eq_before = wg_scan(select(0u, 1u, equal), tid);
        let eq_total = wg_count(select(0u, 1u, equal), tid);
        let chosen = above || (equal && eq_seen + eq_before < need_eq);
        let pos = wg_scan(select(0u, 1u, chosen), tid);
        let n_chosen = wg_count(select(0u, 1u, chosen), tid);
        if (chosen) { out[o + taken + pos] = i32(r); }
        taken += n_chosen;
        eq_seen += eq_total;
    }
}
