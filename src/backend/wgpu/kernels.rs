//! Pipelines of the WGSL families: one shader module and one explicit bind
//! group layout per family (binding 0 the step uniform, 1 the family's
//! parameter struct, then storage buffers in the order the WGSL declares
//! them), one compute pipeline per entry point, created on first use and
//! cached for the backend's lifetime.
//!
//! [`Pipelines`] holds these caches and the matrix-product pipelines beside
//! the device rather than on it, so the device ([`Gpu`]) knows nothing of
//! the kernels that run on it and `gpu.rs` imports none of its siblings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::matmul::MatmulKernels;
use super::{shaders, Gpu};
use crate::backend::BackendError;

/// The compiled pipelines of one device: the WGSL families' and the matrix
/// products'. Every backend on a device shares one ([`Pipelines::of`]).
#[derive(Default)]
pub struct Pipelines {
    /// Pipelines of the WGSL families.
    pub kernels: Mutex<Kernels>,
    /// Matrix-product pipelines, created on first use.
    matmul: Mutex<Option<Arc<MatmulKernels>>>,
}

impl Pipelines {
    /// The pipelines of `gpu`, shared by every backend opened on the same
    /// device (`Gpu::shared` hands out one device per adapter choice).
    pub fn of(gpu: &Arc<Gpu>) -> Arc<Pipelines> {
        type Open = Vec<(Weak<Gpu>, Arc<Pipelines>)>;
        static OPEN: Mutex<Open> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|(g, _)| g.strong_count() > 0);
        let key = Arc::downgrade(gpu);
        if let Some((_, p)) = open.iter().find(|(g, _)| Weak::ptr_eq(g, &key)) {
            return p.clone();
        }
        let p = Arc::new(Pipelines::default());
        open.push((key, p.clone()));
        p
    }

    /// The matrix-product pipelines of `gpu`.
    pub fn matmul(&self, gpu: &Gpu) -> Result<Arc<MatmulKernels>, BackendError> {
        let mut m = self.matmul.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = m.as_ref() {
            return Ok(k.clone());
        }
        let k = Arc::new(MatmulKernels::new(gpu)?);
        *m = Some(k.clone());
        Ok(k)
    }
}

/// Storage binding access, in WGSL declaration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

use Access::{Read as R, Write as W};

/// The storage bindings of each family (after the two uniforms).
pub fn storage_layout(family: &str) -> Option<&'static [Access]> {
    Some(match shaders::base_family(family).0 {
        "elementwise" | "embed" | "norm" => &[R, R, W],
        // The row table (last binding) of every position-dependent family.
        "rope" => &[R, R, W, R],
        "hc_mix" => &[R, R, R, W, W, W],
        "hc" => &[R, R, R, R, W],
        "round" => &[R, W],
        "ring" | "gather" => &[R, W, R],
        // The chunked cached rows: chunk 0 in place, chunks 1..8 appended.
        "attention" => &[R, R, R, R, R, R, W, R, R, R, R, R, R, R, R],
        "compress" => &[R, R, R, W, W, W, W, W, W, W, W, W, W, R],
        "indexer" => &[R, R, R, W, W, R, R, R, R, R, R, R, R],
        "router" => &[R, R, R, R, W, W],
        "v41_gate" => &[R, R, R, R, W],
        // rows0, irows0 in place, then rows1..7 and irows1..7.
        "v41_compress" => &[
            R, R, R, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, W, R,
        ],
        // keys0 in place, keys1..7 appended.
        "v41_select" => &[R, R, R, R, W, W, R, R, R, R, R, R, R, R],
        _ => return None,
    })
}

/// Families that read the step's row table (bound last).
pub fn uses_row_table(family: &str) -> bool {
    matches!(
        shaders::base_family(family).0,
        "rope"
            | "ring"
            | "attention"
            | "compress"
            | "indexer"
            | "gather"
            | "v41_compress"
            | "v41_select"
    )
}

struct Family {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    module: wgpu::ShaderModule,
    pipelines: HashMap<String, wgpu::ComputePipeline>,
}

#[derive(Default)]
pub struct Kernels {
    families: HashMap<String, Family>,
}

/// Runs `f` inside a validation error scope and turns a reported error
/// into a `BackendError` naming `what`.
pub fn scoped<T>(gpu: &Gpu, what: &str, f: impl FnOnce() -> T) -> Result<T, BackendError> {
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = f();
    match pollster::block_on(scope.pop()) {
        None => Ok(out),
        Some(e) => Err(BackendError::Device {
            device: gpu.describe(),
            msg: format!("{what}: {e}"),
        }),
    }
}

impl Kernels {
    fn family(&mut self, gpu: &Gpu, name: &str) -> Result<&mut Family, BackendError> {
        if !self.families.contains_key(name) {
            let storage = storage_layout(name).ok_or_else(|| BackendError::Unsupported {
                backend: "wgpu".into(),
                what: format!("kernel family {name}"),
            })?;
            // The variant follows the device's features: subgroup reductions
            // where the device was created with SUBGROUP, else the fallback.
            let src =
                shaders::try_module_source_for(name, gpu.shader_variant()).ok_or_else(|| {
                    BackendError::Unsupported {
                        backend: "wgpu".into(),
                        what: format!("WGSL family {name}"),
                    }
                })?;
            let mut entries = Vec::new();
            for b in 0..2u32 {
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding: b,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
            }
            for (i, a) in storage.iter().enumerate() {
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding: 2 + i as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: *a == Access::Read,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
            }
            let fam = scoped(gpu, &format!("shader family {name}"), || {
                let layout =
                    gpu.device
                        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                            label: Some(name),
                            entries: &entries,
                        });
                let pipeline_layout =
                    gpu.device
                        .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                            label: Some(name),
                            bind_group_layouts: &[Some(&layout)],
                            immediate_size: 0,
                        });
                let module = gpu
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(name),
                        source: wgpu::ShaderSource::Wgsl(src.into()),
                    });
                Family {
                    layout,
                    pipeline_layout,
                    module,
                    pipelines: HashMap::new(),
                }
            })?;
            self.families.insert(name.to_string(), fam);
        }
        Ok(self.families.get_mut(name).expect("inserted above"))
    }

    /// The pipeline of `family::entry` and its bind group layout.
    pub fn pipeline(
        &mut self,
        gpu: &Gpu,
        family: &str,
        entry: &str,
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout), BackendError> {
        let fam = self.family(gpu, family)?;
        if !fam.pipelines.contains_key(entry) {
            let p = scoped(gpu, &format!("pipeline {family}::{entry}"), || {
                gpu.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&fam.pipeline_layout),
                        module: &fam.module,
                        entry_point: Some(entry),
                        compilation_options: Default::default(),
                        cache: None,
                    })
            })?;
            fam.pipelines.insert(entry.to_string(), p);
        }
        Ok((fam.pipelines[entry].clone(), fam.layout.clone()))
    }
}
