//! NVRTC, loaded at run time through a small binding of our own (not
//! cudarc's), so the library can be named by path: `DS4_NVRTC` (a file), the
//! usual sonames on the loader path, or the PyPI wheels `nvidia-cuda-nvrtc`
//! (CUDA 13) and `nvidia-cuda-nvrtc-cu12` found through `python3`. CI
//! compiles every kernel with the wheel; a GPU machine needs no toolkit.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};

type Prog = *mut std::ffi::c_void;

/// The NVRTC entry points ds4 uses (stable since CUDA 11.2).
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    num_archs: unsafe extern "C" fn(*mut c_int) -> c_int,
    archs: unsafe extern "C" fn(*mut c_int) -> c_int,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// A loaded NVRTC library.
pub struct Nvrtc {
    api: Api,
    /// Kept alive for the function pointers in `api`.
    _lib: libloading::Library,
    pub path: PathBuf,
    pub version: (i32, i32),
    /// Virtual architectures it can target (`80` = compute_80).
    pub archs: Vec<u32>,
}

/// One compiled module.
pub struct Compiled {
    pub ptx: String,
    /// NVRTC's log (warnings), empty when clean.
    pub log: String,
}

/// Library names tried on the loader path, newest first.
const SONAMES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
];

impl Nvrtc {
    /// Loads NVRTC from `path` (`DS4_NVRTC`), else the loader path, else a
    /// PyPI wheel.
    pub fn load(path: Option<&Path>) -> Result<Nvrtc, String> {
        if let Some(p) = path {
            return Nvrtc::load_from(p);
        }
        let mut tried = Vec::new();
        for name in SONAMES {
            match Nvrtc::load_from(Path::new(name)) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(e),
            }
        }
        for p in wheel_libraries() {
            match Nvrtc::load_from(&p) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(e),
            }
        }
        Err(format!(
            "NVRTC not found (set DS4_NVRTC to libnvrtc.so, install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc`); tried: {}",
            tried.join("; ")
        ))
    }

    /// Loads NVRTC from one file (a path or a soname).
    pub fn load_from(path: &Path) -> Result<Nvrtc, String> {
        // SAFETY: loading NVRTC runs no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the signature is NVRTC's documented C prototype.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{}: {}: {e}",
                        path.display(),
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        let api = Api {
            version: sym!(b"nvrtcVersion\0"),
            num_archs: sym!(b"nvrtcGetNumSupportedArchs\0"),
            archs: sym!(b"nvrtcGetSupportedArchs\0"),
            create: sym!(b"nvrtcCreateProgram\0"),
            compile: sym!(b"nvrtcCompileProgram\0"),
            log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            log: sym!(b"nvrtcGetProgramLog\0"),
            ptx_size: sym!(b"nvrtcGetPTXSize\0"),
            ptx: sym!(b"nvrtcGetPTX\0"),
            destroy: sym!(b"nvrtcDestroyProgram\0"),
            error_string: sym!(b"nvrtcGetErrorString\0"),
        };
        let (mut maj, mut min) = (0, 0);
        // SAFETY: out-pointers to live locals.
        unsafe { (api.version)(&mut maj, &mut min) };
        let mut n = 0;
        // SAFETY: as above; the array is sized by the count NVRTC reported.
        let archs = unsafe {
            (api.num_archs)(&mut n);
            let mut v = vec![0 as c_int; n.max(0) as usize];
            (api.archs)(v.as_mut_ptr());
            v
        };
        Ok(Nvrtc {
            api,
            _lib: lib,
            path: path.to_path_buf(),
            version: (maj, min),
            archs: archs.into_iter().map(|a| a as u32).collect(),
        })
    }

    /// The architecture to compile for on a device of compute capability
    /// `cc` (`121` for 12.1): itself if NVRTC knows it, else the newest
    /// older one (PTX is JIT-compiled forward by the driver).
    pub fn arch_for(&self, cc: u32) -> Option<u32> {
        self.archs.iter().copied().filter(|&a| a <= cc).max()
    }

    fn err(&self, code: c_int) -> String {
        // SAFETY: NVRTC returns a static string for any code.
        let s = unsafe { CStr::from_ptr((self.api.error_string)(code)) };
        s.to_string_lossy().into_owned()
    }

    /// Compiles `source` (file name `name` in messages) to PTX for
    /// `compute_<arch>`. Warnings are errors: the kernels are compiled in CI
    /// with exactly these options.
    pub fn compile(&self, name: &str, source: &str, arch: u32) -> Result<Compiled, String> {
        let src = CString::new(source).map_err(|_| format!("{name}: NUL byte in source"))?;
        let cname = CString::new(name).map_err(|_| format!("{name}: NUL byte in name"))?;
        let opts: Vec<CString> = compile_options(arch)
            .into_iter()
            .map(|o| CString::new(o).expect("option has no NUL"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers; `prog` is destroyed below.
        let rc = unsafe {
            (self.api.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(format!("{name}: nvrtcCreateProgram: {}", self.err(rc)));
        }
        // SAFETY: `prog` was created above; buffers are sized by NVRTC.
        let out = unsafe {
            let rc = (self.api.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let mut n = 0usize;
            (self.api.log_size)(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            (self.api.log)(prog, log.as_mut_ptr() as *mut c_char);
            let log = c_buf(&log);
            if rc != 0 {
                Err(format!("{name} (compute_{arch}): {}\n{log}", self.err(rc)))
            } else {
                let mut n = 0usize;
                (self.api.ptx_size)(prog, &mut n);
                let mut ptx = vec![0u8; n.max(1)];
                (self.api.ptx)(prog, ptx.as_mut_ptr() as *mut c_char);
                Ok(Compiled {
                    ptx: c_buf(&ptx),
                    log,
                })
            }
        };
        // SAFETY: destroys the program created above, once.
        unsafe { (self.api.destroy)(&mut prog) };
        out
    }
}

/// NVRTC options for `compute_<arch>`: warnings as errors, IEEE division and
/// square root (the CPU twins are the reference), no fast-math.
pub fn compile_options(arch: u32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{arch}"),
        "--std=c++17".into(),
        "-Werror=all-warnings".into(),
        "--fmad=true".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
    ]
}

fn c_buf(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// libnvrtc inside the PyPI wheels of the `python3` on the path.
fn wheel_libraries() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; [print(os.path.join(p, d, 'lib')) for p in nvidia.__path__ for d in ('cu13', 'cuda_nvrtc')]",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else { return Vec::new() };
    let mut found = Vec::new();
    for dir in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc.so"))
            })
            .collect();
        libs.sort();
        found.extend(libs);
    }
    found
}
