//! `flashcore compile`: build every kernel variant ahead of time (no GPU needed) and print
//! registers, shared memory and spills. A spill or a compile error is a failure.

use anyhow::{anyhow, Result};
use flashcore::jit::{Arch, DiskCache, Jit};
use flashcore::{Context, KernelFamily, ScoreMods, Variant};
use rayon::prelude::*;

#[derive(clap::Args)]
pub struct CompileArgs {
    /// Target arch, e.g. sm_90a (default: this GPU's, or all without a GPU).
    #[arg(long)]
    arch: Option<String>,
    /// Every supported arch (sm_80, sm_86, sm_89, sm_90a).
    #[arg(long, conflicts_with = "arch")]
    all_archs: bool,
    /// Only this kernel family.
    #[arg(long)]
    kernel: Option<String>,
    /// Compile into a fresh temporary cache (measures real compile times).
    #[arg(long)]
    no_cache: bool,
    /// Also every forward variant with each score policy: a sliding window, a softcap, both.
    #[arg(long)]
    mods: bool,
    /// Also the varlen form of every variant that has one (fwd_sm80, fwd_sm90, bwd_sm80,
    /// bwd_sm90; with --mods, its policies' varlen forms too).
    #[arg(long)]
    varlen: bool,
    /// Also every fwd_sm80 and fwd_sm90 variant's paged-KV form (and, with --mods, its
    /// policies' paged forms).
    #[arg(long)]
    paged: bool,
    /// Also the chunked-attention form (`_chunk`) of every windowed form selected (with
    /// --mods: chunked attention runs as a window with the chunk's bounds beside it).
    #[arg(long)]
    chunk: bool,
    /// Also the learnable-sinks form (`_sinks`) of every forward variant and policy form
    /// selected (and, with --varlen / --paged, their varlen and paged forms).
    #[arg(long)]
    sinks: bool,
    /// Only the variants of this dtype (f16, bf16 or e4m3).
    #[arg(long)]
    dtype: Option<String>,
    /// Only the variants whose name contains one of these (comma-separated).
    #[arg(long, value_delimiter = ',')]
    filter: Vec<String>,
    /// The variants of these head dims (comma-separated) instead of each family's own sizes:
    /// the Hopper families take every multiple of 8 up to 256 (as the next of their sizes),
    /// fwd_sm80 and bwd_sm80 only their own.
    #[arg(long, value_delimiter = ',')]
    head_dims: Vec<usize>,
    /// Print the cache entry file of every selected variant (`KEY.fcbin`, the key covering
    /// every source, the options and the NVRTC version) instead of compiling: which entries of
    /// a cache folder this binary reads (scripts/sass-check.py checks those alone).
    #[arg(long)]
    keys: bool,
}

/// `v`, and with `mods` its sliding-window, softcap and combined forms where the dispatcher
/// runs them (see `kernels::mods_forms`), with `chunk` the chunked form of each windowed one,
/// with `sinks` the learnable-sinks form of each (a forward kernel's; the reference takes them
/// at run time), with `varlen` the varlen form of each, with `paged` the paged-KV form of
/// each: in the dispatcher's order.
fn with_mods(arch: Arch, v: Variant, args: &CompileArgs) -> Vec<Variant> {
    let forms = if args.mods { flashcore::kernels::mods_forms(&v) } else { Vec::new() };
    let mut dense: Vec<Variant> = std::iter::once(v).chain(forms).collect();
    if args.chunk {
        let chunked: Vec<Variant> =
            dense.iter().filter(|v| v.mods.local).map(|v| flashcore::kernels::with_mods(v, ScoreMods { chunk: true, ..v.mods })).collect();
        dense.extend(chunked);
    }
    if args.sinks {
        // (Not e4m3's: its planner takes no sinks yet.)
        let takes_sinks =
            |v: &&Variant| !v.family.is_backward() && v.family != KernelFamily::Reference && v.dtype != flashcore::DType::E4M3;
        let with_sinks: Vec<Variant> =
            dense.iter().filter(takes_sinks).map(|v| flashcore::kernels::with_mods(v, ScoreMods { sinks: true, ..v.mods })).collect();
        dense.extend(with_sinks);
    }
    let (varlen, paged) = (args.varlen, args.paged);
    let packed = dense.iter().filter(|_| varlen).filter_map(flashcore::kernels::varlen_form);
    let paged_forms: Vec<Variant> = dense.iter().filter(|_| paged).flat_map(|v| flashcore::kernels::paged_forms(arch, v)).collect();
    packed.chain(paged_forms).chain(dense.iter().cloned()).collect()
}

pub fn run(args: &CompileArgs) -> Result<bool> {
    let archs = match (&args.arch, args.all_archs) {
        (Some(a), _) => vec![Arch::parse(a).ok_or_else(|| anyhow!("cannot parse arch {a:?} (try sm_90a)"))?],
        (None, true) => Arch::all_supported(),
        (None, false) => match Context::new(0) {
            Ok(ctx) => vec![ctx.info().arch],
            Err(_) => Arch::all_supported(),
        },
    };
    let families: Vec<KernelFamily> = match &args.kernel {
        Some(n) => vec![KernelFamily::parse(n).ok_or_else(|| anyhow!("unknown kernel {n:?}"))?],
        None => KernelFamily::ALL.to_vec(),
    };
    let dtype = match args.dtype.as_deref() {
        None => None,
        Some(name) => Some(flashcore::DType::parse(name).ok_or_else(|| anyhow!("--dtype {name:?}: f16, bf16 or e4m3"))?),
    };
    let tmp = tempfile::tempdir()?;
    let cache = if args.no_cache { DiskCache::new(tmp.path()) } else { DiskCache::new(DiskCache::default_dir()) };
    // One error for a cache FlashCore refuses (`jit::trust`), not one a variant.
    flashcore::jit::trust::private_dir(cache.dir())?;
    let jit = Jit::new(cache);
    let nvrtc_version = jit.nvrtc()?.version();
    let jobs: Vec<(Arch, Variant)> = archs
        .iter()
        .flat_map(|&a| {
            families.iter().filter(move |f| f.runs_on(a)).flat_map(move |f| {
                let variants = if args.head_dims.is_empty() { f.variants(a) } else { f.variants_of(a, &args.head_dims) };
                variants.into_iter().map(move |v| (a, v))
            })
        })
        .filter(|(_, v)| dtype.is_none_or(|d| v.dtype == d))
        .flat_map(|(a, v)| with_mods(a, v, args).into_iter().map(move |v| (a, v)))
        .filter(|(_, v)| args.filter.is_empty() || args.filter.iter().any(|f| v.name().contains(f.as_str())))
        .collect();
    if args.keys {
        for (arch, v) in &jobs {
            println!("{}.fcbin", Jit::cache_key(&v.source(), *arch, nvrtc_version));
        }
        return Ok(true);
    }
    let results: Vec<_> = jobs.par_iter().map(|(arch, v)| (arch, v, jit.compile(&v.source(), *arch))).collect();
    println!("{:<52} {:<7} {:>5} {:>10} {:>10} {:>7} {:>8}", "variant", "arch", "regs", "smem_dyn", "smem_stat", "spill", "seconds");
    let mut ok = true;
    for (arch, v, r) in &results {
        match r {
            Ok(c) => {
                let spill = c.resources.spill_stores + c.resources.spill_loads;
                let serialized = c.resources.wgmma_serialized;
                ok &= c.resources.is_clean();
                println!(
                    "{:<52} {:<7} {:>5} {:>10} {:>10} {:>7} {:>8.2}{}{}",
                    v.name(),
                    arch.to_string(),
                    c.resources.registers,
                    v.smem_bytes,
                    c.resources.static_smem,
                    spill,
                    c.seconds,
                    if spill > 0 { "  SPILLS" } else { "" },
                    if serialized { "  SERIALIZED (ptxas: wgmma waits for wgmma)" } else { "" }
                );
            }
            Err(e) => {
                ok = false;
                println!("{:<52} {:<7} FAILED: {e}", v.name(), arch.to_string());
            }
        }
    }
    println!("{} variants, {}", results.len(), if ok { "all compiled, no spills, no serialized wgmma" } else { "FAILURES above" });
    Ok(ok)
}
