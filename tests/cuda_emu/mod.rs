//! Test support (feature `cuda`): when the machine has no NVIDIA driver,
//! builds the host emulator of the CUDA driver (tests/cuda_emu/emu.h,
//! driver.cpp: the kernels of cuda/*.cu compiled for the host, every CUDA
//! thread a coroutine) as `libcuda.so` and loads it before cudarc looks for
//! the driver, so the CUDA backend — launch lists, CUDA-graph capture and
//! replay, memory, and every kernel's logic — runs against the CPU twins in
//! CI. The real NVRTC still compiles every module to PTX at backend start;
//! the emulator checks the PTX header and runs the host build instead.
//!
//! With a real driver present nothing is emulated. `DS4_CUDA_EMU=0` turns
//! the emulator off (the CUDA halves then skip on a machine without a GPU).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ds4::backend::cuda::kernels;
use ds4::backend::kernels::Family;

/// The emulator's source: its header, the CUDA helper headers, every
/// family of the kernel list (src/backend/kernels.rs; the one dynamic shared
/// array becomes static storage), the fake driver, then the driver's
/// registry of every kernel the CUDA loader looks up.
fn source(root: &Path) -> String {
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let mut s = read("tests/cuda_emu/emu.h");
    s.push('\n');
    for (_, text) in kernels::helpers() {
        s.push_str(text);
        s.push('\n');
    }
    for f in Family::ALL {
        s.push_str(
            &f.cuda_source()
                .replace("extern __shared__ float buf[];", "static float buf[1024];"),
        );
        s.push('\n');
    }
    s.push_str(&read("tests/cuda_emu/driver.cpp"));
    s.push_str("\n// ---- the kernel registry (tests/cuda_emu/mod.rs) ----\n");
    for f in Family::ALL {
        for name in kernels::entry_points(*f) {
            s.push_str(&format!("REG({name}) ARITY({name})\n"));
        }
    }
    s
}

fn build() -> Result<PathBuf, String> {
    // Tests of one binary run on several threads of one process: build once
    // (the temporary names below are per process, not per thread).
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = source(root);
    let hash = src.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda-emu-{hash:016x}"));
    let lib = dir.join("libcuda.so");
    if lib.exists() {
        point_current(&dir);
        return Ok(lib);
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let cpp = dir.join(format!("emu.{}.cpp", std::process::id()));
    std::fs::write(&cpp, &src).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("libcuda.so.{}", std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let o = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
        ])
        .args([
            "-Wall",
            "-Werror",
            "-Wno-unknown-pragmas",
            "-Wl,-soname,libcuda.so",
            "-o",
        ])
        .arg(&tmp)
        .arg(&cpp)
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{cxx} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    // Another test process may have finished the same library first.
    if let Err(e) = std::fs::rename(&tmp, &lib) {
        if !lib.exists() {
            return Err(format!("{}: {e}", lib.display()));
        }
    }
    std::fs::remove_file(&cpp).ok();
    point_current(&dir);
    Ok(lib)
}

/// `CARGO_TARGET_TMPDIR/cuda-emu-current` names the folder of the library
/// built last, for the GPU round's dry run (bench/gpu_round.sh --dry puts
/// it on `LD_LIBRARY_PATH`; docs/GPU_ROUND.md). Best effort.
fn point_current(dir: &Path) {
    let link = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-emu-current");
    let tmp = link.with_extension(format!("{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::os::unix::fs::symlink(dir, &tmp).is_ok() && std::fs::rename(&tmp, &link).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The emulator's `libcuda.so`, built when missing (for child processes:
/// put its folder on `LD_LIBRARY_PATH`).
#[allow(dead_code)]
pub fn library() -> Result<PathBuf, String> {
    build()
}

/// Loads the emulator when there is no real driver (once per process).
/// Returns a line saying which driver the CUDA half runs on.
pub fn install() -> Result<String, String> {
    static DONE: OnceLock<Result<String, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: only probes for the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return Ok("the real NVIDIA driver".into());
        }
        if std::env::var("DS4_CUDA_EMU").is_ok_and(|v| v == "0") {
            return Err("no NVIDIA driver and DS4_CUDA_EMU=0".into());
        }
        let lib = build()?;
        // SAFETY: our emulator; kept loaded for the life of the process so
        // that cudarc's dlopen("libcuda.so") finds it by its soname.
        let l = unsafe { libloading::Library::new(&lib) }
            .map_err(|e| format!("{}: {e}", lib.display()))?;
        std::mem::forget(l);
        Ok(format!("the host emulator {}", lib.display()))
    })
    .clone()
}
