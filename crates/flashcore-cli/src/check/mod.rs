//! `flashcore check`: the correctness suite (DESIGN §5) for every kernel on this GPU.

mod bwd;
mod paged;
mod varlen;
mod varlen_bwd;

use anyhow::{bail, Result};
use cudarc::driver::CudaSlice;
use flashcore::reference::RefMask;
use flashcore::{reference, AttnParams, Context, DType, DeviceTensor, KernelFamily, TensorViewMut, Window};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

use crate::cases::{errors, random_qkv, Case, HostQkv, Inputs, Storage, Stored};

/// Above this many multiply-adds the f64 CPU oracle is too slow; the GPU reference kernel
/// (itself checked against the CPU oracle on the small cases) takes over.
const CPU_REFERENCE_MAX_WORK: usize = 20_000_000_000;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// A few cases per kernel.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// One small case per variant (for compute-sanitizer runs).
    #[arg(long, conflicts_with_all = ["full", "quick"])]
    smoke: bool,
    /// Every case (the default).
    #[arg(long)]
    full: bool,
    /// Only this kernel family (reference, fwd_sm80, ...).
    #[arg(long)]
    kernel: Option<String>,
    /// Only this group of cases: forward (dense), varlen, paged or backward.
    #[arg(long, value_parser = ["forward", "varlen", "paged", "backward"])]
    only: Option<String>,
    /// Only part K of N of the cases (`K/N`, 1 <= K <= N: every N-th case from the K-th), so
    /// that a long run can be split over several calls; parts 1..N of one N are the whole run.
    #[arg(long, value_parser = parse_part)]
    part: Option<Part>,
}

/// A share of a run's cases (`--part K/N`): the cases whose index in the run is K - 1 mod N.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Part {
    k: usize,
    n: usize,
}

fn parse_part(s: &str) -> std::result::Result<Part, String> {
    let bad = || format!("{s:?}: want K/N with 1 <= K <= N, e.g. 2/3");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (k.trim().parse::<usize>().map_err(|_| bad())?, n.trim().parse::<usize>().map_err(|_| bad())?);
    if k == 0 || k > n {
        return Err(bad());
    }
    Ok(Part { k, n })
}

/// Keeps a part's cases of lists taken in run order (the index runs on across lists).
struct PartFilter {
    part: Option<Part>,
    next: usize,
}

impl PartFilter {
    fn take<T>(&mut self, cases: Vec<T>) -> Vec<T> {
        let start = self.next;
        self.next += cases.len();
        let keep = |i: usize| self.part.map_or(true, |p| (start + i) % p.n == p.k - 1);
        cases.into_iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, c)| c).collect()
    }
}

#[derive(Clone)]
struct Spec {
    case: Case,
    inputs: Inputs,
    storage: Storage,
    /// Forced split-KV count (`None`: the dispatcher's choice).
    splits: Option<usize>,
    /// Softmax scale (`None`: 1/sqrt(D)).
    scale: Option<f32>,
    /// Sliding window (`Window::UNBOUNDED`: none).
    window: Window,
    /// Logit softcap (0: off).
    softcap: f32,
}

impl Spec {
    fn new(case: Case, inputs: Inputs, storage: Storage) -> Self {
        Self { case, inputs, storage, splits: None, scale: None, window: Window::UNBOUNDED, softcap: 0.0 }
    }

    fn with_mods(case: Case, inputs: Inputs, window: Window, softcap: f32) -> Self {
        Self { window, softcap, ..Self::new(case, inputs, Storage::Bshd) }
    }

    fn scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.case.head_dim as f32).sqrt())
    }
}

/// One case's result (the backward's too: `check_bwd`).
pub struct Outcome {
    pub spec_name: String,
    pub kernel: KernelFamily,
    pub oracle: &'static str,
    pub rel: f64,
    pub max_abs: f64,
    pub lse_err: f64,
    pub deterministic: bool,
    pub failure: Option<String>,
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    Smoke,
    Quick,
    Full,
}

fn specs(family: KernelFamily, depth: Depth) -> Vec<Spec> {
    if depth == Depth::Smoke {
        let mut out = Vec::new();
        for dtype in [DType::BF16, DType::F16] {
            for &d in family.head_dims() {
                for causal in [false, true] {
                    out.push(Spec::new(Case::new(1, 130, 200, 4, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd));
                    // Unscaled large logits: a row's max jumps by hundreds of log2 units, which takes
                    // fwd_sm90's softmax fallbacks (lift, and warp_qk's rescore past f32's range).
                    let case = Case::new(1, 130, 600, 4, 2, d, causal, dtype);
                    out.push(Spec { scale: Some(1.0), ..Spec::new(case, Inputs::LargeLogits, Storage::Bshd) });
                    // Decode: GQA packing and, in fwd_sm80, split-KV with its combine pass.
                    out.push(Spec::new(Case::new(2, 1, 1000, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd));
                    // The score policies' variants: a window, a softcap, both.
                    let case = || Case::new(1, 130, 600, 4, 2, d, causal, dtype);
                    out.push(Spec::with_mods(case(), Inputs::Normal, Window::new(100, 20), 0.0));
                    out.push(Spec::with_mods(case(), Inputs::LargeLogits, Window::UNBOUNDED, 30.0));
                    out.push(Spec::with_mods(case(), Inputs::LargeLogits, Window::new(50, -1), 50.0));
                }
            }
        }
        return out;
    }
    let quick = depth == Depth::Quick;
    let lengths: &[(usize, usize)] = if quick {
        &[(1, 1), (113, 113), (1000, 1000), (7, 1000)]
    } else {
        &[(1, 1), (7, 7), (113, 113), (1000, 1000), (4097, 4097), (1, 4097), (113, 1000), (1000, 113), (7, 4097), (256, 128)]
    };
    let head_dims: Vec<usize> =
        if quick { family.head_dims().iter().copied().filter(|&d| d == 64 || d == 128).collect() } else { family.head_dims().to_vec() };
    let mut out = Vec::new();
    let mut n = 0usize;
    for dtype in [DType::BF16, DType::F16] {
        for &d in &head_dims {
            for causal in [false, true] {
                for &(sq, sk) in lengths {
                    // Long sequences only at one head count, to bound the oracle's time.
                    let big = sq.max(sk) > 2000;
                    if big && (d != 128 && d != 64) {
                        continue;
                    }
                    let (hkv, ratio) = [(2, 1), (1, 4), (1, 8)][n % 3];
                    n += 1;
                    let batch = if big { 1 } else { 2 };
                    let case = Case::new(batch, sq, sk, hkv * ratio, hkv, d, causal, dtype);
                    let storage = if n % 5 == 0 { Storage::Bhsd } else { Storage::Bshd };
                    out.push(Spec::new(case, Inputs::Normal, storage));
                }
                // Adversarial inputs, one shape each; large logits also unscaled, where a row's max
                // jumps past f32's exp2 range (fwd_sm90 recomputes those scores: warp_qk).
                for inputs in [Inputs::LargeLogits, Inputs::IdenticalKeys] {
                    let case = Case::new(1, 200, 300, 4, 2, d, causal, dtype);
                    out.push(Spec::new(case, inputs, Storage::Bshd));
                }
                let case = Case::new(1, 200, 300, 4, 2, d, causal, dtype);
                out.push(Spec { scale: Some(1.0), ..Spec::new(case, Inputs::LargeLogits, Storage::Bshd) });
                out.push(Spec::new(Case::new(1, 200, 1000, 4, 2, d, causal, dtype), Inputs::RisingLogits, Storage::Bshd));
                // Enough query tiles to fill an H100 with fwd_sm90's default D64 tile (192 x 128:
                // 14 x 16 = 224); grids smaller than the GPU take its short tile instead.
                if d == 64 {
                    out.push(Spec::new(Case::new(1, 2500, 2500, 16, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd));
                }
                // A zero scale (uniform softmax over the visible keys) and an unscaled q·k.
                for scale in [0.0, 1.0] {
                    let case = Case::new(1, 113, 300, 4, 2, d, causal, dtype);
                    out.push(Spec { scale: Some(scale), ..Spec::new(case, Inputs::Normal, Storage::Bshd) });
                }
                out.extend(decode_specs(family, d, causal, dtype, quick));
                out.extend(mods_specs(d, causal, dtype, quick));
            }
        }
    }
    out
}

/// Sliding windows (the list: a window of one key, of two, 128 keys back, ±256, 64
/// ahead and the rest back) on square, wider and taller shapes; decode under a window (no
/// GQA packing; fwd_sm80 splits the window's keys); softcaps 30 and 50 on logits that reach
/// about ±30, alone and with a window.
fn mods_specs(d: usize, causal: bool, dtype: DType, quick: bool) -> Vec<Spec> {
    let windows: &[(i32, i32)] = if quick { &[(127, 0), (-1, 64)] } else { &[(0, 0), (1, 0), (127, 0), (256, 256), (-1, 64)] };
    let shapes = [(1000, 1000), (257, 1000), (1000, 257)];
    let mut out = Vec::new();
    for (i, &(left, right)) in windows.iter().enumerate() {
        let (sq, sk) = shapes[i % shapes.len()];
        out.push(Spec::with_mods(Case::new(1, sq, sk, 8, 2, d, causal, dtype), Inputs::Normal, Window::new(left, right), 0.0));
    }
    out.push(Spec::with_mods(Case::new(2, 1, 4097, 8, 2, d, causal, dtype), Inputs::Normal, Window::new(127, 0), 0.0));
    for softcap in if quick { &[30.0][..] } else { &[30.0, 50.0][..] } {
        out.push(Spec::with_mods(Case::new(1, 200, 1000, 4, 2, d, causal, dtype), Inputs::LargeLogits, Window::UNBOUNDED, *softcap));
    }
    out.push(Spec::with_mods(Case::new(1, 1000, 300, 4, 2, d, causal, dtype), Inputs::LargeLogits, Window::new(64, 64), 30.0));
    out
}

/// Decode (GQA packed as rows, MQA, plain MHA) at the dispatcher's split count, and for
/// the family that splits, forced splits: with Sq > 1 under the causal mask, with rows that
/// every split finds empty (Sq > Sk), with more splits than some tiles' visible keys, and
/// with identical keys (equal partial LSEs).
fn decode_specs(family: KernelFamily, d: usize, causal: bool, dtype: DType, quick: bool) -> Vec<Spec> {
    let bhsd = |case| Spec { storage: Storage::Bhsd, ..Spec::new(case, Inputs::Normal, Storage::Bshd) };
    let mut out = vec![Spec::new(Case::new(3, 1, 4097, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd)];
    if !quick {
        out.push(bhsd(Case::new(2, 1, 1000, 8, 1, d, causal, dtype)));
        out.push(Spec::new(Case::new(2, 1, 7, 4, 4, d, causal, dtype), Inputs::Normal, Storage::Bshd));
    }
    if family != KernelFamily::FwdSm80 {
        return out;
    }
    let forced = |case, inputs, splits| Spec { splits: Some(splits), ..Spec::new(case, inputs, Storage::Bshd) };
    out.push(forced(Case::new(2, 113, 1000, 4, 2, d, causal, dtype), Inputs::Normal, 3));
    out.push(forced(Case::new(1, 300, 200, 4, 2, d, causal, dtype), Inputs::Normal, 2));
    if !quick {
        out.push(forced(Case::new(1, 7, 4097, 8, 1, d, causal, dtype), Inputs::Normal, 5));
        out.push(forced(Case::new(1, 1, 1000, 4, 4, d, causal, dtype), Inputs::Normal, 128));
        out.push(forced(Case::new(1, 200, 300, 4, 2, d, causal, dtype), Inputs::IdenticalKeys, 2));
        out.push(forced(Case::new(2, 1, 1000, 8, 2, d, causal, dtype), Inputs::Normal, 1));
    }
    out
}

pub fn run(args: &CheckArgs) -> Result<bool> {
    let ctx = Context::new(0)?;
    let arch = ctx.info().arch;
    let families: Vec<KernelFamily> = match &args.kernel {
        Some(name) => vec![KernelFamily::parse(name).ok_or_else(|| anyhow::anyhow!("unknown kernel {name:?}; known: {}", family_names()))?],
        None => KernelFamily::ALL.into_iter().filter(|f| f.runs_on(arch)).collect(),
    };
    let depth = match (args.smoke, args.quick) {
        (true, _) => Depth::Smoke,
        (_, true) => Depth::Quick,
        _ => Depth::Full,
    };
    let group = |name: &str| args.only.as_deref().map_or(true, |only| only == name);
    let forward = families.iter().filter(|f| !f.is_backward() && group("forward"));
    let all: Vec<(KernelFamily, Spec)> = forward.flat_map(|&f| specs(f, depth).into_iter().map(move |s| (f, s))).collect();
    // The backward's kernels: bwd_sm80, bwd_sm90, and the reference (which has both passes).
    let backward: Vec<bwd::BwdSpec> = families
        .iter()
        .filter(|f| (f.is_backward() || **f == KernelFamily::Reference) && group("backward"))
        .flat_map(|&f| bwd::specs(f, depth == Depth::Quick, depth == Depth::Smoke))
        .collect();
    let packed: Vec<varlen::VarlenSpec> =
        families.iter().filter(|_| group("varlen")).flat_map(|&f| varlen::specs(f, depth == Depth::Quick, depth == Depth::Smoke)).collect();
    let cached: Vec<paged::PagedSpec> =
        families.iter().filter(|_| group("paged")).flat_map(|&f| paged::specs(f, depth == Depth::Quick, depth == Depth::Smoke)).collect();
    // In the order they run (below), so that the parts of one N cover the run once.
    let mut part = PartFilter { part: args.part, next: 0 };
    let (all, packed, cached, backward) = (part.take(all), part.take(packed), part.take(cached), part.take(backward));
    let label = match args.part {
        Some(Part { k, n }) => format!("{} (part {k}/{n})", ["smoke", "quick", "full"][depth as usize]),
        None => ["smoke", "quick", "full"][depth as usize].to_string(),
    };
    println!(
        "{label} check on {} ({arch}): {} forward, {} packed (varlen), {} KV-cache (paged) and {} backward cases",
        ctx.info().name,
        all.len(),
        packed.len(),
        cached.len(),
        backward.len()
    );
    let progress = Progress::new(all.len() + packed.len() + cached.len() + backward.len());
    let mut outcomes = Vec::new();
    for (family, spec) in &all {
        outcomes.push(progress.case(&format!("{family} {}", spec.case.name), || check_one(&ctx, *family, spec))?);
    }
    for spec in &packed {
        outcomes.push(progress.case(&format!("{} varlen", spec.family), || varlen::check_one(&ctx, spec))?);
    }
    for spec in &cached {
        outcomes.push(progress.case(&format!("{} paged", spec.kernel), || paged::check_one(&ctx, spec))?);
    }
    for spec in &backward {
        outcomes.push(progress.case("backward", || bwd::check_one(&ctx, spec))?);
    }
    progress.bar.finish_and_clear();
    print_table(&outcomes);
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    println!("{} passed, {failed} failed", outcomes.len() - failed);
    Ok(failed == 0)
}

fn family_names() -> String {
    KernelFamily::ALL.map(|f| f.name()).join(", ")
}

pub(crate) fn nan_bits(dtype: DType) -> u16 {
    match dtype {
        DType::F16 => 0x7e00,
        DType::BF16 => 0x7fc0,
    }
}

/// `run(o, lse)` into a NaN-poisoned `o` of `shape` and `lse` of `lse_len` f32 values:
/// returns o's bits and lse (what a run leaves unwritten stays NaN, which never passes).
pub(crate) fn poisoned_run(
    ctx: &Context,
    shape: [usize; 4],
    dtype: DType,
    lse_len: usize,
    run: impl FnOnce(TensorViewMut, &mut CudaSlice<f32>) -> flashcore::Result<()>,
) -> Result<(Vec<u16>, Vec<f32>)> {
    let mut o = DeviceTensor::filled(ctx, nan_bits(dtype), shape, dtype)?;
    let mut lse = ctx.stream().clone_htod(&vec![f32::NAN; lse_len.max(1)])?;
    run(o.view_mut(), &mut lse)?;
    let mut lse = ctx.stream().clone_dtoh(&lse)?;
    lse.truncate(lse_len);
    Ok((o.to_bits(ctx)?, lse))
}

/// Whether two runs' (o bits, lse) are bitwise equal.
pub(crate) fn same_bits(a: &(Vec<u16>, Vec<f32>), b: &(Vec<u16>, Vec<f32>)) -> bool {
    a.0 == b.0 && a.1.len() == b.1.len() && a.1.iter().zip(&b.1).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Runs `family` on the inputs into NaN-poisoned buffers; returns (o, lse).
fn run_poisoned(ctx: &Context, family: KernelFamily, spec: &Spec, q: &Stored, k: &Stored, v: &Stored) -> Result<(Vec<u16>, Vec<f32>)> {
    let case = &spec.case;
    let params = AttnParams {
        causal: case.causal,
        kernel: Some(family),
        num_splits: spec.splits,
        softmax_scale: Some(spec.scale()),
        window: spec.window,
        softcap: spec.softcap,
        ..AttnParams::default()
    };
    let lse_len = case.batch * case.heads_q * case.seqlen_q;
    poisoned_run(ctx, case.q_shape(), case.dtype, lse_len, |o, lse| ctx.attention_into(q.view(), k.view(), v.view(), o, Some(lse), &params))
}

fn check_one(ctx: &Context, family: KernelFamily, spec: &Spec) -> Result<Outcome> {
    let case = &spec.case;
    let host = random_qkv(case, spec.inputs, 0x5eed ^ case.seqlen_q as u64 ^ ((case.head_dim as u64) << 20));
    let up = |data: &[f32], shape| Stored::upload(ctx, data, shape, case.dtype, spec.storage);
    let (q, k, v) = (up(&host.q, case.q_shape())?, up(&host.k, case.kv_shape())?, up(&host.v, case.kv_shape())?);

    let first = run_poisoned(ctx, family, spec, &q, &k, &v)?;
    let deterministic = same_bits(&first, &run_poisoned(ctx, family, spec, &q, &k, &v)?);
    let (o_bits, lse) = first;
    let o: Vec<f32> = o_bits.iter().map(|&b| case.dtype.decode(b)).collect();

    let (oracle, ref_o, ref_lse) = oracle(ctx, family, spec, &host, &q, &k, &v)?;
    let (rel, max_abs, lse_err, failure) = judge(&o, &ref_o, &lse, &ref_lse, case.dtype, deterministic);
    let splits = spec.splits.map(|n| format!("_split{n}")).unwrap_or_default();
    let scale = spec.scale.map(|s| format!("_scale{s}")).unwrap_or_default();
    let bhsd = if spec.storage == Storage::Bhsd { "_bhsd" } else { "" };
    let window = if spec.window == Window::UNBOUNDED { String::new() } else { format!("_w{},{}", spec.window.left, spec.window.right) };
    let softcap = if spec.softcap > 0.0 { format!("_cap{}", spec.softcap) } else { String::new() };
    let name = format!("{}{}{bhsd}{splits}{scale}{window}{softcap}", case.name, inputs_suffix(spec.inputs));
    Ok(Outcome { spec_name: name, kernel: family, oracle, rel, max_abs, lse_err, deterministic, failure })
}

/// A forward result against the oracle's: (relative L2 error, max abs error, max LSE error,
/// the first failure: NaN/Inf in o, o beyond the dtype's tolerance, an LSE not -inf where the
/// oracle's is (a row without keys) or not finite where it is finite, LSE error > 2e-3, two
/// runs not bitwise equal).
pub(crate) fn judge(
    o: &[f32],
    ref_o: &[f64],
    lse: &[f32],
    ref_lse: &[f64],
    dtype: DType,
    deterministic: bool,
) -> (f64, f64, f64, Option<String>) {
    let (rel, max_abs) = errors(o, ref_o);
    let mut lse_err = 0f64;
    let mut lse_failure = None;
    for (i, (&got, &want)) in lse.iter().zip(ref_lse).enumerate() {
        if want == f64::NEG_INFINITY {
            if got != f32::NEG_INFINITY {
                lse_failure = Some(format!("lse[{i}] = {got} for a fully masked row, want -inf"));
            }
        } else if !got.is_finite() {
            lse_failure = Some(format!("lse[{i}] = {got}, want {want:.4}"));
        } else {
            lse_err = lse_err.max((got as f64 - want).abs());
        }
    }
    let failure = if o.iter().any(|x| !x.is_finite()) {
        Some("NaN/Inf in the output (unwritten or overflowed elements)".into())
    } else if rel > tolerance(dtype) {
        Some(format!("rel error {rel:.2e} > {:.0e}", tolerance(dtype)))
    } else if lse_failure.is_some() {
        lse_failure
    } else if lse_err > 2e-3 {
        Some(format!("lse error {lse_err:.2e} > 2e-3"))
    } else if !deterministic {
        Some("two runs differ bitwise".into())
    } else {
        None
    };
    (rel, max_abs, lse_err, failure)
}

fn inputs_suffix(inputs: Inputs) -> &'static str {
    match inputs {
        Inputs::Normal => "",
        Inputs::LargeLogits => "_large-logits",
        Inputs::IdenticalKeys => "_identical-keys",
        Inputs::RisingLogits => "_rising-logits",
    }
}

/// The f64 CPU oracle when affordable, else the GPU reference kernel.
fn oracle(
    ctx: &Context,
    family: KernelFamily,
    spec: &Spec,
    host: &HostQkv,
    q: &Stored,
    k: &Stored,
    v: &Stored,
) -> Result<(&'static str, Vec<f64>, Vec<f64>)> {
    let case = &spec.case;
    let work = case.batch * case.heads_q * case.seqlen_q * case.seqlen_k * case.head_dim;
    if work <= CPU_REFERENCE_MAX_WORK {
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let mask = RefMask {
            causal: case.causal,
            window: (spec.window != Window::UNBOUNDED).then_some(spec.window),
            softcap: spec.softcap as f64,
        };
        let r = reference::attention_masked(&wide(&host.q), &wide(&host.k), &wide(&host.v), &case.shape(), spec.scale() as f64, &mask);
        return Ok(("cpu-f64", r.o, r.lse));
    }
    if family == KernelFamily::Reference {
        bail!("case {} is too large for the CPU oracle and cannot check the GPU reference against itself", case.name);
    }
    let (o, lse) = run_poisoned(ctx, KernelFamily::Reference, &Spec { splits: None, ..spec.clone() }, q, k, v)?;
    Ok(("gpu-ref", o.iter().map(|&b| case.dtype.decode(b) as f64).collect(), lse.iter().map(|&x| x as f64).collect()))
}

/// The run's progress: a bar on a terminal; else (a log) a line on stderr as each case ends,
/// with its time, so that a long or stopped run's log says where it was.
struct Progress {
    bar: ProgressBar,
    lines: bool,
}

impl Progress {
    fn new(cases: usize) -> Self {
        let bar = ProgressBar::new(cases as u64).with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap());
        Self { lines: !std::io::stderr().is_terminal(), bar }
    }

    fn case(&self, what: &str, run: impl FnOnce() -> Result<Outcome>) -> Result<Outcome> {
        self.bar.set_message(what.to_string());
        let start = std::time::Instant::now();
        let outcome = run()?;
        self.bar.inc(1);
        if self.lines {
            let verdict = if outcome.failure.is_some() { "FAILED" } else { "ok" };
            let (done, all) = (self.bar.position(), self.bar.length().unwrap_or(0));
            eprintln!("[{done}/{all}] {} {} {verdict} ({:.1} s)", outcome.kernel.name(), outcome.spec_name, start.elapsed().as_secs_f64());
        }
        Ok(outcome)
    }
}

fn print_table(outcomes: &[Outcome]) {
    println!("{:<10} {:<48} {:<8} {:>9} {:>9} {:>9} {:>5}  result", "kernel", "case", "oracle", "rel_err", "max_abs", "lse_err", "det");
    for o in outcomes {
        println!(
            "{:<10} {:<48} {:<8} {:>9.2e} {:>9.2e} {:>9.2e} {:>5}  {}",
            o.kernel.name(),
            o.spec_name,
            o.oracle,
            o.rel,
            o.max_abs,
            o.lse_err,
            if o.deterministic { "yes" } else { "NO" },
            o.failure.as_deref().unwrap_or("ok")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_one_count_cover_the_run_once() {
        let lists = [vec![0, 1, 2], vec![], vec![3, 4, 5, 6], vec![7]];
        let mut seen = Vec::new();
        for k in 1..=3 {
            let mut part = PartFilter { part: Some(Part { k, n: 3 }), next: 0 };
            for list in &lists {
                seen.extend(part.take(list.clone()));
            }
        }
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        let mut whole = PartFilter { part: None, next: 0 };
        assert_eq!(whole.take(vec![1, 2, 3]), vec![1, 2, 3]);
    }

    #[test]
    fn a_part_is_k_of_n() {
        assert_eq!(parse_part("2/3"), Ok(Part { k: 2, n: 3 }));
        for bad in ["0/3", "4/3", "3", "a/b", "1/0"] {
            assert!(parse_part(bad).is_err(), "{bad}");
        }
    }
}
