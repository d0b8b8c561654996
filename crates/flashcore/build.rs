//! Embeds every CUDA file under `src/kernels/` (each family's `.cu` beside its host `.rs`,
//! the shared headers in `common/` and `ptx/`) into the library, so NVRTC gets the sources
//! (and headers, by their include names) without a file system, and the published crate
//! carries them.

use std::{env, fs, path::Path};

fn collect(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir).expect("src/kernels/ is readable").flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, root, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")) {
            let name = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            out.push((name, path.canonicalize().unwrap().to_string_lossy().into_owned()));
        }
    }
}

fn main() {
    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap();
    let kernels = Path::new(&manifest).join("src/kernels");
    println!("cargo:rerun-if-changed={}", kernels.display());
    let mut files = Vec::new();
    collect(&kernels, &kernels, &mut files);
    let mut code = String::from("/// Every kernel source and header: (include name, text).\npub static SOURCES: &[(&str, &str)] = &[\n");
    for (name, path) in &files {
        code += &format!("    ({name:?}, include_str!({path:?})),\n");
    }
    code += "];\n";
    fs::write(Path::new(&env::var("OUT_DIR").unwrap()).join("kernel_sources.rs"), code).unwrap();
}
