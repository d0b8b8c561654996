//! `flashcore check`'s packed (varlen) batches, forward and backward: each against the f64
//! oracle run per sequence, and bitwise against each sequence run alone through the same
//! kernel (the backward: dk and dv always, dq in deterministic mode at the same forced split
//! count, since dq's atomics add in a varying order otherwise and the split count the
//! dispatcher picks depends on the number of sequences).

use anyhow::Result;
use cudarc::driver::CudaSlice;
use flashcore::dispatch::KeyLayout;
use flashcore::reference::{self, RefMask};
use flashcore::{AttnParams, Context, DType, DeviceTensor, KernelFamily, ProblemShape, SeqLensView, VarlenBatch, Window};

use crate::cases::{random_qkv, Case, HostQkv, Inputs};
use crate::check::{judge, poisoned_run, same_bits, Outcome};

/// One sequence of a packed batch: its queries, the keys it uses, and the keys after those
/// it holds but does not use (`seqused_k`'s slack; 0 without seqused_k).
#[derive(Debug, Clone, Copy)]
pub struct Seq {
    pub queries: usize,
    pub keys: usize,
    pub slack: usize,
}

#[derive(Debug, Clone)]
pub struct VarlenSpec {
    pub family: KernelFamily,
    pub seqs: Vec<Seq>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub dtype: DType,
    pub window: Window,
    pub softcap: f32,
    /// Whether seqused_k is given (else every slack is 0).
    pub seqused: bool,
    /// Forced splits: fwd_sm80's split-KV, or bwd_sm80's deterministic dQ slices.
    pub splits: Option<usize>,
    pub inputs: Inputs,
    /// The backward's deterministic mode.
    pub deterministic: bool,
}

impl VarlenSpec {
    pub(crate) fn name(&self) -> String {
        let lens: Vec<String> = self.seqs.iter().map(|s| format!("{}/{}", s.queries, s.keys)).collect();
        let mut name = format!(
            "{}varlen[{}]_h{}kv{}_d{}_{}_{}",
            if self.family.is_backward() { "bwd_" } else { "" },
            lens.join(","),
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            self.dtype.name()
        );
        if self.seqused {
            name += "_seqused";
        }
        if self.window != Window::UNBOUNDED {
            name += &format!("_w{},{}", self.window.left, self.window.right);
        }
        if self.softcap > 0.0 {
            name += &format!("_cap{}", self.softcap);
        }
        if let Some(n) = self.splits {
            name += &format!("_split{n}");
        }
        if self.deterministic {
            name += "_deterministic";
        }
        name
    }

    pub(crate) fn params(&self) -> AttnParams {
        AttnParams {
            causal: self.causal,
            kernel: Some(self.family),
            num_splits: self.splits,
            window: self.window,
            softcap: self.softcap,
            deterministic: self.deterministic,
            ..AttnParams::default()
        }
    }

    /// The longest sequence's queries and keys (used keys with seqused_k, else all).
    pub(crate) fn maxima(&self) -> (usize, usize) {
        (self.max(|s| s.queries), self.max(|s| s.keys + if self.seqused { 0 } else { s.slack }))
    }

    /// Each sequence's q, k, v (keys with their slack), `[1, S, H, D]`, rounded to the dtype.
    pub(crate) fn host_inputs(&self) -> Vec<HostQkv> {
        let (hq, hkv, d) = (self.heads_q, self.heads_kv, self.head_dim);
        let seqs = self.seqs.iter().enumerate();
        seqs.map(|(i, s)| {
            let case = Case::new(1, s.queries, s.keys + s.slack, hq, hkv, d, self.causal, self.dtype);
            random_qkv(&case, self.inputs, 0x7a21 ^ (i as u64) << 8 ^ d as u64)
        })
        .collect()
    }

    pub(crate) fn mask(&self) -> RefMask {
        RefMask::of(&self.params())
    }

    fn max(&self, f: impl Fn(&Seq) -> usize) -> usize {
        self.seqs.iter().map(f).max().unwrap_or(0)
    }
}

pub(crate) fn seqs(lens: &[(usize, usize)]) -> Vec<Seq> {
    lens.iter().map(|&(queries, keys)| Seq { queries, keys, slack: 0 }).collect()
}

/// One point of the specs' sweep: a family, dtype, head dim and mask.
pub(crate) struct Point {
    pub family: KernelFamily,
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
}

impl Point {
    /// The plain spec of this point for a batch of `seqs` at `(Hq, Hkv)`: no window, softcap,
    /// seqused_k or forced splits, normal inputs.
    pub(crate) fn spec(&self, seqs: &[Seq], (heads_q, heads_kv): (usize, usize)) -> VarlenSpec {
        VarlenSpec {
            family: self.family,
            seqs: seqs.to_vec(),
            heads_q,
            heads_kv,
            head_dim: self.head_dim,
            causal: self.causal,
            dtype: self.dtype,
            window: Window::UNBOUNDED,
            softcap: 0.0,
            seqused: false,
            splits: None,
            inputs: Inputs::Normal,
            deterministic: false,
        }
    }
}

/// The specs `add` makes at every point: bf16 and f16 (bf16 alone in smoke runs), the
/// family's head dims (64 and 128 alone in quick and smoke runs), full and causal.
pub(crate) fn sweep(family: KernelFamily, quick: bool, smoke: bool, mut add: impl FnMut(&Point, &mut Vec<VarlenSpec>)) -> Vec<VarlenSpec> {
    let dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !(quick || smoke) || d == 64 || d == 128).collect();
    let mut out = Vec::new();
    for &dtype in if smoke { &[DType::BF16][..] } else { &[DType::BF16, DType::F16][..] } {
        for &head_dim in &dims {
            for causal in [false, true] {
                add(&Point { family, dtype, head_dim, causal }, &mut out);
            }
        }
    }
    out
}

/// The batch (lengths 0, 1, 7, 113, 1000 and 4097 together, Sq ≠ Sk, a sequence with
/// no keys), GQA; serving decode (one query per sequence over keys with slack: seqused_k)
/// at the dispatcher's split count and forced splits; a window and a softcap on a packed batch.
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<VarlenSpec> {
    if family.is_backward() {
        return crate::check::varlen_bwd::specs(family, quick, smoke);
    }
    if !matches!(family, KernelFamily::FwdSm80 | KernelFamily::FwdSm90) {
        return Vec::new();
    }
    let mixed = seqs(&[(0, 5), (1, 1), (7, 300), (113, 113), (1000, 1200), (3, 0), (250, 90)]);
    let long = seqs(&[(4097, 4097), (1, 17), (113, 1000), (7, 7)]);
    let decode: Vec<Seq> =
        [1, 17, 1000, 4097, 0, 300].iter().enumerate().map(|(i, &keys)| Seq { queries: 1, keys, slack: [0, 3, 40, 1, 9, 0][i] }).collect();
    let policies = seqs(&[(600, 600), (1, 200), (300, 700), (129, 64)]);
    sweep(family, quick, smoke, |p, out| {
        out.push(p.spec(&mixed, (8, 2)));
        out.push(VarlenSpec { seqused: true, ..p.spec(&decode, (8, 2)) });
        if smoke {
            return;
        }
        if p.head_dim == 64 || p.head_dim == 128 {
            out.push(p.spec(&long, (4, 2)));
        }
        out.push(VarlenSpec { window: Window::new(127, 0), ..p.spec(&policies, (4, 2)) });
        out.push(VarlenSpec { softcap: 30.0, inputs: Inputs::LargeLogits, ..p.spec(&policies, (4, 1)) });
        if !quick {
            out.push(VarlenSpec { window: Window::new(-1, 64), softcap: 50.0, inputs: Inputs::LargeLogits, ..p.spec(&mixed, (4, 4)) });
            out.push(VarlenSpec { window: Window::new(256, 256), ..p.spec(&long, (2, 1)) });
        }
        if family == KernelFamily::FwdSm80 {
            out.push(VarlenSpec { seqused: true, splits: Some(5), ..p.spec(&decode, (8, 1)) });
            out.push(VarlenSpec { splits: Some(3), ..p.spec(&mixed, (4, 2)) });
        }
    })
}

/// A packed problem on the device, its cu_seqlens (and seqused_k) beside it.
pub(crate) struct Packed {
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    used: Option<CudaSlice<i32>>,
    pub total_q: usize,
}

impl Packed {
    /// The batch's view at these maxima, its device values checked against the contract.
    pub fn batch(&self, ctx: &Context, max: (usize, usize)) -> Result<VarlenBatch<'_>> {
        let batch = VarlenBatch {
            cu_seqlens_q: SeqLensView::of(&self.cu_q),
            cu_seqlens_k: SeqLensView::of(&self.cu_k),
            seqused_k: self.used.as_ref().map(SeqLensView::of),
            max_seqlen_q: max.0,
            max_seqlen_k: max.1,
        };
        ctx.check_varlen(&batch, self.total_q, self.k.layout().shape[1])?;
        Ok(batch)
    }

    /// `seqs`' host tensors (each `[1, S, H, D]`, keys with their slack) packed.
    pub fn upload(ctx: &Context, spec: &VarlenSpec, parts: &[(&[f32], &[f32], &[f32])], seqs: &[Seq]) -> Result<Self> {
        let cat = |i: usize| parts.iter().flat_map(|p| [p.0, p.1, p.2][i].iter().copied()).collect::<Vec<f32>>();
        let (q, k, v) = (cat(0), cat(1), cat(2));
        let total_q: usize = seqs.iter().map(|s| s.queries).sum();
        let total_k: usize = seqs.iter().map(|s| s.keys + s.slack).sum();
        let (d, hq, hkv) = (spec.head_dim, spec.heads_q, spec.heads_kv);
        let up = |x: &[f32], rows, heads| DeviceTensor::from_f32(ctx, x, [1, rows, heads, d], spec.dtype);
        let prefix = |f: fn(&Seq) -> usize| -> Vec<i32> {
            let mut cu = vec![0i32];
            seqs.iter().for_each(|s| cu.push(cu.last().unwrap() + f(s) as i32));
            cu
        };
        let (cu_q, cu_k) = (prefix(|s| s.queries), prefix(|s| s.keys + s.slack));
        let used: Vec<i32> = seqs.iter().map(|s| s.keys as i32).collect();
        Ok(Self {
            q: up(&q, total_q, hq)?,
            k: up(&k, total_k, hkv)?,
            v: up(&v, total_k, hkv)?,
            cu_q: ctx.stream().clone_htod(&cu_q)?,
            cu_k: ctx.stream().clone_htod(&cu_k)?,
            used: if spec.seqused { Some(ctx.stream().clone_htod(&used)?) } else { None },
            total_q,
        })
    }

    /// Runs into NaN-poisoned o and lse, split `splits` ways when given (else as the spec
    /// says); returns (o bits, lse `[Hq, total_q]`).
    fn run(&self, ctx: &Context, spec: &VarlenSpec, max: (usize, usize), splits: Option<usize>) -> Result<(Vec<u16>, Vec<f32>)> {
        let batch = self.batch(ctx, max)?;
        let params = AttnParams { num_splits: splits.or(spec.splits), ..spec.params() };
        poisoned_run(ctx, self.q.layout().shape, spec.dtype, spec.heads_q * self.total_q, |o, lse| {
            ctx.attention_varlen_into(self.q.view(), self.k.view(), self.v.view(), o, Some(lse), &batch, &params)
        })
    }
}

pub fn check_one(ctx: &Context, spec: &VarlenSpec) -> Result<Outcome> {
    if spec.family.is_backward() {
        return crate::check::varlen_bwd::check_one(ctx, spec);
    }
    let (hq, hkv, d) = (spec.heads_q, spec.heads_kv, spec.head_dim);
    let scale = 1.0 / (d as f64).sqrt();
    let host = spec.host_inputs();
    let parts: Vec<_> = host.iter().map(|h| (&h.q[..], &h.k[..], &h.v[..])).collect();
    let max = spec.maxima();
    let packed = Packed::upload(ctx, spec, &parts, &spec.seqs)?;
    let first = packed.run(ctx, spec, max, None)?;
    let deterministic = same_bits(&first, &packed.run(ctx, spec, max, None)?);
    let (o_bits, lse) = first;
    // Alone, the same variant (the same maxima) and the same split count: the dispatcher
    // picks splits from the whole grid, and another count sums a row's keys in other parts.
    let kernel_shape = ProblemShape { batch: spec.seqs.len(), seqlen_q: max.0, seqlen_k: max.1, heads_q: hq, heads_kv: hkv, head_dim: d };
    let layout = KeyLayout::Varlen { total_k: spec.seqs.iter().map(|s| s.keys + s.slack).sum() };
    let splits = flashcore::dispatch::plan_for(&ctx.info().device(), &kernel_shape, spec.dtype, &spec.params(), layout)?.splits;

    // The oracle per sequence, and each sequence alone (a batch of one) against its rows of
    // the packed result.
    let (mut ref_o, mut ref_lse) = (Vec::new(), vec![f64::NAN; hq * packed.total_q]);
    let mut failure = None;
    let mut row0 = 0;
    for (b, (s, h)) in spec.seqs.iter().zip(&host).enumerate() {
        let shape = ProblemShape { batch: 1, seqlen_q: s.queries, seqlen_k: s.keys, heads_q: hq, heads_kv: hkv, head_dim: d };
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let used = s.keys * hkv * d;
        let (o, l) = if s.keys == 0 {
            (vec![0.0; s.queries * hq * d], vec![f64::NEG_INFINITY; hq * s.queries])
        } else {
            let r = reference::attention_masked(&wide(&h.q), &wide(&h.k[..used]), &wide(&h.v[..used]), &shape, scale, &spec.mask());
            (r.o, r.lse)
        };
        ref_o.extend(o);
        for head in 0..hq {
            for i in 0..s.queries {
                ref_lse[head * packed.total_q + row0 + i] = l[head * s.queries + i];
            }
        }
        // Alone, a sequence without keys would be an empty k (refused): the oracle checks it.
        if s.queries > 0 && s.keys + s.slack > 0 && failure.is_none() {
            let alone = Packed::upload(ctx, spec, &parts[b..b + 1], &spec.seqs[b..b + 1])?;
            let (o_alone, lse_alone) = alone.run(ctx, spec, max, Some(splits))?;
            let rows = row0 * hq * d..(row0 + s.queries) * hq * d;
            let lse_same = (0..hq).all(|head| {
                (0..s.queries).all(|i| lse_alone[head * s.queries + i].to_bits() == lse[head * packed.total_q + row0 + i].to_bits())
            });
            if o_alone != o_bits[rows] || !lse_same {
                failure = Some(format!("sequence {b} differs bitwise from the same sequence run alone"));
            }
        }
        row0 += s.queries;
    }
    let o: Vec<f32> = o_bits.iter().map(|&b| spec.dtype.decode(b)).collect();
    let (rel, max_abs, lse_err, judged) = judge(&o, &ref_o, &lse, &ref_lse, spec.dtype, deterministic);
    let failure = judged.or(failure);
    Ok(Outcome { spec_name: spec.name(), kernel: spec.family, oracle: "cpu-f64", rel, max_abs, lse_err, deterministic, failure })
}
