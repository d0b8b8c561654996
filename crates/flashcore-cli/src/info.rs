//! `flashcore info`: the GPU, NVRTC, the cache, and the kernels for this arch. Works
//! without a GPU and says so.

use anyhow::Result;
use flashcore::jit::{DiskCache, Jit};
use flashcore::{Context, KernelFamily, ProblemShape};

pub fn run() -> Result<bool> {
    let device = match Context::new(0) {
        Ok(ctx) => {
            let i = ctx.info();
            println!("GPU            {} (device {})", i.name, i.ordinal);
            println!("arch           {} (compute capability {}.{})", i.arch, i.compute_capability.0, i.compute_capability.1);
            println!("SMs            {}", i.sm_count);
            println!("memory         {:.1} GiB", i.memory_bytes as f64 / (1u64 << 30) as f64);
            println!("L2             {} MiB", i.l2_bytes >> 20);
            println!("smem/block     {} KiB (opt-in)", i.max_smem_per_block >> 10);
            println!("driver CUDA    {}.{}", i.driver_version / 1000, i.driver_version % 1000 / 10);
            Some(i.device())
        }
        Err(e) => {
            println!("GPU            none: {e}");
            None
        }
    };
    let jit = Jit::new(DiskCache::new(DiskCache::default_dir()));
    match jit.nvrtc() {
        Ok(n) => println!("NVRTC          {}.{} from {}", n.version().0, n.version().1, n.path().display()),
        Err(e) => println!("NVRTC          {e}"),
    }
    let dir = jit.cache().dir();
    match flashcore::jit::trust::check_private(dir) {
        Ok(()) => println!("cache dir      {}", dir.display()),
        Err(flashcore::Error::Io { .. }) => println!("cache dir      {} (not created yet)", dir.display()),
        Err(e) => println!("cache dir      {} REFUSED: {e}", dir.display()),
    }
    match device {
        Some(device) => {
            let arch = device.arch;
            for family in KernelFamily::ALL.into_iter().filter(|f| f.runs_on(arch)) {
                let mut dims = family.head_dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join("/");
                if family.takes_head_dim(8) {
                    dims.push_str(", and the other multiples of 8 up to 256 as the next of these");
                }
                let default: Vec<String> = family
                    .head_dims()
                    .iter()
                    .filter(|&&d| flashcore::dispatch::default_family(&device, &prefill(d)) == family)
                    .map(|d| d.to_string())
                    .collect();
                let tag = if default.is_empty() { String::new() } else { format!(" (default for D {})", default.join("/")) };
                println!("kernel         {family}{tag}: head dims {dims}, {} variants", family.variants(arch).len());
            }
            let decode = ProblemShape { seqlen_q: 1, heads_kv: 8, ..prefill(128) };
            println!("decode         {} (split-KV, GQA heads packed as rows)", flashcore::dispatch::default_family(&device, &decode));
        }
        None => println!("kernels        (need a GPU to say which run here; `flashcore compile --all-archs` builds them all)"),
    }
    Ok(true)
}

/// A prefill-sized problem: the kind the default-kernel line of `info` speaks of.
fn prefill(head_dim: usize) -> ProblemShape {
    ProblemShape { batch: 1, seqlen_q: 4096, seqlen_k: 4096, heads_q: 32, heads_kv: 32, head_dim, head_dim_v: head_dim }
}
