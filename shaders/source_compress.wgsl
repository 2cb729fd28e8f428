// DeepSeek V4.1's compressor of a kv-source layer (twin:
// ops::source_compress::SourceCompress): a sequential state machine over the step's
// tokens, so one workgroup runs it and threads split the columns. Ratio 1
// takes each token's projection as its latent; ratio r > 1 keeps the
// partial group in the frontier (slot = position mod r) and pools each
// whole group with a per-channel softmax of its gate scores. The latent is
// RMS-normed; the index key is rope(k_norm(wk . latent)); both are roped at
// the group's first position (under model numerics then rounded through
// FP4) and stored at row position / r. One dispatch
// takes the tokens t0..t1 (a block sized by the recorder so that no
// invocation loops more than llvmpipe allows; see shaders/compress.wgsl).
// Both row states grow with the context, so each is bound as up to eight
// chunks of whole rows (docs/ARCHITECTURE.md, "Chunked state bindings"):
// the row's chunk is picked once per row; the arithmetic is the same as
// with one binding, so chunked and whole results are bit-identical.

struct SourceCompressParams {
    ratio: u32,
    head_dim: u32,
    index_head_dim: u32,
    n_rot: u32,
    eps: f32,
    // Rows of the `rows` and `index_rows` states.
    capacity: u32,
    t0: u32,
    t1: u32,
    // Rows per chunk binding of `rows` (rows0..7) and `index_rows`
    // (irows0..7).
    chunk_rows: u32,
    index_chunk_rows: u32,
    // Model numerics: both rows through FP4 after their RoPE.
    round_rows: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: SourceCompressParams;
@group(0) @binding(2) var<storage, read> kv: array<f32>;
@group(0) @binding(3) var<storage, read> gate: array<f32>;
// norm (head_dim), index norm (index_head_dim), wk (index_head_dim rows of
// head_dim), then the rope table (shaders/rope.wgsl's hi/mid/lo turns).
@group(0) @binding(4) var<storage, read> consts: array<f32>;
@group(0) @binding(5) var<storage, read_write> st_kv: array<f32>;
@group(0) @binding(6) var<storage, read_write> st_score: array<f32>;
@group(0) @binding(7) var<storage, read_write> rows0: array<f32>;
@group(0) @binding(8) var<storage, read_write> irows0: array<f32>;
// Rows beyond one binding: chunks of chunk_rows (index_chunk_rows) rows
// (rows1..7, irows1..7, rows_store and irows_store,
// src/backend/wgpu/shaders.rs).
//#chunks rows 9 read_write f32
//#chunks irows 16 read_write f32
@group(0) @binding(23) var<storage, read> row_table: array<RowRecord>;

var<workgroup> ikey: array<f32, MAXROW>;

@compute @workgroup_size(WG)
fn source_compress(@builtin(local_invocation_index) tid: u32) {
    let r = prm.ratio;
    let hd = prm.head_dim;
    let ihd = prm.index_head_dim;
    let inorm_at = hd;
    let wk_at = hd + ihd;
    let rope_at = wk_at + ihd * hd;
    let t_end = min(prm.t1, step.n_tokens);
    for (var t = prm.t0; t < t_end; t++) {
        let p = row_table[t].pos;
        if (r > 1u) {
            let slot = p % r;
            for (var j = tid; j < hd; j += WG) {
                st_kv[slot * hd + j] = kv[t * hd + j];
                st_score[slot * hd + j] = gate[t * hd + j];
            }
            if ((p + 1u) % r != 0u) { continue; }
            storageBarrier();
            workgroupBarrier();
            for (var j = tid; j < hd; j += WG) {
                var mx = -3.4028235e38;
                for (var s = 0u; s < r; s++) { mx = max(mx, st_score[s * hd + j]); }
                var num = 0.0;
                var den = 0.0;
                for (var s = 0u; s < r; s++) {
                    let e = exp(st_score[s * hd + j] - mx);
                    den += e;
                    num += e * st_kv[s * hd + j];
                }
                row[j] = num / den;
            }
        } else {
            for (var j = tid; j < hd; j += WG) { row[j] = kv[t * hd + j]; }
        }
        workgroupBarrier();
        let w = p / max(r, 1u);
        if (w >= prm.capacity) { continue; }
        var ss = 0.0;
        for (var j = tid; j < hd; j += WG) { ss += row[j] * row[j]; }
        let scale = 1.0 / sqrt(wg_sum(ss, tid) / f32(hd) + prm.eps);
        for (var j = tid; j < hd; j += WG) { row[j] = row[j] * scale * consts[j]; }
        workgroupBarrier();
        for (var i = tid; i < ihd; i += WG) {
            var acc = 0.0;
            for (var j = 0u; j < hd; j++) { acc += consts[wk_at + i * hd + j] * row[j]; }
            ikey[i] = acc;
        }
        workgroupBarrier();
        var ks = 0.0;
        for (var i = tid; i < ihd; i += WG) { ks += ikey[i] * ikey[i]; }
        let kscale = 1.0 / sqrt(wg_sum(ks, tid) / f32(ihd) + prm.eps);
        for (var i = tid; i < ihd; i += WG) { ikey[i] = ikey[i] * kscale * consts[inorm_at + i]; }
        workgroupBarrier();
        // RoPE of both rows' tail pairs at the group's first position.
        let at = w * max(r, 1u);
        let ktail = ihd - prm.n_rot;
        let tail = hd - prm.n_rot;
        for (var k = tid; k < prm.n_rot / 2u; k += WG) {
            let cs = cos_sin(k, at, rope_at);
            let a0 = ikey[ktail + 2u * k];
            let a1 = ikey[ktail + 2u * k + 1u];
            ikey[ktail + 2u * k] = a0 * cs.x - a1 * cs.y;
            ikey[ktail + 2u * k + 1u] = a0 * cs.y + a1 * cs.x;
            let x0 = row[tail + 2u * k];
            let x1 = row[tail + 2u * k + 1u];
            row[tail + 2u * k] = x0 * cs.x - x1 * cs.y;
            row[tail + 2u * k + 1u] = x0 * cs.y + x1 * cs.x;
        }
        workgroupBarrier();
        if (prm.round_rows != 0u) {
            // The official fp4_act_quant (twins in quant::small_float): the
            // index key in blocks of 32 with UE8M0 scales, the latent in
            // blocks of 16 with E4M3 scales; one thread per block.
            for (var b = tid * 32u; b < ihd; b += WG * 32u) {
                let end = min(b + 32u, ihd);
                var amax = 0.0;
                for (var i = b; i < end; i++) { amax = max(amax, abs(ikey[i])); }
                let scale = pow2_scale(max(amax, 7.052966104933725e-38), 6.0);
                for (var i = b; i < end; i++) {
                    let v = clamp(ikey[i] / scale, -6.0, 6.0);
                    ikey[i] = with_sign(round_e2m1_mag(abs(v)), v) * scale;
                }
            }
            for (var b = tid * 16u; b < hd; b += WG * 16u) {
                let end = min(b + 16u, hd);
                var amax = 0.0;
                for (var j = b; j < end; j++) { amax = max(amax, abs(row[j])); }
                let scale = round_e4m3_mag(min(max(amax, 0.01171875) / 6.0, 448.0));
                for (var j = b; j < end; j++) {
                    let v = clamp(row[j] / scale, -6.0, 6.0);
                    row[j] = with_sign(round_e2m1_mag(abs(v)), v) * scale;
                }
            }
            workgroupBarrier();
        }
        let ic = w / prm.index_chunk_rows;
        let io = (w % prm.index_chunk_rows) * ihd;
        for (var i = tid; i < ihd; i += WG) { irows_store(ic, io + i, ikey[i]); }
        let wc = w / prm.chunk_rows;
        let wo = (w % prm.chunk_rows) * hd;
        for (var j = tid; j < hd; j += WG) { rows_store(wc, wo + j, row[j]); }
        storageBarrier();
        workgroupBarrier();
    }
}
