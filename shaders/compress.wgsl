// The KV compressor (MODEL.md 3.5.3): a sequential state machine over the
// step's tokens, so one workgroup runs it; threads split the columns. One
// dispatch takes the step's tokens t0..t1 (a block of at most
// COMPRESS_BLOCK_TOKENS, src/backend/wgpu/launch/compress.rs): the state carries
// over between dispatches, and no invocation loops over a whole long step
// (llvmpipe stops every loop of an invocation after 65,535 iterations in
// all; docs/VALIDATION.md, long contexts). Every `ratio` tokens the gated
// softmax pool of the window becomes one row: RMS norm, RoPE at the
// window's first position, then the rounding of its kind (FP8+f16 for
// attention rows, Hadamard+FP4+f16 for indexer rows), stored in `rows`.

struct CompressParams {
    ratio: u32,
    head_dim: u32,
    // head_dim, or 2*head_dim for overlapped compressors.
    width: u32,
    overlapped: u32,
    n_rot: u32,
    // 0 none, 1 FP8 + f16, 2 Hadamard + FP4 + f16.
    rounding: u32,
    eps: f32,
    // Rows per chunk binding of the output rows (rows0..rows7).
    chunk_rows: u32,
    // This dispatch's tokens: t0 .. min(t1, n_tokens).
    t0: u32,
    t1: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: CompressParams;
@group(0) @binding(2) var<storage, read> kv: array<f32>;
@group(0) @binding(3) var<storage, read> gate: array<f32>;
// ape (ratio x width), then the norm weight (head_dim), then the rope table.
@group(0) @binding(4) var<storage, read> consts: array<f32>;
@group(0) @binding(5) var<storage, read_write> st_kv: array<f32>;
@group(0) @binding(6) var<storage, read_write> st_score: array<f32>;
@group(0) @binding(7) var<storage, read_write> rows0: array<kvt>;
// Rows beyond one binding: chunks of chunk_rows whole rows (rows1..rows7
// and rows_store, src/backend/wgpu/shaders.rs).
//#chunks rows 8 read_write kvt
@group(0) @binding(15) var<storage, read> row_table: array<RowRecord>;

const EMPTY_SCORE: f32 = -1e30;

@compute @workgroup_size(WG)
fn compress(@builtin(local_invocation_index) tid: u32) {
    let m = prm.ratio;
    let c = prm.width;
    let hd = prm.head_dim;
    let cur = select(0u, m, prm.overlapped != 0u);
    let norm_at = m * c;
    let rope_at = norm_at + hd;
    let t_end = min(prm.t1, step.n_tokens);
    for (var tl = prm.t0; tl < t_end; tl++) {
        // This session's rows start at step.row0 in the step's activations.
        let t = step.row0 + tl;
        let p = row_table[t].pos;
        let i = p % m;
        let slot = cur + i;
        for (var j = tid; j < c; j += WG) {
            st_kv[slot * c + j] = kv[t * c + j];
            st_score[slot * c + j] = gate[t * c + j] + consts[i * c + j];
        }
        if ((p + 1u) % m != 0u) { continue; }
        storageBarrier();
        workgroupBarrier();
        let w = (p + 1u) / m - 1u;
        // Per-dim softmax over the candidate slots, then the weighted sum.
        for (var j = tid; j < hd; j += WG) {
            var mx = NEG_BIG;
            for (var s = 0u; s < m; s++) {
                mx = max(mx, st_score[s * c + j]);
                if (prm.overlapped != 0u) { mx = max(mx, st_score[(m + s) * c + hd + j]); }
            }
            var num = 0.0;
            var den = 0.0;
            for (var s = 0u; s < m; s++) {
                let e = exp(st_score[s * c + j] - mx);
                den += e;
                num += e * st_kv[s * c + j];
            }
            if (prm.overlapped != 0u) {
                for (var s = 0u; s < m; s++) {
                    let e = exp(st_score[(m + s) * c + hd + j] - mx);
                    den += e;
                    num += e * st_kv[(m + s) * c + hd + j];
                }
            }
            row[j] = select(0.0, num / den, den > 0.0);
        }
        workgroupBarrier();
        var ss = 0.0;
        for (var j = tid; j < hd; j += WG) { ss += row[j] * row[j]; }
        let total = wg_sum(ss, tid);
        let scale = 1.0 / sqrt(total / f32(hd) + prm.eps);
        for (var j = tid; j < hd; j += WG) { row[j] = row[j] * scale * consts[norm_at + j]; }
        workgroupBarrier();
        let tail = hd - prm.n_rot;
        for (var k = tid; k < prm.n_rot / 2u; k += WG) {
            let cs = cos_sin(k, w * m, rope_at);
            let x0 = row[tail + 2u * k];
            let x1 = row[tail + 2u * k + 1u];
            row[tail + 2u * k] = x0 * cs.x - x1 * cs.y;
            row[tail + 2u * k + 1u] = x0 * cs.y + x1 * cs.x;
        }
        workgroupBarrier();
        if (prm.rounding == 1u) {
            row_fp8(hd - prm.n_rot, tid);
            row_f16(hd, tid);
        } else if (prm.rounding == 2u) {
            row_hadamard(0u, hd, tid);
            row_fp4(hd, tid);
            row_f16(hd, tid);
        }
        let wc = w / prm.chunk_rows;
        let wo = (w % prm.chunk_rows) * hd;
        for (var j = tid; j < hd; j += WG) { rows_store(wc, wo + j, row[j]); }
        // The finished window becomes the previous one; its slots are reset.
        storageBarrier();
        workgroupBarrier();
        if (prm.overlapped != 0u) {
            for (var e = tid; e < m * c; e += WG) {
                st_kv[e] = st_kv[m * c + e];
                st_score[e] = st_score[m * c + e];
            }
        }
        storageBarrier();
        workgroupBarrier();
        for (var e = tid; e < m * c; e += WG) {
            st_kv[cur * c + e] = 0.0;
            st_score[cur * c + e] = EMPTY_SCORE;
        }
        storageBarrier();
        workgroupBarrier();
    }
}
