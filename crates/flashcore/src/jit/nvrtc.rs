//! NVRTC, loaded at run time: discovery of `libnvrtc` and the eight calls FlashCore makes.
//!
//! Loading by hand (rather than through a fixed library name) lets us look where NVRTC
//! actually lives on ML machines: the CUDA toolkit, the loader path, and Python's
//! `nvidia-cuda-nvrtc` wheel (also pulled in by PyTorch).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

type Program = *mut c_void;
type Status = c_int;

/// A loaded `libnvrtc` with the functions FlashCore uses.
pub struct Nvrtc {
    _lib: libloading::Library,
    /// NVRTC's builtins, loaded from beside it when found there (see `load_from`).
    _builtins: Option<libloading::Library>,
    path: PathBuf,
    version: (i32, i32),
    create: unsafe extern "C" fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

// SAFETY: NVRTC is thread-safe for distinct programs; the function pointers are immutable.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

/// What one NVRTC compilation produced.
pub struct CompileOutput {
    /// The CUBIN image, `None` when compilation failed.
    pub cubin: Option<Vec<u8>>,
    /// The compiler log (includes the ptxas report with `-Xptxas -v`).
    pub log: String,
}

const SONAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Where we look, in order. Every candidate is a full path except the bare sonames,
/// which the dynamic loader resolves (`LD_LIBRARY_PATH`, ldconfig).
pub fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("FLASHCORE_NVRTC") {
        return vec![PathBuf::from(p)];
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.extend([root.join("lib64"), root.join("lib"), root.join("targets/x86_64-linux/lib")]);
        }
    }
    dirs.extend([PathBuf::from("/usr/local/cuda/lib64"), PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib")]);
    let mut out: Vec<PathBuf> = dirs.iter().flat_map(|d| SONAMES.iter().map(move |s| d.join(s))).collect();
    out.extend(SONAMES.iter().map(PathBuf::from));
    for site in python_site_dirs() {
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib", "nvidia/cu12/lib"] {
            out.extend(SONAMES.iter().map(|s| site.join(sub).join(s)));
        }
    }
    out
}

/// Python site-packages folders that may hold the `nvidia-cuda-nvrtc` wheel: active
/// virtual environments, a project-local `.venv`, and the user's and system's.
fn python_site_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    roots.push(PathBuf::from(".venv"));
    if let Some(home) = dirs::home_dir() {
        roots.push(home.join(".local"));
    }
    roots.extend(["/usr/local", "/usr"].map(PathBuf::from));
    let mut sites = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("lib")) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                sites.extend([e.path().join("site-packages"), e.path().join("dist-packages")]);
            }
        }
    }
    sites
}

impl Nvrtc {
    /// Loads the first NVRTC found; the error lists where we looked and how to install it.
    pub fn load() -> Result<Self> {
        let mut tried = Vec::new();
        for path in candidates() {
            if path.is_absolute() && !path.exists() {
                continue;
            }
            match unsafe { Self::load_from(&path) } {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(Error::NvrtcNotFound(format!(
            "no loadable libnvrtc (looked in $FLASHCORE_NVRTC, $CUDA_HOME, /usr/local/cuda, the loader path and Python site-packages{}). \
             Install it with `pip install nvidia-cuda-nvrtc` (or the CUDA toolkit), or point FLASHCORE_NVRTC at libnvrtc.so",
            if tried.is_empty() { String::new() } else { format!("; failed: {}", tried.join("; ")) }
        )))
    }

    /// # Safety
    /// `path` must be a genuine libnvrtc: its symbols are called with NVRTC's C signatures.
    unsafe fn load_from(path: &Path) -> std::result::Result<Self, libloading::Error> {
        let lib = libloading::Library::new(path)?;
        let version: libloading::Symbol<unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status> = lib.get(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        version(&mut major, &mut minor);
        // NVRTC opens `libnvrtc-builtins.so.<major>.<minor>` by name when it compiles; some
        // wheels' NVRTC (13.0, the one PyTorch's CUDA 13 wheels bring) does not look in its own
        // folder, so without a CUDA toolkit on the loader path every compile failed. Loaded
        // here from beside libnvrtc, the loader finds it by its soname.
        let builtins = path.parent().map(|dir| dir.join(format!("libnvrtc-builtins.so.{major}.{minor}"))).filter(|p| p.exists());
        let builtins = match builtins {
            Some(p) => Some(libloading::Library::new(p)?),
            None => None,
        };
        let n = Nvrtc {
            _builtins: builtins,
            path: path.to_path_buf(),
            version: (major, minor),
            create: *lib.get(b"nvrtcCreateProgram\0")?,
            compile: *lib.get(b"nvrtcCompileProgram\0")?,
            log_size: *lib.get(b"nvrtcGetProgramLogSize\0")?,
            log: *lib.get(b"nvrtcGetProgramLog\0")?,
            cubin_size: *lib.get(b"nvrtcGetCUBINSize\0")?,
            cubin: *lib.get(b"nvrtcGetCUBIN\0")?,
            destroy: *lib.get(b"nvrtcDestroyProgram\0")?,
            error_string: *lib.get(b"nvrtcGetErrorString\0")?,
            _lib: lib,
        };
        Ok(n)
    }

    /// The path the library was loaded from (a bare soname when the loader found it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's `(major, minor)` version.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn check(&self, status: Status, what: &str) -> std::result::Result<(), String> {
        if status == 0 {
            return Ok(());
        }
        let msg = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy();
        Err(format!("{what}: {msg}"))
    }

    /// Compiles `source` (named `name`) with in-memory `headers` `(include name, text)`.
    /// `Err` is for failures of NVRTC itself; a rejected program is `Ok` with no CUBIN.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> std::result::Result<CompileOutput, String> {
        let cstr = |s: &str| CString::new(s).map_err(|_| format!("NUL byte in {s:?}"));
        let (c_src, c_name) = (cstr(source)?, cstr(name)?);
        let c_hdr: Vec<CString> = headers.iter().map(|h| cstr(h.1)).collect::<std::result::Result<_, _>>()?;
        let c_inc: Vec<CString> = headers.iter().map(|h| cstr(h.0)).collect::<std::result::Result<_, _>>()?;
        let c_opt: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<std::result::Result<_, _>>()?;
        let p_hdr: Vec<*const c_char> = c_hdr.iter().map(|c| c.as_ptr()).collect();
        let p_inc: Vec<*const c_char> = c_inc.iter().map(|c| c.as_ptr()).collect();
        let p_opt: Vec<*const c_char> = c_opt.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        unsafe {
            self.check(
                (self.create)(&mut prog, c_src.as_ptr(), c_name.as_ptr(), p_hdr.len() as c_int, p_hdr.as_ptr(), p_inc.as_ptr()),
                "nvrtcCreateProgram",
            )?;
            let status = (self.compile)(prog, p_opt.len() as c_int, p_opt.as_ptr());
            let result = self.collect(prog, status);
            (self.destroy)(&mut prog);
            result
        }
    }

    unsafe fn collect(&self, prog: Program, status: Status) -> std::result::Result<CompileOutput, String> {
        let mut n = 0usize;
        self.check((self.log_size)(prog, &mut n), "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; n.max(1)];
        self.check((self.log)(prog, buf.as_mut_ptr().cast()), "nvrtcGetProgramLog")?;
        let log = String::from_utf8_lossy(&buf[..n.saturating_sub(1)]).into_owned();
        if status != 0 {
            return Ok(CompileOutput { cubin: None, log });
        }
        self.check((self.cubin_size)(prog, &mut n), "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; n];
        self.check((self.cubin)(prog, cubin.as_mut_ptr().cast()), "nvrtcGetCUBIN")?;
        Ok(CompileOutput { cubin: Some(cubin), log })
    }
}
