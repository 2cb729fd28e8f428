// The output head's input in a step of several sessions: the last row of
// each session's piece gathered into that session's row (twin of
// `GatherLast::compute` in src/graph/ops/gather.rs). One thread per output
// value; a state with no row in the step gets zeros.

struct GatherParams {
    cols: u32,
    states: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepUniform;
@group(0) @binding(1) var<uniform> prm: GatherParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> row_table: array<RowRecord>;

@compute @workgroup_size(WG)
fn gather_last(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i >= prm.states * prm.cols) { return; }
    let s = i / prm.cols;
    let j = i % prm.cols;
    // The step's rows of one state are one block; its last row is the
    // last row whose state is `s`.
    var v = 0.0;
    for (var t = 0u; t < step.n_tokens; t = t + 1u) {
        if (row_table[t].state == s) {
            v = x[t * prm.cols + j];
        }
    }
    out[i] = v;
}
