// Top-k selection for the indexer (indexer.wgsl) and V4.1's two-level top-k
// (candidate.wgsl), one workgroup per token. A row's score is
// sum_h w[h] * max(0, q_h . k_r); selections go through order-preserving
// u32 keys in a scratch row per token and a bitwise search for the k-th
// largest key, then one ordered walk writes the chosen ids ascending, ties
// to the lower id.
//
// The including module declares `prm` (with n_head, head_dim and
// chunk_rows: rows per chunk binding of the keys), the bindings `q`, `wts`
// and `scratch: array<u32>`, and `keys_load(c, o)`: value `o` of chunk `c`
// of the chunked keys. Every function with a barrier is called by the whole
// workgroup in uniform control flow.

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

// sum_h w[h] * max(0, q_h . k_r) of token row t and key row r, heads in order.
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

// The k-th largest of the n keys at scratch[sb..] (the largest T with
// count(key >= T) >= k; 0 when fewer than k are non-zero), and how many keys
// equal to it are to be taken.
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

// An ordered walk over the items, WG at a time: how many were taken, how
// many equal to the threshold were seen.
struct Walk {
    taken: u32,
    eq_seen: u32,
}

// One block of the walk: this thread's item is chosen if it is above the
// threshold, or equal to it and among the first `need_eq` equal ones.
// Returns the chosen item's output slot, or -1.
fn walk_block(w: ptr<function, Walk>, above: bool, equal: bool, need_eq: u32, tid: u32) -> i32 {
    let eq_before = wg_scan(select(0u, 1u, equal), tid);
    let eq_total = wg_count(select(0u, 1u, equal), tid);
    let chosen = above || (equal && (*w).eq_seen + eq_before < need_eq);
    let pos = wg_scan(select(0u, 1u, chosen), tid);
    let n_chosen = wg_count(select(0u, 1u, chosen), tid);
    var slot = -1i;
    if (chosen) { slot = i32((*w).taken + pos); }
    (*w).taken += n_chosen;
    (*w).eq_seen += eq_total;
    return slot;
}
