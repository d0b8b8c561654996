//! Just-in-time compilation: NVRTC → CUBIN for the device's exact arch, cached on disk.

mod cache;
mod nvrtc;
mod report;
mod sources;
pub mod trust;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use sha2::{Digest, Sha256};

pub use cache::{DiskCache, Entry};
pub use nvrtc::Nvrtc;
pub use report::ResourceReport;
pub use sources::{source, SOURCES};

use crate::error::{Error, Result};

/// A GPU architecture to compile for, e.g. `sm_90a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability major.
    pub major: u32,
    /// Compute capability minor.
    pub minor: u32,
    /// The arch-specific (`a`) target, needed for wgmma and setmaxnreg on sm_90.
    pub specific: bool,
}

impl Arch {
    /// The target FlashCore compiles for on a device of this compute capability: the
    /// arch-specific one (`sm_90a`, `sm_100a`) where it exists, since the CUBIN is for this
    /// exact device anyway.
    pub fn for_device(major: u32, minor: u32) -> Self {
        Self { major, minor, specific: major >= 9 }
    }

    /// Parses `sm_80`, `sm_90a`, `80`, `90a`.
    pub fn parse(s: &str) -> Option<Self> {
        let digits = s.strip_prefix("sm_").unwrap_or(s);
        let (digits, specific) = match digits.strip_suffix('a') {
            Some(d) => (d, true),
            None => (digits, false),
        };
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u32 = digits.parse().ok()?;
        Some(Self { major: n / 10, minor: n % 10, specific })
    }

    /// The archs `compile --all-archs` and the tests build for.
    pub fn all_supported() -> Vec<Arch> {
        ["sm_80", "sm_86", "sm_89", "sm_90a"].iter().map(|s| Arch::parse(s).unwrap()).collect()
    }

    /// Whether the Hopper instructions (wgmma, TMA, setmaxnreg) are available.
    pub fn is_hopper(&self) -> bool {
        self.major == 9 && self.specific
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}{}{}", self.major, self.minor, if self.specific { "a" } else { "" })
    }
}

/// One kernel variant to compile: a main file under `kernels/`, its entry point, and the
/// `-D` defines that select the variant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// The variant's name (also the CLI's and the cache's).
    pub name: String,
    /// Main file, by include name (`fwd_sm80.cu`).
    pub file: &'static str,
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    /// `(NAME, VALUE)` defines.
    pub defines: Vec<(String, String)>,
}

/// A compiled variant, ready to load.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN image.
    pub cubin: Arc<Vec<u8>>,
    /// The NVRTC log.
    pub log: String,
    /// ptxas's resources for the entry point.
    pub resources: ResourceReport,
    /// Whether it came from the disk cache.
    pub from_cache: bool,
    /// Seconds spent compiling or loading from the cache.
    pub seconds: f64,
}

/// The compiler: NVRTC (loaded on first use) plus the disk cache.
pub struct Jit {
    nvrtc: OnceLock<std::result::Result<Arc<Nvrtc>, String>>,
    cache: DiskCache,
}

impl Jit {
    /// A compiler caching in `cache`.
    pub fn new(cache: DiskCache) -> Self {
        Self { nvrtc: OnceLock::new(), cache }
    }

    /// The cache.
    pub fn cache(&self) -> &DiskCache {
        &self.cache
    }

    /// NVRTC, loaded once.
    pub fn nvrtc(&self) -> Result<Arc<Nvrtc>> {
        self.nvrtc
            .get_or_init(|| Nvrtc::load().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(|msg| Error::NvrtcNotFound(msg.trim_start_matches("NVRTC not found: ").to_string()))
    }

    /// The NVRTC options for `source` on `arch`.
    pub fn options(source: &KernelSource, arch: Arch) -> Vec<String> {
        let mut opts =
            vec![format!("--gpu-architecture={arch}"), "-std=c++17".into(), "-default-device".into(), "--ptxas-options=-v".into()];
        opts.extend(source.defines.iter().map(|(k, v)| format!("-D{k}={v}")));
        opts
    }

    /// The cache key: every input that changes the binary.
    pub fn cache_key(source: &KernelSource, arch: Arch, nvrtc_version: (i32, i32)) -> String {
        cache_key_over(SOURCES, source, arch, nvrtc_version)
    }

    /// Compiles `source` for `arch`, or loads it from the cache.
    pub fn compile(&self, source: &KernelSource, arch: Arch) -> Result<Compiled> {
        let start = Instant::now();
        let nvrtc = self.nvrtc()?;
        let key = Self::cache_key(source, arch, nvrtc.version());
        let (entry, from_cache) = match self.cache.get(&key)? {
            Some(entry) => (entry, true),
            None => {
                let entry = self.compile_uncached(&nvrtc, source, arch)?;
                self.cache.put(&key, &entry)?;
                (entry, false)
            }
        };
        let resources = ResourceReport::parse(&entry.log, source.entry).unwrap_or_default();
        Ok(Compiled { cubin: Arc::new(entry.cubin), log: entry.log, resources, from_cache, seconds: start.elapsed().as_secs_f64() })
    }

    fn compile_uncached(&self, nvrtc: &Nvrtc, source: &KernelSource, arch: Arch) -> Result<Entry> {
        let options = Self::options(source, arch);
        let fail = |log: String| Error::Compile { kernel: source.name.clone(), arch: arch.to_string(), options: options.join(" "), log };
        let main = sources::source(source.file).ok_or_else(|| fail(format!("no kernel source named {}", source.file)))?;
        let out = nvrtc.compile(source.file, main, SOURCES, &options).map_err(&fail)?;
        match out.cubin {
            Some(cubin) => Ok(Entry { cubin, log: out.log }),
            None => Err(fail(out.log)),
        }
    }
}

/// The cache key over an explicit set of sources (the tests edit one to see the key move).
fn cache_key_over(sources: &[(&str, &str)], source: &KernelSource, arch: Arch, nvrtc_version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    for (name, text) in sources {
        for part in [name.as_bytes(), text.as_bytes()] {
            h.update(part);
            h.update([0]);
        }
    }
    h.update(source.file.as_bytes());
    h.update(source.entry.as_bytes());
    for opt in Jit::options(source, arch) {
        h.update(opt.as_bytes());
        h.update([0]);
    }
    h.update(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    let digest = hex::encode(&h.finalize()[..16]);
    format!("{}-{arch}-{digest}", source.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(defines: &[(&str, &str)]) -> KernelSource {
        KernelSource {
            name: "t".into(),
            file: "reference.cu",
            entry: "fc_reference",
            defines: defines.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
        }
    }

    #[test]
    fn arch_parses_and_prints() {
        assert_eq!(Arch::parse("sm_90a").unwrap().to_string(), "sm_90a");
        assert_eq!(Arch::parse("86").unwrap(), Arch { major: 8, minor: 6, specific: false });
        assert_eq!(Arch::for_device(9, 0).to_string(), "sm_90a");
        assert_eq!(Arch::for_device(8, 9).to_string(), "sm_89");
        assert!(Arch::parse("sm_x").is_none());
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let a = Arch::parse("sm_80").unwrap();
        let base = Jit::cache_key(&src(&[("X", "1")]), a, (13, 0));
        assert_eq!(base, Jit::cache_key(&src(&[("X", "1")]), a, (13, 0)));
        assert_ne!(base, Jit::cache_key(&src(&[("X", "2")]), a, (13, 0)));
        assert_ne!(base, Jit::cache_key(&src(&[("X", "1")]), Arch::parse("sm_86").unwrap(), (13, 0)));
        assert_ne!(base, Jit::cache_key(&src(&[("X", "1")]), a, (13, 1)));
    }

    #[test]
    fn cache_key_covers_the_source_text() {
        let a = Arch::parse("sm_80").unwrap();
        let files = [("reference.cu", "kernel A"), ("common/types.cuh", "types")];
        let edited = [("reference.cu", "kernel A"), ("common/types.cuh", "types ")];
        assert_eq!(cache_key_over(&files, &src(&[]), a, (13, 0)), cache_key_over(&files, &src(&[]), a, (13, 0)));
        assert_ne!(cache_key_over(&files, &src(&[]), a, (13, 0)), cache_key_over(&edited, &src(&[]), a, (13, 0)));
    }
}
