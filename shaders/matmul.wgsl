// Matrix × activations with the weights decoded in the shader from the GGUF
// bytes (quant.wgsl). Each row group of a workgroup computes one weight row against a tile of
// up to TILE_TOKENS activation rows: every weight unit is decoded once per
// tile and reused for each token of the tile (decode: a tile of one token,
// i.e. a matrix-vector product; prefill: full tiles). A workgroup of 64
// invocations takes ROWS rows. Fallback: LANES invocations per row, their
// partial sums reduced in workgroup memory. Subgroup variant (devices with
// Features::SUBGROUP): one subgroup per row at a time, reduced with
// subgroupAdd. Neither assumes a subgroup size.
//
// Weights larger than one storage binding are split into chunks of whole rows
// (whole expert slabs for 3-D tensors); the host records one dispatch per
// chunk, with `row0` / `expert0` saying where the chunk starts.

// Mirrors `MatmulParams` in src/backend/wgpu/matmul.rs (#[repr(C)], 64 bytes).
struct MatmulParams {
    n_in: u32,           // elements per weight row
    n_rows: u32,         // rows of the chunk (dense) or of one expert (experts)
    row0: u32,           // dense: global index of the chunk's first row
    row_bytes: u32,      // bytes per weight row
    rows_per_group: u32, // dense: output rows per activation group
    x_stride: u32,       // floats between consecutive activation rows
    out_stride: u32,     // floats between consecutive output rows
    grid_x: u32,         // workgroups along x; rows fold into x and y
    expert0: u32,        // experts: first expert of the chunk
    n_experts: u32,      // experts: experts in the chunk
    k: u32,              // experts: slots per token
    mode: u32,           // experts: MODE_* below
    clamp: f32,          // experts: SwiGLU clamp
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// The step's uniform: the first 16 bytes of the backend's per-step uniform
// (position of the first token, live tokens of this step).
struct MmStep {
    pos0: u32,
    n_tokens: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> P: MatmulParams;
@group(0) @binding(1) var<uniform> STEP: MmStep;
@group(0) @binding(2) var<storage, read> W: array<u32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(5) var<storage, read> IQ2_GRID: array<u32>;
@group(0) @binding(6) var<storage, read> SEL: array<i32>;
@group(0) @binding(7) var<storage, read> RW: array<f32>;

// GGUF type id of W; set per pipeline.
override WTYPE: u32 = 0u;

const WG: u32 = 64u;
// Weight rows per workgroup (1, 2, 4, ..., 64), a pipeline constant so a
// backend can pick it per device; LANES invocations share one row.
override ROWS: u32 = 4u;
override LANES: u32 = WG / ROWS;
const TILE_TOKENS: u32 = 8u;

var<workgroup> red: array<f32, 512>; // TILE_TOKENS × WG partial sums

// Accumulates this invocation's share of the dot of the weight row at byte
// `rb` with `nt` activation rows (row t starts at X[xbase + t·xstep]): the
// row's `nlanes` invocations take every nlanes-th 32-element unit starting
// at `lane`; the partial sum for token t ends in red[t·WG + lid] (each
// invocation owns its slots, so no barrier is needed here). `live` false
// contributes zeros.
fn accumulate(lid: u32, lane: u32, nlanes: u32, live: bool, rb: u32, nt: u32,
              xbase: u32, xstep: u32) {
    // The per-token sums live in workgroup memory, not in a private array:
    // dynamically indexed private arrays are very slow on some drivers
    // (lavapipe spills them to memory with a check per access).
    for (var t = 0u; t < TILE_TOKENS; t++) {
        red[t * WG + lid] = 0.0;
    }
    if (live) {
        let n_units = (P.n_in + 31u) / 32u;
        var w: array<f32, 32>;
        for (var u = lane; u < n_units; u += nlanes) {
            decode32(rb, u, &w);
            let e0 = 32u * u;
            let cnt = min(32u, P.n_in - e0);
            for (var t = 0u; t < nt; t++) {
                let xb = xbase + t * xstep + e0;
                var s = 0.0;
                if (cnt == 32u) {
                    // Fixed trip count: unrolled, `w` stays in registers.
                    for (var i = 0u; i < 32u; i++) {
                        s += w[i] * X[xb + i];
                    }
                } else {
                    for (var i = 0u; i < cnt; i++) {
                        s += w[i] * X[xb + i];
                    }
                }
                red[t * WG + lid] += s;
            }
        }
    }
}

//#if subgroups
// Subgroup path: each weight row belongs to one whole subgroup, whatever its
// size (4 … 128; it may even differ between pipelines): subgroup `sg` of the
// workgroup takes rows sg, sg + n_sg, … of the workgroup's ROWS rows, its
// invocations stride over the row's units and `subgroupAdd` finishes each
// dot. No workgroup barrier, no assumption about which local invocations
// form a subgroup.
struct Ids {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
}
//#else
// Dots the weight row at byte `rb` with `nt` activation rows. The LANES
// invocations of row group lid / LANES share the row; the sum for token t
// ends in red[t·WG + (lid / LANES)·LANES]. Every invocation of the workgroup
// must call this (it contains barriers).
fn row_dots(lid: u32, live: bool, rb: u32, nt: u32, xbase: u32, xstep: u32) {
    let lane = lid % LANES;
    accumulate(lid, lane, LANES, live, rb, nt, xbase, xstep);
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var t = 0u; t < nt; t++) {
                red[t * WG + lid] += red[t * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
}
//#endif

// out[t][row0 + r] = Σ_i W[r][i] · x[t][g·n_in + i], g = (row0 + r) / rows_per_group.
// Grid: x·y = ceil(rows of the chunk / ROWS), z = token tiles.
//#if subgroups
@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, ids: Ids) {
    let t0 = wid.z * TILE_TOKENS;
    let n_tokens = STEP.n_tokens;
    var nt = 0u;
    if (t0 < n_tokens) {
        nt = min(TILE_TOKENS, n_tokens - t0);
    }
    for (var j = ids.sg; j < ROWS; j += ids.n_sg) {
        let r = (wid.x + wid.y * P.grid_x) * ROWS + j;
        let live = r < P.n_rows && nt > 0u;
        let grow = P.row0 + r;
        let g = grow / max(P.rows_per_group, 1u);
        accumulate(ids.lid, ids.lane, ids.sg_size, live, select(0u, r * P.row_bytes, live), nt,
                   t0 * P.x_stride + g * P.n_in, P.x_stride);
        for (var t = 0u; t < nt; t++) {
            let s = subgroupAdd(red[t * WG + ids.lid]);
            if (live && ids.lane == 0u) {
                OUT[(t0 + t) * P.out_stride + grow] = s;
            }
        }
    }
}
//#else
@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>,
          @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let r = (wid.x + wid.y * P.grid_x) * ROWS + lid / LANES;
    let t0 = wid.z * TILE_TOKENS;
    let n_tokens = STEP.n_tokens;
    let live = r < P.n_rows && t0 < n_tokens;
    var nt = 0u;
    if (t0 < n_tokens) {
        nt = min(TILE_TOKENS, n_tokens - t0);
    }
    let grow = P.row0 + r;
    let g = grow / max(P.rows_per_group, 1u);
    row_dots(lid, live, select(0u, r * P.row_bytes, live), nt,
             t0 * P.x_stride + g * P.n_in, P.x_stride);
    if (live) {
        for (var t = lane; t < nt; t += LANES) {
            OUT[(t0 + t) * P.out_stride + grow] = red[t * WG + lid - lane];
        }
    }
}
//#endif
