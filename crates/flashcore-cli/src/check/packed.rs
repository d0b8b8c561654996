//! `flashcore check`'s packed (varlen) batches, forward (`varlen.rs`) and backward
//! (`varlen_bwd.rs`): a batch's sequences and options, the sweep of them, and the batch on the
//! device.

use anyhow::Result;
use cudarc::driver::CudaSlice;
use flashcore::reference::RefMask;
use flashcore::{
    AlibiSlopes, AttnParams, Context, DType, DeviceTensor, FwdInputs, FwdOutputs, KernelFamily, LearnableSinks, LseViewMut, SeqLensView,
    VarlenBatch, Window,
};

use crate::cases::{random_qkv, Case, HostQkv, Inputs};
use crate::check::poison::poisoned_run;
use crate::check::{sink_values, upload_slopes, Alibi, ValueDimPoint};

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
    /// V's own head dim (`check --value-dim`); None: `head_dim`.
    pub head_dim_v: Option<usize>,
    pub causal: bool,
    pub dtype: DType,
    pub window: Window,
    pub softcap: f32,
    /// ALiBi's slopes (per sequence: a row for each of the batch's sequences).
    pub alibi: Alibi,
    /// Whether seqused_k is given (else every slack is 0).
    pub seqused: bool,
    /// Forced splits: fwd_sm80's split-KV, or bwd_sm80's deterministic dQ slices.
    pub splits: Option<usize>,
    pub inputs: Inputs,
    /// The backward's deterministic mode.
    pub deterministic: bool,
    /// Dropout: each sequence's mask is that of its place in the batch, so a sequence run
    /// alone draws another and is not compared with its rows bitwise; the oracle keeps its place.
    pub dropout: Option<flashcore::Dropout>,
    /// Learnable sinks (`cases::sink_values`), one a query head for every sequence (the
    /// backward's checks: their gradient sums every sequence's rows).
    pub sinks: bool,
}

impl VarlenSpec {
    pub(crate) fn name(&self) -> String {
        let lens: Vec<String> = self.seqs.iter().map(|s| format!("{}/{}", s.queries, s.keys)).collect();
        let mut name = format!(
            "{}varlen[{}]_h{}kv{}_d{}{}_{}_{}",
            if self.family.is_backward() { "bwd_" } else { "" },
            lens.join(","),
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            self.head_dim_v.map(|dv| format!("_dv{dv}")).unwrap_or_default(),
            if self.causal { "causal" } else { "full" },
            self.dtype.name()
        );
        if self.seqused {
            name += "_seqused";
        }
        name += &super::score_suffix(self.window, self.softcap);
        name += self.alibi.suffix();
        if let Some(d) = self.dropout {
            name += &format!("_dropout{}", d.p);
        }
        if let Some(n) = self.splits {
            name += &format!("_split{n}");
        }
        if self.sinks {
            name += "_sinks";
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
            dropout: self.dropout,
            ..AttnParams::default()
        }
    }

    /// V's head dim (and the output's): its own, or `head_dim`.
    pub(crate) fn value_dim(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }

    /// The longest sequence's queries and keys (used keys with seqused_k, else all).
    pub(crate) fn maxima(&self) -> (usize, usize) {
        (self.max(|s| s.queries), self.max(|s| s.keys + if self.seqused { 0 } else { s.slack }))
    }

    /// Each sequence's q, k, v (keys with their slack), `[1, S, H, D]` (v with V's head dim),
    /// rounded to the dtype.
    pub(crate) fn host_inputs(&self) -> Vec<HostQkv> {
        let (hq, hkv, d) = (self.heads_q, self.heads_kv, self.head_dim);
        let seqs = self.seqs.iter().enumerate();
        seqs.map(|(i, s)| {
            let case = Case::new(1, s.queries, s.keys + s.slack, hq, hkv, d, self.causal, self.dtype);
            let case = match self.head_dim_v {
                Some(dv) => case.with_value_dim(dv),
                None => case,
            };
            random_qkv(&case, self.inputs, 0x7a21 ^ (i as u64) << 8 ^ d as u64)
        })
        .collect()
    }

    /// The mask of sequence `b` under ALiBi `slopes` (the batch's, widened: [`VarlenSpec::slopes`]).
    pub(crate) fn mask<'a>(&self, slopes: &'a [f64], b: usize) -> RefMask<'a> {
        RefMask::of(&self.params()).with_alibi(slopes).for_sequence(b, self.heads_q)
    }

    /// ALiBi's slopes of the batch (empty when off).
    pub(crate) fn slopes(&self) -> Vec<f32> {
        self.alibi.slopes(self.seqs.len(), self.heads_q)
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
            head_dim_v: None,
            causal: self.causal,
            dtype: self.dtype,
            window: Window::UNBOUNDED,
            softcap: 0.0,
            alibi: Alibi::Off,
            seqused: false,
            splits: None,
            inputs: Inputs::Normal,
            deterministic: false,
            dropout: None,
            sinks: false,
        }
    }

    /// Dropout at rate `p` with a generator pair of this point's own.
    pub(crate) fn dropout(&self, p: f32, offset: u64) -> Option<flashcore::Dropout> {
        Some(flashcore::Dropout { p, seed: 0x5eed_5e90 ^ self.head_dim as u64, offset })
    }
}

/// The plain spec of `family` at V's own head dim's point `v` (`check --value-dim`) for a batch
/// of `seqs` at `(Hq, Hkv)`.
pub(crate) fn value_dim_spec(family: KernelFamily, v: ValueDimPoint, seqs: &[Seq], heads: (usize, usize)) -> VarlenSpec {
    let point = Point { family, dtype: v.dtype, head_dim: v.head_dim, causal: v.causal };
    VarlenSpec { head_dim_v: Some(v.head_dim_v), ..point.spec(seqs, heads) }
}

/// The specs `add` makes at every point: bf16 and f16 (bf16 alone in smoke runs), the
/// family's head dims (64 and 128 alone in quick and smoke runs) and, in full runs, D80 where
/// the family runs it as the next size (`check::padded_dims`), full and causal.
pub(crate) fn sweep(family: KernelFamily, quick: bool, smoke: bool, mut add: impl FnMut(&Point, &mut Vec<VarlenSpec>)) -> Vec<VarlenSpec> {
    let mut dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !(quick || smoke) || d == 64 || d == 128).collect();
    if !(quick || smoke) {
        dims.extend(crate::check::padded_dims(family, true, false));
    }
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

/// A packed problem on the device, its cu_seqlens (and seqused_k) beside it.
pub(crate) struct Packed {
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    used: Option<CudaSlice<i32>>,
    slopes: Option<CudaSlice<f32>>,
    sinks: Option<CudaSlice<f32>>,
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
        ctx.check_values(&FwdInputs::varlen(self.q.view(), self.k.view(), self.v.view(), batch))?;
        Ok(batch)
    }

    /// ALiBi's slopes on the device, if any.
    pub fn alibi_slopes(&self) -> Option<AlibiSlopes<'_>> {
        self.slopes.as_ref().map(AlibiSlopes::of)
    }

    /// The learnable sinks on the device, if any.
    pub fn learnable_sink(&self) -> Option<LearnableSinks<'_>> {
        self.sinks.as_ref().map(LearnableSinks::of)
    }

    /// `seqs`' host tensors (each `[1, S, H, D]`, keys with their slack) packed, with ALiBi's
    /// `slopes` for them (empty: none).
    pub fn upload(ctx: &Context, spec: &VarlenSpec, parts: &[(&[f32], &[f32], &[f32])], seqs: &[Seq], slopes: &[f32]) -> Result<Self> {
        let cat = |i: usize| parts.iter().flat_map(|p| [p.0, p.1, p.2][i].iter().copied()).collect::<Vec<f32>>();
        let (q, k, v) = (cat(0), cat(1), cat(2));
        let total_q: usize = seqs.iter().map(|s| s.queries).sum();
        let total_k: usize = seqs.iter().map(|s| s.keys + s.slack).sum();
        let (d, dv, hq, hkv) = (spec.head_dim, spec.value_dim(), spec.heads_q, spec.heads_kv);
        let up = |x: &[f32], rows, heads, dim| DeviceTensor::from_f32(ctx, x, [1, rows, heads, dim], spec.dtype);
        let prefix = |f: fn(&Seq) -> usize| -> Vec<i32> {
            let mut cu = vec![0i32];
            seqs.iter().for_each(|s| cu.push(cu.last().unwrap() + f(s) as i32));
            cu
        };
        let (cu_q, cu_k) = (prefix(|s| s.queries), prefix(|s| s.keys + s.slack));
        let used: Vec<i32> = seqs.iter().map(|s| s.keys as i32).collect();
        Ok(Self {
            q: up(&q, total_q, hq, d)?,
            k: up(&k, total_k, hkv, d)?,
            v: up(&v, total_k, hkv, dv)?,
            cu_q: ctx.stream().clone_htod(&cu_q)?,
            cu_k: ctx.stream().clone_htod(&cu_k)?,
            used: if spec.seqused { Some(ctx.stream().clone_htod(&used)?) } else { None },
            slopes: upload_slopes(ctx, slopes)?,
            sinks: upload_slopes(ctx, &sink_values(spec.sinks, hq))?,
            total_q,
        })
    }

    /// Runs into NaN-poisoned o (`[1, total_q, Hq, Dv]`) and lse, split `splits` ways when
    /// given (else as the spec says); returns (o bits, lse `[Hq, total_q]`).
    pub fn run(&self, ctx: &Context, spec: &VarlenSpec, max: (usize, usize), splits: Option<usize>) -> Result<(Vec<u16>, Vec<f32>)> {
        let batch = self.batch(ctx, max)?;
        let params = AttnParams { num_splits: splits.or(spec.splits), ..spec.params() };
        let o_shape = [1, self.total_q, spec.heads_q, spec.value_dim()];
        poisoned_run(ctx, o_shape, spec.dtype, spec.heads_q * self.total_q, |o, lse| {
            ctx.attention_into(
                &FwdInputs { alibi_slopes: self.alibi_slopes(), ..FwdInputs::varlen(self.q.view(), self.k.view(), self.v.view(), batch) },
                FwdOutputs { o, lse: Some(LseViewMut::of(lse)), probs: None },
                &params,
            )
        })
    }
}
