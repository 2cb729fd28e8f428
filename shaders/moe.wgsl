// Routed experts (ops::moe::MoeExperts) on the GPU, appended to quant.wgsl and
// matmul.wgsl. The selected expert of every (token, slot) is read from SEL on
// the GPU; nothing goes back to the host. Per weight chunk (a range of whole
// expert slabs) the host records:
//   expert_rows MODE_GATE: H[s][f] = gate_e[f] · x[s / k]
//   expert_rows MODE_UP:   H[s][f] = RW[s] · swiglu(H[s][f], up_e[f] · x[s / k])
//   (V4.1 model numerics, once after the last up chunk:
//    expert_mid_round: H[s] through FP8 in blocks of 32, in place)
//   expert_rows MODE_DOWN: C[s][o] = down_e[o] · H[s]
// and once: expert_sum: out[t][o] = Σ_slot C[t·k + slot][o], in slot order like
// the CPU twin. A workgroup whose slot selects an expert outside the bound
// chunk does nothing (its sibling dispatch on the right chunk does the work).

const MODE_GATE: u32 = 1u;
const MODE_UP: u32 = 2u;
const MODE_DOWN: u32 = 3u;

fn silu(x: f32) -> f32 {
    return x * (1.0 / (1.0 + exp(-x)));
}

// ops::moe::swiglu: silu(min(g, c)) · clamp(u, −c, c); no clamp when c ≤ 1e-6.
fn swiglu(g: f32, u: f32, c: f32) -> f32 {
    if (c > 1e-6) {
        return silu(min(g, c)) * clamp(u, -c, c);
    }
    return silu(g) * u;
}

// Row f of the expert that slot s selects: whether the bound chunk holds it
// (`live`), its first byte in W (0 when not live) and the row of X it
// multiplies (the slot's token; the slot itself for MODE_DOWN).
struct ExpertRow {
    live: bool,
    rb: u32,
    xrow: u32,
}

fn expert_row(s: u32, f: u32) -> ExpertRow {
    var live = false;
    var e = 0u;
    if (f < P.n_rows && s < STEP.n_tokens * P.k) {
        let ei = SEL[s];
        e = u32(ei);
        live = ei >= 0 && e >= P.expert0 && e < P.expert0 + P.n_experts;
    }
    let rb = ((e - P.expert0) * P.n_rows + f) * P.row_bytes;
    var xrow = s / max(P.k, 1u);
    if (P.mode == MODE_DOWN) {
        xrow = s;
    }
    return ExpertRow(live, select(0u, rb, live), xrow);
}

// Stores row f of slot s from its dot product: H[s][f] itself (MODE_GATE,
// MODE_DOWN), or RW[s] · swiglu(gate already in H[s][f], dot) (MODE_UP).
fn write_expert_row(s: u32, f: u32, dot: f32) {
    let o = s * P.out_stride + f;
    if (P.mode == MODE_UP) {
        OUT[o] = RW[s] * swiglu(OUT[o], dot, P.clamp);
    } else {
        OUT[o] = dot;
    }
}

// Grid: x·y = ceil(rows of one expert / ROWS), z = slots (n_tokens · k).
//#if subgroups
@compute @workgroup_size(64)
fn expert_rows(@builtin(workgroup_id) wid: vec3<u32>, ids: Ids) {
    let s = wid.z;
    for (var j = ids.sg; j < ROWS; j += ids.n_sg) {
        let f = (wid.x + wid.y * P.grid_x) * ROWS + j;
        let er = expert_row(s, f);
        accumulate(ids.lid, ids.lane, ids.sg_size, er.live, er.rb, 1u,
                   er.xrow * P.x_stride, P.x_stride);
        let dot = subgroupAdd(red[ids.lid]);
        if (er.live && ids.lane == 0u) {
            write_expert_row(s, f, dot);
        }
    }
}
//#else
@compute @workgroup_size(64)
fn expert_rows(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let f = (wid.x + wid.y * P.grid_x) * ROWS + lid / LANES;
    let s = wid.z;
    let er = expert_row(s, f);
    row_dots(lid, er.live, er.rb, 1u, er.xrow * P.x_stride, P.x_stride);
    if (er.live && lid % LANES == 0u) {
        write_expert_row(s, f, red[lid]);
    }
}
//#endif

// out[t][o] = Σ_slot X[(t·k + slot)·n_rows + o]. Grid: x·y = ceil(n_rows / 64), z = tokens.
@compute @workgroup_size(64)
fn expert_sum(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_id) lid3: vec3<u32>) {
    let o = (wid.x + wid.y * P.grid_x) * WG + lid3.x;
    let t = wid.z;
    if (o >= P.n_rows || t >= STEP.n_tokens) {
        return;
    }
    var acc = 0.0;
    for (var i = 0u; i < P.k; i++) {
        acc += X[(t * P.k + i) * P.n_rows + o];
    }
    OUT[t * P.out_stride + o] = acc;
}

// The FP8 (E4M3, UE8M0 block scale) round trip of w2's input, in place in
// OUT (= H), blocks of 32 along each slot's row (twin: the mid_fp8 step of
// ops::moe::MoeExperts). The arithmetic of common.wgsl's pow2_scale and
// round_e4m3_mag, which this family does not include (its WG and silu
// would clash). A streamed pass reruns it every round over every slot: the
// round trip is idempotent. Grid: x·y = ceil(ceil(n_rows / 32) / 64),
// z = slots.
fn mid_pow2(k: i32) -> f32 {
    return bitcast<f32>(u32(k + 127) << 23u);
}

fn mid_e4m3_mag(a: f32) -> f32 {
    let e = max(i32((bitcast<u32>(a) >> 23u) & 0xffu) - 127, -6);
    return round(a * mid_pow2(3 - e)) * mid_pow2(e - 3);
}

@compute @workgroup_size(64)
fn expert_mid_round(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(local_invocation_id) lid3: vec3<u32>) {
    let b = ((wid.x + wid.y * P.grid_x) * 64u + lid3.x) * 32u;
    let s = wid.z;
    if (b >= P.n_rows || s >= STEP.n_tokens * P.k) {
        return;
    }
    let base = s * P.n_rows;
    let end = min(b + 32u, P.n_rows);
    var amax = 0.0;
    for (var j = b; j < end; j++) { amax = max(amax, abs(OUT[base + j])); }
    let scale = exp2(ceil(log2(max(amax, 1e-4) / 448.0)));
    for (var j = b; j < end; j++) {
        let v = clamp(OUT[base + j] / scale, -448.0, 448.0);
        let m = mid_e4m3_mag(abs(v));
        OUT[base + j] = select(m, -m, v < 0.0) * scale;
    }
}
