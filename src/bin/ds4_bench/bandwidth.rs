//! `ds4-bench --bandwidth`: the device's read bandwidth, then each matvec
//! kernel at the Flash shapes as GB/s and a fraction of that read, and with
//! `--bw-decode` whole decode steps of `-m` (wgpu, or CUDA with `--backend
//! cuda`). The table goes to stdout, the CSV to `--csv` when given.

use std::sync::Arc;
use std::time::Instant;

use ds4::backend::bandwidth::{self as bw, Measure};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};

use super::{open_model, Args};

/// `--bandwidth`: the table on stdout, the CSV to `--csv` when given. The
/// device is the wgpu adapter, or the CUDA device with `--backend cuda`.
pub fn run(a: &Args, bo: &BackendOptions) -> Result<(), String> {
    if a.bw_mib == 0 || a.bw_trials == 0 {
        return Err("--bw-mib and --bw-trials must be positive".into());
    }
    if a.bw_max_out == Some(0) {
        return Err("--bw-max-out must be positive".into());
    }
    let backend = a.backend_flags().resolve()?;
    let csv = if backend == BackendKind::Cuda {
        bandwidth_cuda(a, bo)?
    } else {
        bandwidth_wgpu(a, bo)?
    };
    if let Some(p) = &a.csv {
        std::fs::write(p, csv.join("\n") + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// The Flash matvec shapes picked by `--bw-shapes`, with at most
/// `--bw-max-out` output rows each.
fn bandwidth_shapes(a: &Args) -> Vec<(&'static str, ds4::quant::GgmlType, u64, u64)> {
    let words: Option<Vec<String>> = a
        .bw_shapes
        .as_ref()
        .map(|list| list.split(',').map(|w| w.trim().to_lowercase()).collect());
    bw::FLASH_MATVECS
        .iter()
        .filter(|(name, ty, _, _)| match &words {
            None => true,
            Some(words) => {
                let (name, ty) = (name.to_lowercase(), ty.name().to_lowercase());
                words
                    .iter()
                    .any(|w| !w.is_empty() && (name.contains(w.as_str()) || ty == *w))
            }
        })
        .map(|&(name, ty, n_in, n_out)| {
            (name, ty, n_in, a.bw_max_out.map_or(n_out, |m| n_out.min(m)))
        })
        .collect()
}

fn bandwidth_wgpu(a: &Args, bo: &BackendOptions) -> Result<Vec<String>, String> {
    use ds4::backend::wgpu::{bandwidth, gpu, AdapterChoice, Gpu};
    // An explicit benchmark: CPU emulators (lavapipe) are allowed.
    let choice = AdapterChoice::new(bo, true);
    let first = Gpu::open_with(&choice, gpu::OPTIONAL_FEATURES).map_err(|e| e.to_string())?;
    let sets: Vec<String> = match &a.bw_features {
        Some(list) => list.split('/').map(|x| x.trim().to_string()).collect(),
        // Only subgroups differ between the two devices (timestamps kept, so
        // both variants are timed the same way).
        None if first.shader_variant().subgroups => vec!["all".into(), "f16,timestamps".into()],
        None => vec!["all".into()],
    };
    let mut gpus = Vec::new();
    for set in &sets {
        let allow = gpu::parse_features(set).map_err(|e| format!("--bw-features: {e}"))?;
        gpus.push((
            set.clone(),
            Gpu::open_with(&choice, allow).map_err(|e| e.to_string())?,
        ));
    }
    drop(first);
    let rows = match &a.bw_rows {
        Some(list) => list
            .split(',')
            .map(|r| {
                r.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("--bw-rows: {r:?} is not a number"))
            })
            .collect::<Result<Vec<u32>, String>>()?,
        None => vec![],
    };
    let refs: Vec<&Gpu> = gpus.iter().map(|(_, g)| g).collect();
    let device = refs[0].describe();
    let shapes = bandwidth_shapes(a);
    let mut read = None;
    let mut csv = bw::print_report(&device, a.bw_mib << 20, a.bw_trials, |each| {
        bandwidth::run(
            &refs,
            a.bw_mib << 20,
            a.bw_trials,
            &shapes,
            &rows,
            &mut |m| {
                if m.kind == "device read" && read.is_none() {
                    read = Some(m.gb_per_s());
                }
                each(m)
            },
        )
        .map(|_| ())
    })
    .map_err(|e| e.to_string())?;
    if a.bw_decode {
        let model = open_model(a)?;
        for (set, g) in &gpus {
            // The session opens its own device with these features.
            let bo = BackendOptions {
                wgpu_features: Some(set.clone()),
                ..bo.clone()
            };
            let m = decode_step(
                a,
                &model,
                BackendKind::Wgpu,
                &bo,
                "",
                g.shader_variant().name(),
            )?;
            println!("{}", bw::table_row(&m, read));
            csv.push(bw::csv_row(&g.describe(), &m, read));
        }
    }
    Ok(csv)
}

#[cfg(feature = "cuda")]
fn bandwidth_cuda(a: &Args, bo: &BackendOptions) -> Result<Vec<String>, String> {
    use ds4::backend::cuda::bandwidth::{self, Bench};
    let bench = Bench::open(bo).map_err(|e| e.to_string())?;
    let device = bench.describe();
    let shapes = bandwidth_shapes(a);
    let mut read = None;
    let mut csv = bw::print_report(&device, a.bw_mib << 20, a.bw_trials, |each| {
        bandwidth::run(&bench, a.bw_mib << 20, a.bw_trials, &shapes, &mut |m| {
            if m.kind == "device read" {
                read = Some(m.gb_per_s());
            }
            each(m)
        })
    })
    .map_err(|e| e.to_string())?;
    // The decode sessions open the device themselves.
    drop(bench);
    if a.bw_decode {
        let model = open_model(a)?;
        // The CUDA graph on (the default) and off: the difference is the
        // launch overhead the graph removes.
        for (cuda_graph, label) in [(true, "graph on"), (false, "graph off")] {
            let bo = BackendOptions {
                cuda_graph,
                ..bo.clone()
            };
            let m = decode_step(a, &model, BackendKind::Cuda, &bo, label, "")?;
            println!("{}", bw::table_row(&m, read));
            csv.push(bw::csv_row(&device, &m, read));
        }
    }
    Ok(csv)
}

#[cfg(not(feature = "cuda"))]
fn bandwidth_cuda(_a: &Args, _bo: &BackendOptions) -> Result<Vec<String>, String> {
    Err("backend cuda is not available: this ds4-bench was built without CUDA support (cargo build --features cuda)".into())
}

/// One whole decode step of `-m` on `backend`: the best of
/// `--bw-decode-steps` steps after an 8-token prefill, with the model's active
/// weight bytes per token as the bytes moved (KV reads at this short
/// context are negligible). `label` is added to the shape column, `kernels`
/// names the kernel variant.
fn decode_step(
    a: &Args,
    model: &Arc<ModelFile>,
    backend: ds4::backend::BackendKind,
    bo: &BackendOptions,
    label: &str,
    kernels: &str,
) -> Result<Measure, String> {
    let active = model.weights.active_bytes_per_token(&model.config);
    let steps = a.bw_decode_steps.max(1);
    let opts = SessionOptions {
        ctx: 64 + steps,
        backend,
        backend_options: bo.clone(),
        ..Default::default()
    };
    let mut sess = Session::new(model.clone(), opts).map_err(|e| e.to_string())?;
    let vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..8u32).map(|i| (1000 + 97 * i) % vocab).collect();
    sess.sync(&prompt, &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let mut best = f64::INFINITY;
    for i in 0..steps {
        let t = Instant::now();
        sess.eval((2000 + 31 * i as u32) % vocab)
            .map_err(|e| e.to_string())?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let file = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Measure {
        kind: "decode step".into(),
        name: if label.is_empty() {
            file
        } else {
            format!("{file} {label}")
        },
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes: active,
        seconds: best,
        timer: "wall",
        rows: 0,
        kernels: kernels.into(),
    })
}
