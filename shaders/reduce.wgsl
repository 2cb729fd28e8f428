// Workgroup-wide sum and max of one f32 per invocation, for kernels of WG
// (common.wgsl) invocations. Entry points take a `ReduceIds` argument and
// call `reduce_enter(ids)` first; every invocation of the workgroup must
// then call `wg_sum` / `wg_max` together (they contain barriers) and all
// get the result.
//
// Two implementations of one interface, chosen when the module is assembled
// (src/backend/wgpu/shaders.rs): subgroup operations on devices created with
// Features::SUBGROUP, a workgroup-memory tree elsewhere. The subgroup path
// never assumes a subgroup size or which invocations form a subgroup: each
// subgroup's `subgroupAdd` / `subgroupMax` lands in slot `subgroup_id`, and
// every invocation then folds the `num_subgroups` slots in index order (so
// the result does not depend on timing).

//#if subgroups
struct ReduceIds {
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
}

var<private> r_ids: ReduceIds;
// One slot per subgroup: WebGPU subgroups have at least 4 invocations (the
// host turns subgroups off on an adapter reporting fewer).
var<workgroup> r_part: array<f32, WG / 4u>;

fn reduce_enter(ids: ReduceIds) -> u32 {
    r_ids = ids;
    return ids.tid;
}

fn wg_sum(v: f32) -> f32 {
    let s = subgroupAdd(v);
    if (r_ids.lane == 0u) { r_part[r_ids.sg] = s; }
    workgroupBarrier();
    var t = r_part[0];
    for (var i = 1u; i < r_ids.n_sg; i++) { t += r_part[i]; }
    workgroupBarrier();
    return t;
}

fn wg_max(v: f32) -> f32 {
    let s = subgroupMax(v);
    if (r_ids.lane == 0u) { r_part[r_ids.sg] = s; }
    workgroupBarrier();
    var t = r_part[0];
    for (var i = 1u; i < r_ids.n_sg; i++) { t = max(t, r_part[i]); }
    workgroupBarrier();
    return t;
}
//#else
struct ReduceIds {
    @builtin(local_invocation_index) tid: u32,
}

var<private> r_tid: u32;
var<workgroup> r_red: array<f32, WG>;

fn reduce_enter(ids: ReduceIds) -> u32 {
    r_tid = ids.tid;
    return ids.tid;
}

fn wg_sum(v: f32) -> f32 {
    r_red[r_tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (r_tid < s) { r_red[r_tid] += r_red[r_tid + s]; }
        workgroupBarrier();
    }
    let r = r_red[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32) -> f32 {
    r_red[r_tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (r_tid < s) { r_red[r_tid] = max(r_red[r_tid], r_red[r_tid + s]); }
        workgroupBarrier();
    }
    let r = r_red[0];
    workgroupBarrier();
    return r;
}
//#endif
