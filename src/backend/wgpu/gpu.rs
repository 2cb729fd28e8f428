//! Opening a wgpu device: adapter choice (`DS4_WGPU_ADAPTER`, real GPUs before
//! CPU emulators), the limits and features a device is created with, and the
//! error handlers that turn wgpu's callbacks into [`BackendError`]s instead of
//! panics.

use std::sync::{Arc, Mutex};

use crate::backend::{BackendError, BackendOptions};

/// Environment variable naming the adapter to use: an index into
/// `ds4 --list-devices` or a case-insensitive substring of the adapter name
/// ([`BackendOptions::wgpu_adapter`]; named in messages).
pub const ADAPTER_ENV: &str = "DS4_WGPU_ADAPTER";

/// Environment variable choosing the optional features a device is created
/// with (those the adapter has): `all`, `none`, or a comma list of `f16`,
/// `subgroups`, `timestamps`; unset: [`default_features`].
/// `DS4_WGPU_FEATURES=none` runs every kernel's fallback path on an adapter
/// that has the features, `all` the subgroup kernels on lavapipe (CI runs
/// both). Read into [`BackendOptions::wgpu_features`].
pub const FEATURES_ENV: &str = "DS4_WGPU_FEATURES";

/// The optional features ds4 uses where the adapter has them.
pub const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY);

/// Parses a [`FEATURES_ENV`] value into the optional features it allows.
pub fn parse_features(s: &str) -> Result<wgpu::Features, BackendError> {
    let mut f = wgpu::Features::empty();
    for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        f |= match word.to_ascii_lowercase().as_str() {
            "all" => OPTIONAL_FEATURES,
            "none" => wgpu::Features::empty(),
            "f16" | "shader-f16" => wgpu::Features::SHADER_F16,
            "subgroups" | "subgroup" => wgpu::Features::SUBGROUP,
            "timestamps" | "timestamp" => wgpu::Features::TIMESTAMP_QUERY,
            other => {
                return Err(unavailable(format!(
                    "{FEATURES_ENV}={s}: unknown feature {other:?} \
                     (use all, none, or a comma list of f16, subgroups, timestamps)"
                )))
            }
        };
    }
    Ok(f)
}

/// The optional features `opts` allows; `None` when it names none: the
/// default policy of [`default_features`].
pub fn allowed_features(opts: &BackendOptions) -> Result<Option<wgpu::Features>, BackendError> {
    opts.wgpu_features
        .as_deref()
        .map(parse_features)
        .transpose()
}

/// The optional features used when [`FEATURES_ENV`] is unset: all of them,
/// except subgroups on CPU emulation (lavapipe), where the subgroup matrix
/// kernels measured up to 1.7× slower than the workgroup-memory fallback
/// (docs/PERFORMANCE.md). `DS4_WGPU_FEATURES=all` turns them on there too.
pub fn default_features(info: &wgpu::AdapterInfo) -> wgpu::Features {
    if info.device_type == wgpu::DeviceType::Cpu {
        OPTIONAL_FEATURES - wgpu::Features::SUBGROUP
    } else {
        OPTIONAL_FEATURES
    }
}

/// One open device and what it was created with.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The limits the device was created with (the adapter's own).
    pub limits: wgpu::Limits,
    /// Optional features turned on (shader-f16, subgroups, timestamps) where
    /// the adapter has them and [`FEATURES_ENV`] allows them; kernels must
    /// work without each of them.
    pub features: wgpu::Features,
    pub info: wgpu::AdapterInfo,
    /// Errors reported by wgpu callbacks since the last [`Gpu::check`].
    errors: Arc<Mutex<Vec<String>>>,
}

/// The per-step parameters every kernel reads: written once per step into a
/// uniform buffer (the WGSL twin is `StepUniform` in `shaders/common.wgsl`).
/// Per-row values (position, session state) are in the row table
/// ([`RowRecord`]) beside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepUniform {
    /// Absolute position of the step's first token.
    pub pos0: u32,
    /// Live tokens in this step (kernels bound-check against it).
    pub n_tokens: u32,
    /// The first row of these tokens in the step's activations: 0 for the
    /// step uniform every kernel reads; a session's first row in the
    /// uniform of its state set, which the per-session kernels (attention,
    /// ring write, compressor, indexer) read in a step of several sessions.
    pub row0: u32,
    pub _pad: u32,
}

/// One row of a step in the row table every position-dependent kernel reads
/// (`row_table[t]`; WGSL twin `RowRecord` in `shaders/common.wgsl`): the
/// graph's [`crate::graph::RowRecord`], 8 bytes, written per step beside
/// the [`StepUniform`].
pub use crate::graph::RowRecord;

/// What `ds4 --list-devices` prints for one adapter.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub index: usize,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
}

impl AdapterSummary {
    /// A real GPU (not a CPU emulator such as lavapipe or llvmpipe).
    pub fn is_real_gpu(&self) -> bool {
        is_real_gpu(&self.info)
    }
}

fn is_real_gpu(info: &wgpu::AdapterInfo) -> bool {
    matches!(
        info.device_type,
        wgpu::DeviceType::DiscreteGpu
            | wgpu::DeviceType::IntegratedGpu
            | wgpu::DeviceType::VirtualGpu
    )
}

/// Describes an adapter in one line (name, backend, type).
pub fn describe(info: &wgpu::AdapterInfo) -> String {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "CPU emulation",
        wgpu::DeviceType::Other => "other",
    };
    format!("{} ({:?}, {kind})", info.name, info.backend)
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    // Compute needs Vulkan, Metal or DX12; GL has no storage-buffer guarantees.
    if desc.backends == wgpu::Backends::all() {
        desc.backends = wgpu::Backends::PRIMARY;
    }
    #[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
    if let Some(inst) = compute_only_vulkan(&desc) {
        return inst;
    }
    wgpu::Instance::new(desc)
}

/// The window-system surface extensions a compute engine never uses.
#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
const WINDOW_SURFACES: [&std::ffi::CStr; 3] = [
    c"VK_KHR_xlib_surface",
    c"VK_KHR_xcb_surface",
    c"VK_KHR_wayland_surface",
];

/// A Vulkan-only instance without [`WINDOW_SURFACES`] when Vulkan is the
/// only backend `desc` asks for that this platform has (the default).
///
/// wgpu enables every window-system extension the driver lists, and Mesa's
/// device-selection layer reads an enabled `VK_KHR_wayland_surface` or
/// `VK_KHR_xcb_surface` as "find the compositor's GPU": it connects to the
/// display server, and without one libwayland prints `error: XDG_RUNTIME_DIR
/// is invalid or not set in the environment.` on every start of a server or
/// container (issue 39). Without those extensions the layer only orders the
/// devices. `VK_KHR_surface` stays: the `VK_KHR_swapchain` wgpu asks of every
/// device depends on it. wgpu-hal already runs without the removed ones on
/// drivers that lack them (it keeps only the extensions the driver lists and
/// checks for each before creating a surface), and ds4 creates no surface.
/// `None` (use the ordinary instance) where `desc` names other backends too
/// or Vulkan does not load.
#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
fn compute_only_vulkan(desc: &wgpu::InstanceDescriptor) -> Option<wgpu::Instance> {
    use wgpu::hal;
    let here = wgpu::Backends::VULKAN | wgpu::Backends::GL;
    if desc.backends & here != wgpu::Backends::VULKAN {
        return None;
    }
    let hal_desc = hal::InstanceDescriptor {
        name: "ds4",
        flags: desc.flags,
        memory_budget_thresholds: desc.memory_budget_thresholds,
        backend_options: desc.backend_options.clone(),
        telemetry: None,
        display: None,
    };
    let drop_window_surfaces: Box<hal::vulkan::CreateInstanceCallback> =
        Box::new(|args: hal::vulkan::CreateInstanceCallbackArgs| {
            args.extensions.retain(|e| !WINDOW_SURFACES.contains(e));
        });
    // SAFETY: the callback only removes optional window-system extensions,
    // which wgpu-hal checks for before every use (see above); the instance is
    // handed to wgpu whole, as `from_hal` asks.
    let raw =
        unsafe { hal::vulkan::Instance::init_with_callback(&hal_desc, Some(drop_window_surfaces)) }
            .ok()?;
    // SAFETY: `raw` is a freshly created wgpu-hal Vulkan instance.
    Some(unsafe { wgpu::Instance::from_hal::<hal::api::Vulkan>(raw) })
}

fn adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
}

/// Every adapter wgpu can see, in the order `DS4_WGPU_ADAPTER` indexes them.
pub fn list_adapters() -> Vec<AdapterSummary> {
    adapters(&instance())
        .iter()
        .enumerate()
        .map(|(index, a)| AdapterSummary {
            index,
            info: a.get_info(),
            limits: a.limits(),
            features: a.features(),
        })
        .collect()
}

/// How to choose an adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterChoice {
    /// The first real GPU; CPU emulators only if `allow_emulation`.
    Best { allow_emulation: bool },
    /// By index or by (case-insensitive) name substring.
    Named(String),
}

impl AdapterChoice {
    /// The adapter `opts` names, else `Best`.
    pub fn new(opts: &BackendOptions, allow_emulation: bool) -> AdapterChoice {
        match opts.wgpu_adapter.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => AdapterChoice::Named(s.to_string()),
            _ => AdapterChoice::Best { allow_emulation },
        }
    }
}

fn unavailable(reason: String) -> BackendError {
    BackendError::Unavailable {
        backend: "wgpu".into(),
        reason,
    }
}

fn pick(list: Vec<wgpu::Adapter>, choice: &AdapterChoice) -> Result<wgpu::Adapter, BackendError> {
    let names = || {
        list.iter()
            .enumerate()
            .map(|(i, a)| format!("{i}: {}", describe(&a.get_info())))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if list.is_empty() {
        return Err(unavailable(
            "no adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers for lavapipe)"
                .into(),
        ));
    }
    match choice {
        AdapterChoice::Named(s) => {
            let idx = match s.parse::<usize>() {
                Ok(i) if i < list.len() => Some(i),
                Ok(_) => None,
                Err(_) => {
                    let low = s.to_lowercase();
                    list.iter()
                        .position(|a| a.get_info().name.to_lowercase().contains(&low))
                }
            };
            match idx {
                Some(i) => Ok(list.into_iter().nth(i).expect("index checked")),
                None => Err(unavailable(format!(
                    "{ADAPTER_ENV}={s} matches no adapter (have: {})",
                    names()
                ))),
            }
        }
        AdapterChoice::Best { allow_emulation } => {
            let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            let best = list
                .iter()
                .enumerate()
                .filter(|(_, a)| *allow_emulation || is_real_gpu(&a.get_info()))
                .min_by_key(|(i, a)| (rank(a), *i))
                .map(|(i, _)| i);
            match best {
                Some(i) => Ok(list.into_iter().nth(i).expect("index checked")),
                None => Err(unavailable(format!(
                    "no real GPU adapter (have: {}); CPU emulators are used only with --backend wgpu",
                    names()
                ))),
            }
        }
    }
}

impl Gpu {
    /// Opens the adapter `opts` names (CPU emulators among the best only if
    /// `allow_emulation`) with its own limits and the optional features it
    /// has that `opts` allows, and installs the error handlers.
    pub fn open(opts: &BackendOptions, allow_emulation: bool) -> Result<Gpu, BackendError> {
        Self::open_inner(
            &AdapterChoice::new(opts, allow_emulation),
            allowed_features(opts)?,
        )
    }

    /// Opens the chosen adapter with the optional features in `allow` that it
    /// has (tests open one device per variant in one process).
    pub fn open_with(choice: &AdapterChoice, allow: wgpu::Features) -> Result<Gpu, BackendError> {
        Self::open_inner(choice, Some(allow))
    }

    /// `allow`: `None` for [`default_features`].
    fn open_inner(
        choice: &AdapterChoice,
        allow: Option<wgpu::Features>,
    ) -> Result<Gpu, BackendError> {
        let inst = instance();
        let adapter = pick(adapters(&inst), choice)?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let allow = allow.unwrap_or_else(|| default_features(&info));
        let mut features = adapter.features() & OPTIONAL_FEATURES & allow;
        // Subgroup kernels size their per-subgroup scratch for subgroups of
        // at least 4 invocations (WebGPU's minimum); an adapter reporting
        // less runs the fallback.
        if info.subgroup_min_size < 4 || info.subgroup_max_size < info.subgroup_min_size {
            features.remove(wgpu::Features::SUBGROUP);
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("ds4"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| {
            unavailable(format!("{}: cannot create a device: {e}", describe(&info)))
        })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let sink = errors.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut v) = sink.lock() {
                v.push(format!("device lost ({reason:?}): {msg}"));
            }
        });
        Ok(Gpu {
            device,
            queue,
            limits,
            features,
            info,
            errors,
        })
    }

    /// One device per adapter choice for the whole process: sessions (and
    /// tests) opened one after another share it and, through
    /// [`super::kernels::Pipelines::of`], its compiled pipelines.
    pub fn shared(opts: &BackendOptions, allow_emulation: bool) -> Result<Arc<Gpu>, BackendError> {
        Self::shared_inner(
            &AdapterChoice::new(opts, allow_emulation),
            allowed_features(opts)?,
        )
    }

    /// [`Gpu::shared`] with the optional features limited to `allow`.
    pub fn shared_with(
        choice: &AdapterChoice,
        allow: wgpu::Features,
    ) -> Result<Arc<Gpu>, BackendError> {
        Self::shared_inner(choice, Some(allow))
    }

    fn shared_inner(
        choice: &AdapterChoice,
        allow: Option<wgpu::Features>,
    ) -> Result<Arc<Gpu>, BackendError> {
        type Open = Vec<((AdapterChoice, Option<wgpu::Features>), Arc<Gpu>)>;
        static OPEN: Mutex<Open> = Mutex::new(Vec::new());
        let key = (choice.clone(), allow.map(|a| a & OPTIONAL_FEATURES));
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, g)) = open.iter().find(|(k, _)| *k == key) {
            return Ok(g.clone());
        }
        let g = Arc::new(Gpu::open_inner(choice, key.1)?);
        open.push((key, g.clone()));
        Ok(g)
    }

    /// The WGSL variant this device's kernels are assembled for.
    pub fn shader_variant(&self) -> super::shaders::Variant {
        super::shaders::Variant {
            subgroups: self.features.contains(wgpu::Features::SUBGROUP),
        }
    }

    /// One line naming the device (for notices and errors).
    pub fn describe(&self) -> String {
        describe(&self.info)
    }

    /// Returns the first error a wgpu callback reported since the last call.
    pub fn check(&self) -> Result<(), BackendError> {
        let mut v = match self.errors.lock() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        };
        if v.is_empty() {
            return Ok(());
        }
        let msg = v.join("; ");
        v.clear();
        Err(BackendError::Device {
            device: self.describe(),
            msg,
        })
    }

    /// Blocks until all submitted work is done, then reports any error.
    pub fn wait(&self) -> Result<(), BackendError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| BackendError::Device {
                device: self.describe(),
                msg: e.to_string(),
            })?;
        self.check()
    }

    /// The largest storage binding this device allows, in bytes.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }
}

/// What `ds4 --list-devices` prints: every adapter with its index (for
/// `DS4_WGPU_ADAPTER`), backend, type, the limits that matter here and its
/// features.
pub fn devices_report() -> String {
    let list = list_adapters();
    if list.is_empty() {
        return "no wgpu adapter found (install a Vulkan driver; mesa-vulkan-drivers gives lavapipe)\n"
            .into();
    }
    let mut out = String::new();
    for a in &list {
        let l = &a.limits;
        out.push_str(&format!(
            "{}: {}{}\n    driver: {} {}\n    max_storage_buffer_binding_size {} B, max_buffer_size {} B, \
             max_storage_buffers_per_shader_stage {}, max_compute_workgroup_storage_size {} B, \
             max_compute_invocations_per_workgroup {}, subgroup size {}..{}\n    features: {:?}\n",
            a.index,
            describe(&a.info),
            if a.is_real_gpu() { "" } else { " — not picked by --backend auto" },
            a.info.driver,
            a.info.driver_info,
            l.max_storage_buffer_binding_size,
            l.max_buffer_size,
            l.max_storage_buffers_per_shader_stage,
            l.max_compute_workgroup_storage_size,
            l.max_compute_invocations_per_workgroup,
            a.info.subgroup_min_size,
            a.info.subgroup_max_size,
            a.features,
        ));
    }
    out.push_str(&format!(
        "{ADAPTER_ENV}=INDEX|NAME picks one; --backend auto uses the first real GPU.\n\
         {FEATURES_ENV}=all|none|f16,subgroups,timestamps picks the optional features used \
         (default: all, but no subgroups on CPU emulation).\n"
    ));
    out
}
