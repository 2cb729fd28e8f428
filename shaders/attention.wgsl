// Attention with per-head sinks over the raw window plus the visible
// compressed rows (all of them, or the indexer's selection), MODEL.md
// 3.5.2 and 3.6. One workgroup per (token, head). Candidates are taken in
// chunks of WG: one thread computes one logit, then the chunk joins a
// running (max, denominator, accumulator) softmax (the chunk's max and sum
// through reduce.wgsl); each thread owns up to 4 of the head's dims.
// K = V = the cached row.

struct AttnParams {
    n_head: u32,
    head_dim: u32,
    window: u32,
    top_k: u32,
    // 0: no compressed rows.
    ratio: u32,
    has_sel: u32,
    scale: f32,
    // Compressed rows per chunk binding (comp0..comp7).
    chunk_rows: u32,
    // 1: a DSpark draft block, every row sees the ring's last `window`
    // positions before the step and all the step's rows (no causal mask).
    block: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: AttnParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> kv: array<f32>;
@group(0) @binding(4) var<storage, read> ring: array<kvt>;
@group(0) @binding(5) var<storage, read> comp0: array<kvt>;
@group(0) @binding(6) var<storage, read> sel: array<i32>;
@group(0) @binding(7) var<storage, read> sinks: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;
// Compressed rows beyond one binding: chunks of chunk_rows whole rows
// (comp1..comp7 and comp_load, src/backend/wgpu/shaders.rs).
//#chunks comp 9 read kvt
@group(0) @binding(16) var<storage, read> row_table: array<RowRecord>;

const MAXHD: u32 = 1024u;
const SRC_NONE: u32 = 0u;
const SRC_KV: u32 = 1u;
const SRC_RING: u32 = 2u;
// SRC_COMP + c: chunk c of the compressed rows.
const SRC_COMP: u32 = 3u;

var<workgroup> qs: array<f32, MAXHD>;
var<workgroup> lg: array<f32, WG>;
var<workgroup> src: array<u32, WG>;
var<workgroup> off: array<u32, WG>;

fn load(s: u32, o: u32) -> f32 {
    if (s == SRC_KV) { return kv[o]; }
    if (s == SRC_RING) { return f32(ring[o]); }
    return comp_load(s - SRC_COMP, o);
}

@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             ids: ReduceIds) {
    let tid = reduce_enter(ids);
    let g = group_id(wid, nwg);
    let nh = prm.n_head;
    let hd = prm.head_dim;
    if (g >= step.n_tokens * nh) { return; }
    // This session's rows start at step.row0 in the step's activations.
    let t = step.row0 + g / nh;
    let h = g % nh;
    let p = row_table[t].pos;
    let w = prm.window;
    var lo = select(0u, p + 1u - w, p + 1u > w);
    var hi = p;
    if (prm.block != 0u) {
        lo = select(0u, step.pos0 - w, step.pos0 > w);
        hi = step.pos0 + step.n_tokens - 1u;
    }
    let n_raw = hi - lo + 1u;
    var n_vis = 0u;
    var n_comp = 0u;
    if (prm.ratio > 0u) {
        n_vis = (p + 1u) / prm.ratio;
        n_comp = select(n_vis, prm.top_k, prm.has_sel != 0u);
    }
    let total = n_raw + n_comp;
    let qbase = t * nh * hd + h * hd;
    for (var j = tid; j < hd; j += WG) { qs[j] = q[qbase + j]; }
    workgroupBarrier();

    let sink = sinks[h];
    var m = sink;
    var den = 1.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var base = 0u; base < total; base += WG) {
        let c = base + tid;
        var s = SRC_NONE;
        var o = 0u;
        if (c < n_raw) {
            let pos = lo + c;
            if (pos >= step.pos0) {
                s = SRC_KV;
                o = (step.row0 + pos - step.pos0) * hd;
            } else {
                s = SRC_RING;
                o = (pos % w) * hd;
            }
        } else if (c < total) {
            var r = i32(c - n_raw);
            if (prm.has_sel != 0u) { r = sel[t * prm.top_k + (c - n_raw)]; }
            if (r >= 0 && u32(r) < n_vis) {
                s = SRC_COMP + u32(r) / prm.chunk_rows;
                o = (u32(r) % prm.chunk_rows) * hd;
            }
        }
        var l = NEG_BIG;
        if (s != SRC_NONE) {
            var d = 0.0;
            for (var j = 0u; j < hd; j++) { d += qs[j] * load(s, o + j); }
            l = d * prm.scale;
        }
        src[tid] = s;
        off[tid] = o;
        let m_new = max(m, wg_max(l));
        let e = select(0.0, exp(l - m_new), s != SRC_NONE);
        lg[tid] = e;
        let alpha = exp(m - m_new);
        den = den * alpha + wg_sum(e);
        m = m_new;
        let n_here = min(WG, total - base);
        for (var k = 0u; k < 4u; k++) {
            let j = tid + k * WG;
            if (j < hd) {
                var a = acc[k] * alpha;
                for (var r = 0u; r < n_here; r++) {
                    if (src[r] != SRC_NONE) { a += lg[r] * load(src[r], off[r] + j); }
                }
                acc[k] = a;
            }
        }
        workgroupBarrier();
    }
    let inv = 1.0 / den;
    for (var k = 0u; k < 4u; k++) {
        let j = tid + k * WG;
        if (j < hd) { out[qbase + j] = acc[k] * inv; }
    }
}
