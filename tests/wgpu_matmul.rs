//! The wgpu matrix-product kernels against their CPU twins
//! (`ops::matmul::matmul_rows`, `ops::moe::MoeExperts::cpu`): fresh seeded
//! inputs, weights made by the real quantizers (src/quant), outputs poisoned
//! with NaN before each run, sizes including 1, odd token counts, row counts
//! that are not multiples of anything, grouped projections, multi-chunk
//! weights (a small chunk limit forced through `upload_chunked`) and the real
//! Flash shapes where they fit.
//!
//! Runs on whatever adapter wgpu finds (lavapipe in CI). With `CI` set and no
//! adapter the tests fail instead of skipping.
//!
//! Tolerances. The GPU decodes exactly the same weight values as the CPU (the
//! same f32 operations on the same bits); what differs is the order of the
//! f32 additions (64-way tree reduction vs the CPU's 8 lanes). The bound for
//! one output is `TOL[type] · Σ_i |w_i · x_i|`, the sum of absolute terms
//! being the scale every reordering error is proportional to. The routed
//! experts add the GPU's `exp` (SwiGLU), bounded against the largest output.

mod common;
use common::rng::Normal as Rng;

use std::sync::OnceLock;

use ds4::backend::wgpu::matmul::{read_back, BufRange, DenseShape, MatmulKernels};
use ds4::backend::wgpu::weights::GpuTensor;
use ds4::backend::wgpu::{AdapterChoice, Gpu, StepUniform};
use ds4::backend::BackendOptions;
use ds4::gguf::TensorRef;
use ds4::gguf::{GgufFile, GgufWriter};
use ds4::graph::ops::matmul::matmul_rows;
use ds4::graph::ops::moe::ExpertDims;
use ds4::graph::ops::moe::MoeExperts;
use ds4::quant::{self, GgmlType};
use wgpu::util::DeviceExt;

/// Per-type tolerance, relative to Σ|w·x| of each output (see the header).
const TOL: &[(GgmlType, f64)] = &[
    (GgmlType::F32, 2e-6),
    (GgmlType::F16, 2e-6),
    (GgmlType::Bf16, 2e-6),
    (GgmlType::Q8_0, 2e-6),
    (GgmlType::Q2K, 2e-6),
    (GgmlType::Q4K, 2e-6),
    (GgmlType::Iq2Xxs, 2e-6),
    (GgmlType::Mxfp4, 2e-6),
];
/// Routed experts: max |Δ| ≤ this · max |reference output|.
const TOL_EXPERTS: f64 = 1e-5;

fn tol(ty: GgmlType) -> f64 {
    TOL.iter()
        .find(|t| t.0 == ty)
        .map(|t| t.1)
        .expect("type in TOL")
}

struct Ctx {
    gpu: Gpu,
    kernels: MatmulKernels,
}

/// One device and kernel set for the whole binary; `None` (skip) only when
/// no adapter exists outside CI.
fn ctx() -> Option<&'static Ctx> {
    static CTX: OnceLock<Option<Ctx>> = OnceLock::new();
    CTX.get_or_init(|| {
        let gpu = match Gpu::open(&BackendOptions::from_env(), true) {
            Ok(g) => g,
            Err(e) => {
                if std::env::var_os("CI").is_some() {
                    panic!("CI is set and no wgpu adapter opened: {e}");
                }
                eprintln!("skipping wgpu tests: {e}");
                return None;
            }
        };
        let kernels = MatmulKernels::new(&gpu).expect("matmul kernels build");
        Some(Ctx { gpu, kernels })
    })
    .as_ref()
}

/// The devices whose kernel variants the tests compare: the default one and
/// the same adapter opened with subgroups toggled (on lavapipe the default
/// is the fallback, so the other is the subgroup variant), when the adapter
/// has them.
fn devices(c: &'static Ctx) -> Vec<&'static Gpu> {
    use ds4::backend::wgpu::gpu::OPTIONAL_FEATURES;
    static OTHER: OnceLock<Option<Gpu>> = OnceLock::new();
    let other = OTHER.get_or_init(|| {
        let allow = if c.gpu.shader_variant().subgroups {
            OPTIONAL_FEATURES - wgpu::Features::SUBGROUP
        } else {
            OPTIONAL_FEATURES
        };
        let g = Gpu::open_with(
            &AdapterChoice::new(&BackendOptions::from_env(), true),
            allow,
        )
        .expect("the same adapter opens again");
        (g.shader_variant() != c.gpu.shader_variant()).then_some(g)
    });
    std::iter::once(&c.gpu).chain(other.as_ref()).collect()
}

fn randn(rng: &mut Rng, n: usize, scale: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.normal() * scale) as f32).collect()
}

/// `rows` rows of `n_in` values quantised to `ty` by the real quantizer.
/// Large tensors repeat a pool of 61 distinct quantised rows in a scrambled
/// order (the IQ2_XXS quantizer needs seconds per million values); a kernel
/// reading a wrong row still reads different values.
fn quantised(rng: &mut Rng, ty: GgmlType, n_in: usize, rows: usize) -> Vec<u8> {
    const POOL: usize = 61;
    let rb = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
    let distinct = rows.min(POOL);
    let mut pool = vec![0u8; rb * distinct];
    for r in 0..distinct {
        let v = randn(rng, n_in, 1.0);
        quant::quantize_row(ty, &v, &mut pool[r * rb..(r + 1) * rb], None).expect("quantise");
    }
    let mut out = vec![0u8; rb * rows];
    for r in 0..rows {
        let p = if rows <= POOL {
            r
        } else {
            (r * 37 + r / POOL) % POOL
        };
        out[r * rb..(r + 1) * rb].copy_from_slice(&pool[p * rb..(p + 1) * rb]);
    }
    out
}

fn storage(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("test input"),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        })
}

fn step(gpu: &Gpu, n_tokens: u32) -> wgpu::Buffer {
    let s = StepUniform {
        pos0: 0,
        n_tokens,
        ..Default::default()
    };
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("test step"),
            contents: bytemuck::bytes_of(&s),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}

fn read_f32(gpu: &Gpu, b: &wgpu::Buffer) -> Vec<f32> {
    let bytes = read_back(gpu, &BufRange::whole(b)).expect("read back");
    bytemuck::pod_collect_to_vec(&bytes)
}

fn run_pass(gpu: &Gpu, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        f(&mut pass);
    }
    gpu.queue.submit(Some(enc.finish()));
    gpu.wait().expect("no device error");
}

/// The upload limit for chunks of `units` (rows or experts) of
/// `unit_bytes` each, or the device's binding limit.
fn chunk_limit(gpu: &Gpu, unit_bytes: usize, units: Option<usize>) -> u64 {
    units.map_or(gpu.max_binding(), |u| (u * unit_bytes + 8) as u64)
}

/// `t`, `n` units uploaded in chunks of `per_chunk`, has as many chunks as
/// that takes.
fn assert_chunks(t: &GpuTensor, n: usize, per_chunk: Option<usize>, what: &str) {
    if let Some(u) = per_chunk {
        assert_eq!(t.chunks.len(), n.div_ceil(u), "{what}");
    }
}

/// A product's buffers: the input `x`, an output of `out_len` values
/// poisoned with NaN (what the kernel does not write stays NaN), and the
/// step uniform of `n_tokens`.
fn io_buffers(gpu: &Gpu, x: &[f32], out_len: usize, n_tokens: usize) -> [wgpu::Buffer; 3] {
    [
        storage(gpu, x),
        storage(gpu, &vec![f32::NAN; out_len]),
        step(gpu, n_tokens as u32),
    ]
}

/// Runs the pass `f` encodes and reads `out` back, with the seconds that
/// took.
fn run_and_read(
    gpu: &Gpu,
    out: &wgpu::Buffer,
    f: impl FnOnce(&mut wgpu::ComputePass<'_>),
) -> (Vec<f32>, f64) {
    let t1 = std::time::Instant::now();
    run_pass(gpu, f);
    let got = read_f32(gpu, out);
    (got, t1.elapsed().as_secs_f64())
}

struct Dense {
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
    groups: usize,
    n_tokens: usize,
    /// Chunk limit in rows (None: the device's binding limit).
    chunk_rows: Option<usize>,
}

impl Dense {
    /// An ungrouped product in one chunk.
    fn new(ty: GgmlType, n_in: usize, n_out: usize, n_tokens: usize) -> Self {
        Dense {
            ty,
            n_in,
            n_out,
            groups: 1,
            n_tokens,
            chunk_rows: None,
        }
    }
}

/// Runs one dense case and checks every output against matmul_rows.
fn dense_case(c: &Ctx, case: &Dense, seed: u64) {
    dense_case_with(&c.gpu, &c.kernels, case, seed)
}

fn dense_case_with(gpu: &Gpu, kernels: &MatmulKernels, case: &Dense, seed: u64) {
    let name = format!(
        "{} {}x{} g{} t{} chunk{:?}",
        case.ty, case.n_in, case.n_out, case.groups, case.n_tokens, case.chunk_rows
    );
    let mut rng = Rng::for_name(seed, &name);
    let t0 = std::time::Instant::now();
    let w = quantised(&mut rng, case.ty, case.n_in, case.n_out);
    let t_quant = t0.elapsed().as_secs_f64();
    let x_stride = case.groups * case.n_in;
    // Capacity one token more than used: the spare output row must stay NaN.
    let max_tokens = case.n_tokens + 1;
    let x = randn(&mut rng, max_tokens * x_stride, 1.0);
    let rb = w.len() / case.n_out;
    let limit = chunk_limit(gpu, rb, case.chunk_rows);
    let ne = [case.n_in as u64, case.n_out as u64, 1, 1];
    let t =
        GpuTensor::upload_chunked(gpu, &name, case.ty, ne, &w, limit, &mut |_| {}).expect("upload");
    assert_chunks(
        &t,
        case.n_out,
        case.chunk_rows,
        &format!("{name}: chunk count"),
    );
    let [xb, out, sb] = io_buffers(gpu, &x, max_tokens * case.n_out, case.n_tokens);
    let mm = kernels
        .dense(
            gpu,
            &t,
            DenseShape {
                n_in: case.n_in,
                n_out: case.n_out,
                groups: case.groups,
            },
            BufRange::whole(&xb),
            BufRange::whole(&out),
            &sb,
            max_tokens,
        )
        .expect("dense matmul");
    let (got, t_gpu) = run_and_read(gpu, &out, |p| mm.encode(p, case.n_tokens as u32));

    let mut want = vec![0f32; case.n_tokens * case.n_out];
    matmul_rows(
        case.ty,
        &w,
        case.n_in,
        case.n_out,
        case.groups,
        &x[..case.n_tokens * x_stride],
        case.n_tokens,
        &mut want,
    );
    // Σ|w·x| per output, from the dequantised rows.
    let mut wf = vec![0f32; case.n_in * case.n_out];
    for o in 0..case.n_out {
        quant::dequantize_row(
            case.ty,
            &w[o * rb..(o + 1) * rb],
            &mut wf[o * case.n_in..][..case.n_in],
        )
        .expect("dequantise");
    }
    let rows_per_group = case.n_out / case.groups;
    let mut worst = 0f64;
    for t in 0..case.n_tokens {
        for o in 0..case.n_out {
            let g = o / rows_per_group;
            let xs = &x[t * x_stride + g * case.n_in..][..case.n_in];
            let scale: f64 = wf[o * case.n_in..][..case.n_in]
                .iter()
                .zip(xs)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let (g_, w_) = (got[t * case.n_out + o], want[t * case.n_out + o]);
            assert!(g_.is_finite(), "{name}: out[{t}][{o}] not written ({g_})");
            let err = (g_ as f64 - w_ as f64).abs();
            let bound = tol(case.ty) * scale + 1e-30;
            worst = worst.max(err / bound.max(1e-30));
            assert!(
                err <= bound,
                "{name}: out[{t}][{o}] gpu {g_} cpu {w_} |Δ| {err:e} > {bound:e}"
            );
        }
    }
    for o in 0..case.n_out {
        let v = got[case.n_tokens * case.n_out + o];
        assert!(v.is_nan(), "{name}: token past n_tokens was written ({v})");
    }
    eprintln!("{name}: worst |Δ| / bound = {worst:.3} (quantise {t_quant:.2}s, gpu {t_gpu:.2}s, total {:.2}s)", t0.elapsed().as_secs_f64());
}

const ALL: [GgmlType; 8] = common::COMPUTE_TYPES;

fn min_in(ty: GgmlType) -> usize {
    ty.block_elems().max(1)
}

#[test]
fn dense_every_type_small_and_odd_sizes() {
    let Some(c) = ctx() else { return };
    for ty in ALL {
        let b = min_in(ty);
        // Float rows also take lengths that are not multiples of 32.
        let ins: Vec<usize> = if b == 1 {
            vec![1, 45, 96, 131]
        } else {
            vec![b, 2 * b]
        };
        for (i, &n_in) in ins.iter().enumerate() {
            for &(n_out, n_tokens) in &[(1usize, 1usize), (7, 3), (67, 1), (130, 9)] {
                dense_case(c, &Dense::new(ty, n_in, n_out, n_tokens), 11 + i as u64);
            }
        }
    }
}

#[test]
fn dense_prefill_tiles_and_groups() {
    let Some(c) = ctx() else { return };
    for ty in ALL {
        let n_in = min_in(ty).max(64);
        // Token counts around the tile of 8; grouped output projection.
        for &(n_out, groups, n_tokens) in &[
            (24usize, 1usize, 8usize),
            (24, 2, 17),
            (36, 4, 5),
            (16, 8, 1),
        ] {
            dense_case(
                c,
                &Dense {
                    groups,
                    ..Dense::new(ty, n_in, n_out, n_tokens)
                },
                23,
            );
        }
    }
}

#[test]
fn dense_multi_chunk_weights() {
    let Some(c) = ctx() else { return };
    for ty in ALL {
        let n_in = min_in(ty).max(32);
        // 41 rows in chunks of 6 (last one short), 2 groups straddling chunks.
        dense_case(
            c,
            &Dense {
                groups: 2,
                chunk_rows: Some(6),
                ..Dense::new(ty, n_in, 42, 3)
            },
            31,
        );
        dense_case(
            c,
            &Dense {
                chunk_rows: Some(1),
                ..Dense::new(ty, n_in, 41, 1)
            },
            37,
        );
    }
}

#[test]
fn dense_flash_shapes() {
    let Some(c) = ctx() else { return };
    // q-lora (4096 → 1024, Q8_0) for a decode token and a short prefill, and
    // an expert-down-sized Q2_K / IQ2_XXS product (2048 → 4096).
    for (ty, n_in, n_out, n_tokens) in [
        (GgmlType::Q8_0, 4096, 1024, 1),
        (GgmlType::Q8_0, 4096, 1024, 5),
        (GgmlType::Q2K, 2048, 4096, 1),
        (GgmlType::Iq2Xxs, 4096, 2048, 2),
        (GgmlType::Q4K, 2048, 4096, 1),
        (GgmlType::Mxfp4, 2048, 4096, 1),
    ] {
        dense_case(c, &Dense::new(ty, n_in, n_out, n_tokens), 41);
    }
}

#[test]
fn dense_every_rows_per_workgroup_variant() {
    let Some(c) = ctx() else { return };
    // The pipeline constant ROWS (1…64 rows per workgroup, 64…1 lanes per
    // row), including fewer lanes than the token tile; with subgroups (one
    // subgroup per row) fewer rows than subgroups, as many, and several rows
    // per subgroup. Each on both kernel variants.
    for gpu in devices(c) {
        eprintln!("{} kernels", gpu.shader_variant().name());
        rows_variants(gpu);
    }
}

fn rows_variants(gpu: &Gpu) {
    for rows in [1u32, 2, 8, 16, 64] {
        let k = MatmulKernels::with_rows(gpu, rows).expect("kernels");
        for (ty, n_in) in [
            (GgmlType::Q8_0, 96usize),
            (GgmlType::Iq2Xxs, 512),
            (GgmlType::F16, 45),
        ] {
            for &(n_out, n_tokens) in &[(1usize, 1usize), (67, 9), (130, 17)] {
                dense_case_with(
                    gpu,
                    &k,
                    &Dense::new(ty, n_in, n_out, n_tokens),
                    61 + rows as u64,
                );
            }
        }
    }
    for rows in [1u32, 4, 16] {
        let k = MatmulKernels::with_rows(gpu, rows).expect("kernels");
        experts_case_with(
            gpu,
            &k,
            &Experts::q2_mix(256, 512, 4, 2, 3, Some(3)),
            67 + rows as u64,
        );
    }
    assert!(
        MatmulKernels::with_rows(gpu, 3).is_err(),
        "3 rows per workgroup accepted"
    );
}

/// Byte offset of every member of the WGSL struct `name` in module `family`
/// (naga's layouter), and its size.
fn wgsl_layout(family: &str, name: &str) -> (usize, Vec<(String, usize)>) {
    let src = ds4::backend::wgpu::shaders::module_source(family);
    let m = naga::front::wgsl::parse_str(&src).expect("module parses");
    let (_, ty) = m
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{name} in {family}"));
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("{name} is not a struct")
    };
    let fields = members
        .iter()
        .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
        .collect();
    (*span as usize, fields)
}

#[test]
fn parameter_structs_match_wgsl_field_by_field() {
    use ds4::backend::wgpu::bandwidth::BandwidthParams;
    use ds4::backend::wgpu::matmul::MatmulParams;
    use std::mem::{offset_of, size_of};
    let (size, fields) = wgsl_layout("matmul", "MatmulParams");
    assert_eq!(size, size_of::<MatmulParams>());
    let rust = [
        ("n_in", offset_of!(MatmulParams, n_in)),
        ("n_rows", offset_of!(MatmulParams, n_rows)),
        ("row0", offset_of!(MatmulParams, row0)),
        ("row_bytes", offset_of!(MatmulParams, row_bytes)),
        ("rows_per_group", offset_of!(MatmulParams, rows_per_group)),
        ("x_stride", offset_of!(MatmulParams, x_stride)),
        ("out_stride", offset_of!(MatmulParams, out_stride)),
        ("grid_x", offset_of!(MatmulParams, grid_x)),
        ("expert0", offset_of!(MatmulParams, expert0)),
        ("n_experts", offset_of!(MatmulParams, n_experts)),
        ("k", offset_of!(MatmulParams, k)),
        ("mode", offset_of!(MatmulParams, mode)),
        ("clamp", offset_of!(MatmulParams, clamp)),
        ("pad0", offset_of!(MatmulParams, pad)),
        ("pad1", offset_of!(MatmulParams, pad) + 4),
        ("pad2", offset_of!(MatmulParams, pad) + 8),
    ];
    let want: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(fields, want, "MatmulParams");
    let (size, fields) = wgsl_layout("bandwidth", "BandwidthParams");
    assert_eq!(size, size_of::<BandwidthParams>());
    let want: Vec<(String, usize)> = [
        ("n_words", offset_of!(BandwidthParams, n_words)),
        ("n_threads", offset_of!(BandwidthParams, n_threads)),
        ("pad0", offset_of!(BandwidthParams, pad0)),
        ("pad1", offset_of!(BandwidthParams, pad1)),
    ]
    .iter()
    .map(|(n, o)| (n.to_string(), *o))
    .collect();
    assert_eq!(fields, want, "BandwidthParams");
}

#[test]
fn bad_weights_are_errors() {
    let Some(c) = ctx() else { return };
    let gpu = &c.gpu;
    let max = gpu.max_binding();
    let cases = [
        (
            GgmlType::Q8_0,
            [32, 1, 1, 1],
            &[0u8; 33][..],
            max,
            "wrong byte count accepted",
        ),
        (
            GgmlType::Q6K,
            [256, 1, 1, 1],
            &[0u8; 210][..],
            max,
            "undecodable type accepted",
        ),
        (
            GgmlType::F32,
            [64, 2, 1, 1],
            &[0u8; 512][..],
            100,
            "row larger than the chunk limit accepted",
        ),
    ];
    for (ty, ne, bytes, limit, what) in cases {
        let e = GpuTensor::upload_chunked(gpu, "w", ty, ne, bytes, limit, &mut |_| {});
        assert!(e.is_err(), "{what}");
    }
}

/// A GGUF in memory with the three expert tensors, for MoeExperts::cpu.
fn expert_file(tensors: &[(&str, GgmlType, [u64; 3], &[u8])]) -> (GgufFile, Vec<TensorRef>) {
    let mut w = GgufWriter::new();
    for (n, ty, ne, bytes) in tensors {
        w.add_tensor(n, ne, *ty, bytes.to_vec())
            .expect("add tensor");
    }
    let f = GgufFile::from_vec(w.to_bytes().expect("gguf bytes")).expect("gguf parse");
    let refs = tensors
        .iter()
        .map(|(n, ty, ne, _)| {
            let info = f.tensor_info(n).expect("tensor");
            TensorRef {
                name: n.to_string(),
                ty: *ty,
                ne: [ne[0], ne[1], ne[2], 1],
                offset: f.data_offset() + info.offset,
                n_bytes: info.n_bytes,
            }
        })
        .collect();
    (f, refs)
}

struct Experts {
    gate_ty: GgmlType,
    down_ty: GgmlType,
    d: usize,
    ff: usize,
    n_expert: usize,
    k: usize,
    n_tokens: usize,
    clamp: f32,
    /// Experts per chunk (None: the device's binding limit).
    chunk_experts: Option<usize>,
}

impl Experts {
    /// The q2 mix (IQ2_XXS gate and up, Q2_K down) clamped at 10.
    fn q2_mix(
        d: usize,
        ff: usize,
        n_expert: usize,
        k: usize,
        n_tokens: usize,
        chunk_experts: Option<usize>,
    ) -> Self {
        Experts {
            gate_ty: GgmlType::Iq2Xxs,
            down_ty: GgmlType::Q2K,
            d,
            ff,
            n_expert,
            k,
            n_tokens,
            clamp: 10.0,
            chunk_experts,
        }
    }
}

fn experts_case(c: &Ctx, e: &Experts, seed: u64) {
    experts_case_with(&c.gpu, &c.kernels, e, seed)
}

fn experts_case_with(gpu: &Gpu, kernels: &MatmulKernels, e: &Experts, seed: u64) {
    let name = format!(
        "experts {}/{} d{} ff{} E{} k{} t{} chunk{:?}",
        e.gate_ty, e.down_ty, e.d, e.ff, e.n_expert, e.k, e.n_tokens, e.chunk_experts
    );
    let mut rng = Rng::for_name(seed, &name);
    let t0 = std::time::Instant::now();
    let gate = quantised(&mut rng, e.gate_ty, e.d, e.ff * e.n_expert);
    let up = quantised(&mut rng, e.gate_ty, e.d, e.ff * e.n_expert);
    let down = quantised(&mut rng, e.down_ty, e.ff, e.d * e.n_expert);
    let t_quant = t0.elapsed().as_secs_f64();
    let max_tokens = e.n_tokens + 1;
    let x = randn(&mut rng, max_tokens * e.d, 1.0);
    // Distinct experts per token (as the router picks them), random order.
    let mut sel = vec![0i32; max_tokens * e.k];
    for t in 0..max_tokens {
        let mut pool: Vec<i32> = (0..e.n_expert as i32).collect();
        for i in 0..e.k {
            let j = i + rng.below((pool.len() - i) as u64) as usize;
            pool.swap(i, j);
            sel[t * e.k + i] = pool[i];
        }
    }
    let wts: Vec<f32> = (0..max_tokens * e.k)
        .map(|_| rng.uniform() as f32 * 0.5)
        .collect();

    let ne_gate = [e.d as u64, e.ff as u64, e.n_expert as u64];
    let ne_down = [e.ff as u64, e.d as u64, e.n_expert as u64];
    let (file, refs) = expert_file(&[
        ("gate", e.gate_ty, ne_gate, &gate),
        ("up", e.gate_ty, ne_gate, &up),
        ("down", e.down_ty, ne_down, &down),
    ]);
    let op = MoeExperts {
        x: ds4::graph::ValueId(0),
        selected: ds4::graph::ValueId(1),
        weights: ds4::graph::ValueId(2),
        gate: refs[0].clone(),
        up: refs[1].clone(),
        down: refs[2].clone(),
        clamp: e.clamp,
        k: e.k,
        out: ds4::graph::ValueId(3),
        mid_fp8: false,
    };
    let mut want = vec![0f32; e.n_tokens * e.d];
    op.compute(&file, &x, &sel, &wts, e.n_tokens, &mut want);

    let upload = |n: &str, ty: GgmlType, ne: [u64; 3], bytes: &[u8]| {
        let limit = chunk_limit(gpu, bytes.len() / e.n_expert, e.chunk_experts);
        let t = GpuTensor::upload_chunked(
            gpu,
            n,
            ty,
            [ne[0], ne[1], ne[2], 1],
            bytes,
            limit,
            &mut |_| {},
        )
        .expect("upload");
        let what = format!("{name}: chunks of {n}");
        assert_chunks(&t, e.n_expert, e.chunk_experts, &what);
        t
    };
    let tg = upload("gate", e.gate_ty, ne_gate, &gate);
    let tu = upload("up", e.gate_ty, ne_gate, &up);
    let td = upload("down", e.down_ty, ne_down, &down);
    let [xb, out, sb] = io_buffers(gpu, &x, max_tokens * e.d, e.n_tokens);
    let selb = gpu
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("selected"),
            contents: bytemuck::cast_slice(&sel),
            usage: wgpu::BufferUsages::STORAGE,
        });
    let wb = storage(gpu, &wts);
    let re = kernels
        .experts(
            gpu,
            [&tg, &tu, &td],
            ExpertDims {
                dim: e.d,
                hidden: e.ff,
                n_expert: e.n_expert,
            },
            e.clamp,
            e.k,
            false,
            BufRange::whole(&xb),
            BufRange::whole(&selb),
            BufRange::whole(&wb),
            BufRange::whole(&out),
            &sb,
            max_tokens,
        )
        .expect("experts");
    let (got, t_gpu) = run_and_read(gpu, &out, |p| re.encode(p, e.n_tokens as u32));
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let mut worst = 0f64;
    for i in 0..e.n_tokens * e.d {
        assert!(
            got[i].is_finite(),
            "{name}: out[{i}] not written ({})",
            got[i]
        );
        let err = (got[i] as f64 - want[i] as f64).abs();
        worst = worst.max(err / scale);
        assert!(
            err <= TOL_EXPERTS * scale,
            "{name}: out[{i}] gpu {} cpu {} |Δ| {err:e} > {:e}",
            got[i],
            want[i],
            TOL_EXPERTS * scale
        );
    }
    assert!(
        got[e.n_tokens * e.d..].iter().all(|v| v.is_nan()),
        "{name}: token past n_tokens was written"
    );
    eprintln!("{name}: worst |Δ| / max|out| = {worst:.2e} (quantise {t_quant:.2}s, gpu {t_gpu:.2}s, total {:.2}s)", t0.elapsed().as_secs_f64());
}

#[test]
fn experts_q2_and_q4_mixes() {
    let Some(c) = ctx() else { return };
    for (gate_ty, down_ty) in [
        (GgmlType::Iq2Xxs, GgmlType::Q2K),
        (GgmlType::Q4K, GgmlType::Q4K),
        (GgmlType::F32, GgmlType::Q8_0),
        (GgmlType::Mxfp4, GgmlType::Mxfp4),
    ] {
        for &(n_tokens, k, clamp, chunk) in &[
            (1usize, 2usize, 10.0f32, None),
            (3, 3, 0.0, Some(2usize)),
            (9, 2, 1.5, Some(1)),
        ] {
            experts_case(
                c,
                &Experts {
                    gate_ty,
                    down_ty,
                    d: 256,
                    ff: 256,
                    n_expert: 5,
                    k,
                    n_tokens,
                    clamp,
                    chunk_experts: chunk,
                },
                53,
            );
        }
    }
}

#[test]
fn experts_flash_shape() {
    let Some(c) = ctx() else { return };
    // Flash expert shapes (4096 → 2048 gate/up, 2048 → 4096 down), 6 of 8
    // experts for a decode token, the q2 mix, two experts per chunk.
    experts_case(c, &Experts::q2_mix(4096, 2048, 8, 6, 1, Some(2)), 59);
}
