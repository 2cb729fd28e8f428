//! Pipelines of the WGSL families: one shader module and one explicit bind
//! group layout per module (binding 0 the step uniform, 1 the family's
//! parameter struct, then storage buffers in the order the WGSL declares
//! them: `launch/<family>.rs` says which), one compute pipeline per entry
//! point, created on first use and cached for the backend's lifetime.
//!
//! [`Pipelines`] holds these caches and the matrix-product pipelines beside
//! the device rather than on it, so the device ([`Gpu`]) knows nothing of
//! the kernels that run on it and `gpu.rs` imports none of its siblings.

use std::collections::hash_map::Entry as Slot;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::matmul::{storage_entry, uniform_entry, MatmulKernels};
use super::shaders::Module;
use super::Gpu;
use crate::backend::kernels::Entry;
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

/// One module's layout, shader and pipelines.
struct Compiled {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    module: wgpu::ShaderModule,
    pipelines: HashMap<Entry, wgpu::ComputePipeline>,
}

#[derive(Default)]
pub struct Kernels {
    modules: HashMap<Module, Compiled>,
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
    /// The compiled `module`, its bind group layout the two uniforms and
    /// `storage` (created on first use).
    fn module(
        &mut self,
        gpu: &Gpu,
        m: Module,
        storage: &[Access],
    ) -> Result<&mut Compiled, BackendError> {
        let slot = match self.modules.entry(m) {
            Slot::Occupied(e) => return Ok(e.into_mut()),
            Slot::Vacant(e) => e,
        };
        let name = m.name();
        // The variant follows the device's features: subgroup reductions
        // where the device was created with SUBGROUP, else the fallback.
        let src = m.source(gpu.shader_variant());
        // The step uniform, the parameters, then the storage buffers.
        let mut entries = vec![uniform_entry(0), uniform_entry(1)];
        for (i, a) in storage.iter().enumerate() {
            entries.push(storage_entry(2 + i as u32, *a == Access::Read));
        }
        let fam = scoped(gpu, &format!("shader family {name}"), || {
            let layout = gpu
                .device
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
            Compiled {
                layout,
                pipeline_layout,
                module,
                pipelines: HashMap::new(),
            }
        })?;
        Ok(slot.insert(fam))
    }

    /// The pipeline of `entry` in `module` and its bind group layout (the
    /// two uniforms, then `storage`: the family's storage bindings in WGSL
    /// declaration order).
    pub fn pipeline(
        &mut self,
        gpu: &Gpu,
        module: Module,
        entry: Entry,
        storage: &[Access],
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout), BackendError> {
        let fam = self.module(gpu, module, storage)?;
        if !fam.pipelines.contains_key(&entry) {
            let name = module.name();
            let p = scoped(gpu, &format!("pipeline {name}::{entry}"), || {
                gpu.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry.name()),
                        layout: Some(&fam.pipeline_layout),
                        module: &fam.module,
                        entry_point: Some(entry.name()),
                        compilation_options: Default::default(),
                        cache: None,
                    })
            })?;
            fam.pipelines.insert(entry, p);
        }
        Ok((fam.pipelines[&entry].clone(), fam.layout.clone()))
    }
}
