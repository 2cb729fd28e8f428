//! The wgpu backend: the recorded graph runs as WGSL compute kernels on
//! Metal, Vulkan (including lavapipe, Mesa's CPU Vulkan) or DX12.

pub mod gpu;
pub mod matmul;
pub mod params;
pub mod shaders;
pub mod weights;

use std::ops::Range;
use std::sync::Arc;

pub use gpu::{AdapterChoice, Gpu, StepUniform};

use super::{Backend, BackendError, GraphHandle, WeightFile};
use crate::graph::{Graph, StateId, StateLayout, StepParams, ValueId};

pub struct WgpuBackend {
    gpu: Gpu,
    #[allow(dead_code)]
    file: WeightFile,
    layout: StateLayout,
}

impl WgpuBackend {
    /// Opens the adapter `choice` names and prepares the state buffers.
    pub fn open(
        choice: &AdapterChoice,
        file: WeightFile,
        layout: StateLayout,
    ) -> Result<WgpuBackend, BackendError> {
        let gpu = Gpu::open(choice)?;
        Ok(WgpuBackend { gpu, file, layout })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn unsupported(&self, what: &str) -> BackendError {
        BackendError::Unsupported {
            backend: "wgpu".into(),
            what: what.into(),
        }
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device(&self) -> String {
        self.gpu.describe()
    }

    fn state_layout(&self) -> &StateLayout {
        &self.layout
    }

    fn load_graph(&mut self, _graph: Arc<Graph>) -> Result<GraphHandle, BackendError> {
        Err(self.unsupported("graphs yet"))
    }

    fn run(&mut self, g: GraphHandle, _: &[u32], _: StepParams) -> Result<(), BackendError> {
        Err(BackendError::UnknownGraph(g.0))
    }

    fn read_value(&self, g: GraphHandle, _: ValueId) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::UnknownGraph(g.0))
    }

    fn write_value(&mut self, g: GraphHandle, _: ValueId, _: &[f32]) -> Result<(), BackendError> {
        Err(BackendError::UnknownGraph(g.0))
    }

    fn read_state_rows(&self, _: StateId, _: Range<usize>) -> Result<Vec<f32>, BackendError> {
        Err(self.unsupported("state reads yet"))
    }

    fn write_state_rows(&mut self, _: StateId, _: usize, _: &[f32]) -> Result<(), BackendError> {
        Err(self.unsupported("state writes yet"))
    }

    fn reset_states(&mut self) {}
}
