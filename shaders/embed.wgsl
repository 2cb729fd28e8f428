// Embedding lookup from the table's GGUF bytes as stored (F32, F16, BF16),
// read as u32 words. A table larger than one binding is uploaded in chunks
// of whole rows; one dispatch per chunk writes the tokens whose row it holds.

struct EmbedParams {
    dim: u32,
    // 0 = F32, 1 = F16, 2 = BF16.
    ty: u32,
    // First table row held by this chunk, and how many.
    row0: u32,
    n_rows: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: EmbedParams;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> tokens: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn element(row: u32, j: u32) -> f32 {
    if (prm.ty == 0u) {
        return bitcast<f32>(table[row * prm.dim + j]);
    }
    let idx = row * prm.dim + j;
    let w = table[idx / 2u];
    let half = select(w & 0xffffu, w >> 16u, (idx & 1u) == 1u);
    if (prm.ty == 1u) {
        return f16_bits_to_f32(half);
    }
    return bitcast<f32>(half << 16u);
}

@compute @workgroup_size(WG)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= step.n_tokens * prm.dim) { return; }
    let t = i / prm.dim;
    let tok = u32(tokens[t]);
    if (tok < prm.row0 || tok >= prm.row0 + prm.n_rows) { return; }
    out[i] = element(tok - prm.row0, i % prm.dim);
}
