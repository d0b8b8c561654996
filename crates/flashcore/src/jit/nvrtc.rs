//! NVRTC, loaded at run time: discovery of `libnvrtc` and the eight calls FlashCore makes.
//!
//! Loading by hand (rather than through a fixed library name) lets us look where NVRTC
//! actually lives on ML machines: the CUDA toolkit, the loader path, and Python's
//! `nvidia-cuda-nvrtc` wheel (also pulled in by PyTorch) in the usual environments or in
//! whichever Python `python3` is. When none has it, the error lists every place searched.

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

/// The `nvidia-cuda-nvrtc` wheels' layouts inside a site-packages folder, newest first: the
/// CUDA 13 wheels keep every library in `nvidia/cu13/lib`.
const WHEEL_FILES: &[&str] = &["nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cu12/lib/libnvrtc.so.12"];
/// The folders of `WHEEL_FILES`, as the not-found error names them.
const WHEEL_DIRS: &str = "nvidia/{cu13,cuda_nvrtc,cu12}/lib";
/// The CUDA toolkit's library folders under its root.
const TOOLKIT_DIRS: &[&str] = &["lib64", "lib", "targets/x86_64-linux/lib"];

/// One place NVRTC may be: the files tried there, in order, and how the not-found error
/// names it. A bare soname is for the dynamic loader to resolve.
#[derive(Debug)]
struct Place {
    name: String,
    files: Vec<PathBuf>,
}

impl Place {
    fn toolkit(root: &Path) -> Self {
        let files = TOOLKIT_DIRS.iter().flat_map(|d| SONAMES.iter().map(move |s| root.join(d).join(s))).collect();
        Self { name: format!("{}/{{{}}}", root.display(), TOOLKIT_DIRS.join(",")), files }
    }

    fn site_packages(site: &Path, by: &str) -> Self {
        Self { name: format!("{}/{WHEEL_DIRS}{by}", site.display()), files: WHEEL_FILES.iter().map(|f| site.join(f)).collect() }
    }

    fn nothing(name: String) -> Self {
        Self { name, files: Vec::new() }
    }
}

/// Where the search looks, in order: CUDA toolkits, the dynamic loader's path, the
/// site-packages of the Python environments under `python_roots` (`lib/python3*/`), and
/// last, for NVRTC installed into a Python that is none of those (`pip install --user`, a
/// pyenv or system Python), the site-packages that `python3` reports. Asking it costs a
/// process start, so it is asked only when every other place failed.
struct Search {
    cuda_roots: Vec<PathBuf>,
    loader: bool,
    python_roots: Vec<PathBuf>,
    python3: PathBuf,
}

/// Prints a Python's site-packages folders, one per line (`getsitepackages` is missing in
/// virtualenvs older than 20).
const PRINT_SITE_PACKAGES: &str = "import site; print(*getattr(site, 'getsitepackages', list)(), site.getusersitepackages(), sep='\\n')";

impl Search {
    /// The places of this process's environment: `$CUDA_HOME`, `$CUDA_PATH`,
    /// `/usr/local/cuda`; the loader; `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `./.venv`, `~/.local`,
    /// `/usr/local`, `/usr`; the `python3` on `PATH`.
    fn from_env() -> Self {
        let vars = |names: [&'static str; 2]| names.into_iter().filter_map(std::env::var_os).map(PathBuf::from);
        let cuda_roots = vars(["CUDA_HOME", "CUDA_PATH"]).chain([PathBuf::from("/usr/local/cuda")]).collect();
        let mut python_roots: Vec<PathBuf> = vars(["VIRTUAL_ENV", "CONDA_PREFIX"]).collect();
        python_roots.extend(std::env::current_dir().ok().map(|d| d.join(".venv")));
        python_roots.extend(dirs::home_dir().map(|h| h.join(".local")));
        python_roots.extend(["/usr/local", "/usr"].map(PathBuf::from));
        Self { cuda_roots: unique(cuda_roots), loader: true, python_roots: unique(python_roots), python3: "python3".into() }
    }

    /// Every place but `python3`'s, and the site-packages folders among them.
    fn cheap_places(&self) -> (Vec<Place>, Vec<PathBuf>) {
        let mut places: Vec<Place> = self.cuda_roots.iter().map(|r| Place::toolkit(r)).collect();
        if self.loader {
            let name = format!("{} on the dynamic loader's path (LD_LIBRARY_PATH, /etc/ld.so.cache)", SONAMES.join(", "));
            places.push(Place { name, files: SONAMES.iter().map(PathBuf::from).collect() });
        }
        let mut sites = Vec::new();
        for root in &self.python_roots {
            let found = site_packages_under(root);
            if found.is_empty() {
                places.push(Place::nothing(format!("{}/lib/python3*/site-packages: no such folder", root.display())));
            }
            places.extend(found.iter().map(|s| Place::site_packages(s, "")));
            sites.extend(found);
        }
        (places, sites)
    }

    /// The site-packages of `python3` not among `searched`.
    fn python3_places(&self, searched: &[PathBuf]) -> Vec<Place> {
        let by = format!(" ({} on PATH)", self.python3.display());
        match python_site_packages(&self.python3) {
            Err(e) => vec![Place::nothing(format!("the site-packages of {} on PATH: {e}", self.python3.display()))],
            Ok(sites) => {
                let new: Vec<Place> = sites.iter().filter(|s| !searched.contains(s)).map(|s| Place::site_packages(s, &by)).collect();
                if new.is_empty() {
                    return vec![Place::nothing(format!("the site-packages of {} on PATH: listed above", self.python3.display()))];
                }
                new
            }
        }
    }

    /// Loads the first NVRTC found, asking `python3` only when the other places failed.
    fn load(&self) -> Result<Nvrtc> {
        let (cheap, sites) = self.cheap_places();
        let python3 = std::iter::once_with(|| self.python3_places(&sites)).flatten();
        let (mut searched, mut failed) = (Vec::new(), Vec::new());
        for place in cheap.into_iter().chain(python3) {
            for path in &place.files {
                let bare = path.parent().is_some_and(|p| p.as_os_str().is_empty());
                if !bare && !path.exists() {
                    continue;
                }
                match unsafe { Nvrtc::load_from(path) } {
                    Ok(n) => return Ok(n),
                    // The loader knows no such library: the place is listed, that is enough.
                    Err(libloading::Error::DlOpen { .. }) if bare => {}
                    Err(e) => failed.push(format!("{}: {e}", path.display())),
                }
            }
            searched.push(place.name);
        }
        Err(Error::NvrtcNotFound(not_found(&searched, &failed)))
    }
}

const FIX: &str = "fix: `pip install nvidia-cuda-nvrtc` (or install the CUDA toolkit), or set FLASHCORE_NVRTC=/path/to/libnvrtc.so";
const FIX_EXPLICIT: &str = "fix: point FLASHCORE_NVRTC at a loadable libnvrtc.so, or unset it to search the usual places";

/// The not-found error's text: every place searched and every library that failed to
/// load, one per line, then the fix.
fn not_found(searched: &[String], failed: &[String]) -> String {
    let mut msg = String::from("no loadable libnvrtc in any of these places:\n");
    for place in searched {
        msg += &format!("  {place}\n");
    }
    if !failed.is_empty() {
        msg += "found but not loadable:\n";
        for f in failed {
            msg += &format!("  {f}\n");
        }
    }
    msg + FIX
}

/// The site-packages (or Debian's dist-packages) folders of the Pythons under `root/lib`.
fn site_packages_under(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root.join("lib")) else { return Vec::new() };
    let mut pythons: Vec<PathBuf> =
        entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("python3")).map(|e| e.path()).collect();
    pythons.sort();
    pythons.iter().flat_map(|p| [p.join("site-packages"), p.join("dist-packages")]).filter(|s| s.is_dir()).collect()
}

/// What `python` reports as its site-packages folders (the user's included), or why it
/// could not say.
fn python_site_packages(python: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    let out = std::process::Command::new(python)
        .args(["-c", PRINT_SITE_PACKAGES])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("it failed ({}): {}", out.status, stderr.trim().lines().last().unwrap_or("")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(PathBuf::from).collect())
}

fn unique(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

impl Nvrtc {
    /// Loads `$FLASHCORE_NVRTC` when set, else the first NVRTC found (see `Search`); the
    /// error lists every place searched and how to install it.
    pub fn load() -> Result<Self> {
        if let Some(path) = std::env::var_os("FLASHCORE_NVRTC") {
            let path = PathBuf::from(path);
            return unsafe { Self::load_from(&path) }
                .map_err(|e| Error::NvrtcNotFound(format!("FLASHCORE_NVRTC={}: {e}\n{FIX_EXPLICIT}", path.display())));
        }
        Search::from_env().load()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `python3` that reports `sites` as its site-packages, under `dir`; it leaves
    /// `dir/python3-asked` behind when run.
    fn fake_python3(dir: &Path, sites: &[&Path]) -> PathBuf {
        let path = dir.join("python3");
        let lines: String = sites.iter().map(|s| format!("echo '{}'\n", s.display())).collect();
        std::fs::write(&path, format!("#!/bin/sh\ntouch '{}'\n{lines}", dir.join("python3-asked").display())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// `path`, with its folders made.
    fn made(path: PathBuf) -> PathBuf {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    }

    /// A search of `python_roots` and `python3` alone: no toolkit, no loader path.
    fn search(python_roots: Vec<PathBuf>, python3: PathBuf) -> Search {
        Search { cuda_roots: Vec::new(), loader: false, python_roots, python3 }
    }

    fn files(places: &[Place]) -> Vec<&Path> {
        places.iter().flat_map(|p| p.files.iter().map(PathBuf::as_path)).collect()
    }

    #[test]
    fn the_site_packages_of_python3_are_candidates() {
        let dir = tempfile::tempdir().unwrap();
        let (site, user) = (dir.path().join("site"), dir.path().join("user"));
        let s = search(Vec::new(), fake_python3(dir.path(), &[&site, &user]));
        let places = s.python3_places(&[]);
        for wheel_dir in [&site, &user] {
            assert!(files(&places).contains(&wheel_dir.join("nvidia/cu13/lib/libnvrtc.so.13").as_path()), "{places:?}");
            assert!(files(&places).contains(&wheel_dir.join("nvidia/cu12/lib/libnvrtc.so.12").as_path()), "{places:?}");
        }
        let again = s.python3_places(std::slice::from_ref(&site));
        assert!(!files(&again).iter().any(|f| f.starts_with(&site)), "a folder searched already is not searched twice");
    }

    #[test]
    fn python3_is_asked_when_the_other_places_failed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("venv");
        let lib = made(root.join("lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"));
        std::fs::write(&lib, b"not a library").unwrap();
        let err = search(vec![root], fake_python3(dir.path(), &[])).load().err().unwrap().to_string();
        assert!(dir.path().join("python3-asked").exists(), "{err}");
        assert!(err.contains(&format!("found but not loadable:\n  {}: ", lib.display())), "{err}");
    }

    #[test]
    fn not_found_names_every_place_searched_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let (venv, empty, py3_site) = (dir.path().join("venv"), dir.path().join("empty"), dir.path().join("py3-site"));
        std::fs::create_dir_all(venv.join("lib/python3.11/site-packages")).unwrap();
        let mut s = search(vec![venv.clone(), empty.clone()], fake_python3(dir.path(), &[&py3_site]));
        s.cuda_roots.push(dir.path().join("cuda"));
        let err = s.load().err().unwrap().to_string();
        let python3 = dir.path().join("python3");
        let expected = format!(
            "NVRTC not found: no loadable libnvrtc in any of these places:\n\
             \x20 {d}/cuda/{{lib64,lib,targets/x86_64-linux/lib}}\n\
             \x20 {d}/venv/lib/python3.11/site-packages/nvidia/{{cu13,cuda_nvrtc,cu12}}/lib\n\
             \x20 {d}/empty/lib/python3*/site-packages: no such folder\n\
             \x20 {d}/py3-site/nvidia/{{cu13,cuda_nvrtc,cu12}}/lib ({p} on PATH)\n\
             fix: `pip install nvidia-cuda-nvrtc` (or install the CUDA toolkit), or set FLASHCORE_NVRTC=/path/to/libnvrtc.so",
            d = dir.path().display(),
            p = python3.display(),
        );
        assert_eq!(err, expected);
    }

    #[test]
    fn a_python3_that_cannot_run_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-python3");
        let places = search(Vec::new(), missing.clone()).python3_places(&[]);
        assert_eq!(places.len(), 1);
        assert!(places[0].name.starts_with(&format!("the site-packages of {} on PATH: cannot run it: ", missing.display())), "{places:?}");
    }

    /// NVRTC installed into a Python the other places miss is loaded through `python3`, and
    /// NVRTC in a cheaper place leaves `python3` unasked (with the real library of
    /// `$FLASHCORE_NVRTC`, where the test run has one).
    #[test]
    fn nvrtc_is_loaded_from_python3_site_packages_and_python3_asked_only_then() {
        let Some(real) = std::env::var_os("FLASHCORE_NVRTC") else { return };
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("user-site");
        let lib = made(site.join("nvidia/cu13/lib/libnvrtc.so.13"));
        std::os::unix::fs::symlink(&real, &lib).unwrap();
        let python3 = fake_python3(dir.path(), &[&site]);
        assert_eq!(search(Vec::new(), python3.clone()).load().unwrap().path(), lib);
        assert!(dir.path().join("python3-asked").exists());

        std::fs::remove_file(dir.path().join("python3-asked")).unwrap();
        let root = dir.path().join("venv");
        let venv_lib = made(root.join("lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"));
        std::os::unix::fs::symlink(&real, &venv_lib).unwrap();
        assert_eq!(search(vec![root], python3).load().unwrap().path(), venv_lib);
        assert!(!dir.path().join("python3-asked").exists(), "python3 was asked though a cheaper place had NVRTC");
    }
}
