//! `flashcore check`'s dense forward cases: every head dim, dtype and mask over odd lengths,
//! GQA, BHSD strides, adversarial inputs, decode and forced splits, windows, softcaps and ALiBi; each
//! into NaN-poisoned buffers, twice (bitwise), against the f64 CPU oracle or, past its reach,
//! the GPU reference kernel.

use anyhow::{bail, Result};
use flashcore::reference::RefMask;
use flashcore::{
    reference, AlibiSlopes, AttnParams, Context, DType, DropoutState, FwdInputs, FwdOutputs, KernelFamily, LearnableSinks, LseViewMut,
    Window,
};

use crate::cases::{normal, random_qkv, Case, HostQkv, Inputs, Storage, Stored};
use crate::check::outcome::{judge, Outcome};
use crate::check::poison::{poisoned_run, same_bits};
use crate::check::{upload_dropout_state, upload_slopes, wide_slopes, Alibi};

/// Above this many multiply-adds the f64 CPU oracle is too slow; the GPU reference kernel
/// (itself checked against the CPU oracle on the small cases) takes over.
const CPU_REFERENCE_MAX_WORK: usize = 20_000_000_000;

#[derive(Clone)]
pub struct Spec {
    pub case: Case,
    inputs: Inputs,
    storage: Storage,
    /// Forced split-KV count (`None`: the dispatcher's choice).
    splits: Option<usize>,
    /// Softmax scale (`None`: 1/sqrt(D)).
    scale: Option<f32>,
    /// Sliding window (`Window::UNBOUNDED`: none).
    window: Window,
    /// Chunked attention's chunk (0: off).
    pub chunk: usize,
    /// Logit softcap (0: off).
    softcap: f32,
    /// ALiBi's slopes.
    pub alibi: Alibi,
    /// Dropout (fwd_sm80's form), its mask from the spec's fixed generator state.
    pub dropout: Option<flashcore::Dropout>,
    /// Learnable sinks, one a query head ([`Spec::sinks`]).
    pub sinks: bool,
    /// FlashAttention-3's `qv`, shaped like the output (random normal values).
    pub qv: bool,
}

impl Spec {
    fn new(case: Case, inputs: Inputs, storage: Storage) -> Self {
        Self {
            case,
            inputs,
            storage,
            splits: None,
            scale: None,
            window: Window::UNBOUNDED,
            chunk: 0,
            softcap: 0.0,
            alibi: Alibi::Off,
            dropout: None,
            sinks: false,
            qv: false,
        }
    }

    fn with_alibi(self, alibi: Alibi) -> Self {
        Self { alibi, ..self }
    }

    fn slopes(&self) -> Vec<f32> {
        self.alibi.slopes(self.case.batch, self.case.heads_q)
    }

    /// The learnable sinks, one a query head (none without `sinks`): see `cases::sink_values`.
    pub fn sinks(&self) -> Vec<f32> {
        super::sink_values(self.sinks, self.case.heads_q)
    }

    fn with_mods(case: Case, inputs: Inputs, window: Window, softcap: f32) -> Self {
        Self { window, softcap, ..Self::new(case, inputs, Storage::Bshd) }
    }

    fn scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.case.head_dim as f32).sqrt())
    }
}

/// The forward cases of `family`: one small case per variant (`smoke`), a few (`quick`), or
/// all.
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<Spec> {
    if smoke {
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
                    // The score policies' variants: a window, a softcap, both, ALiBi, all three.
                    let case = || Case::new(1, 130, 600, 4, 2, d, causal, dtype);
                    out.push(Spec::with_mods(case(), Inputs::Normal, Window::new(100, 20), 0.0));
                    out.push(Spec::with_mods(case(), Inputs::LargeLogits, Window::UNBOUNDED, 30.0));
                    out.push(Spec::with_mods(case(), Inputs::LargeLogits, Window::new(50, -1), 50.0));
                    out.push(Spec::new(case(), Inputs::Normal, Storage::Bshd).with_alibi(Alibi::PerHead));
                    out.push(Spec::with_mods(case(), Inputs::LargeLogits, Window::new(50, -1), 50.0).with_alibi(Alibi::PerHead));
                }
            }
            for d in crate::check::padded_dims(family, false, true) {
                for causal in [false, true] {
                    out.push(Spec::new(Case::new(1, 130, 200, 4, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd));
                    let case = Case::new(2, 130, 200, 4, 2, d, causal, dtype);
                    out.push(Spec::new(case, Inputs::Normal, Storage::Bshd).with_alibi(Alibi::PerSequence));
                }
            }
        }
        return out;
    }
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
                    let storage = if n.is_multiple_of(5) { Storage::Bhsd } else { Storage::Bshd };
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
                if matches!(family, KernelFamily::FwdSm80 | KernelFamily::FwdSm90) {
                    out.extend(dropout_specs(d, causal, dtype, quick));
                }
            }
        }
    }
    out.extend(padded_specs(family, quick));
    out.extend(chunk_specs(family, quick));
    out
}

/// The head dims run as the next size (`check::padded_dims`): odd lengths, GQA, BHSD
/// strides, large logits, decode and a window with a softcap, bf16 (f16 on one shape).
fn padded_specs(family: KernelFamily, quick: bool) -> Vec<Spec> {
    let mut out = Vec::new();
    for d in crate::check::padded_dims(family, quick, false) {
        for causal in [false, true] {
            let dtype = DType::BF16;
            for (i, &(sq, sk)) in [(1, 1), (113, 113), (1000, 113), (7, 1000), (300, 300)].iter().enumerate() {
                let (hkv, ratio) = [(2, 1), (1, 4), (1, 8)][i % 3];
                let storage = if i == 4 { Storage::Bhsd } else { Storage::Bshd };
                out.push(Spec::new(Case::new(2, sq, sk, hkv * ratio, hkv, d, causal, dtype), Inputs::Normal, storage));
            }
            out.push(Spec::new(Case::new(1, 113, 300, 4, 2, d, causal, DType::F16), Inputs::Normal, Storage::Bshd));
            out.push(Spec::new(Case::new(1, 200, 300, 4, 2, d, causal, dtype), Inputs::LargeLogits, Storage::Bshd));
            out.push(Spec::new(Case::new(2, 1, 1000, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd));
            out.push(Spec::with_mods(Case::new(1, 1000, 300, 4, 2, d, causal, dtype), Inputs::LargeLogits, Window::new(64, 64), 30.0));
            out.push(
                Spec::new(Case::new(2, 300, 1000, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd).with_alibi(Alibi::PerSequence),
            );
        }
    }
    out
}

/// Sliding windows (the list: a window of one key, of two, 128 keys back, ±256, 64
/// ahead and the rest back) on square, wider and taller shapes; decode under a window (no
/// GQA packing; fwd_sm80 splits the window's keys); softcaps 30 and 50 on logits that reach
/// about ±30, alone and with a window; ALiBi per head and per sequence on taller and wider
/// shapes, in decode (no GQA packing), on BHSD strides, with a window and a softcap.
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
    out.push(Spec::new(Case::new(2, 1000, 257, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd).with_alibi(Alibi::PerHead));
    out.push(Spec::new(Case::new(3, 1, 4097, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd).with_alibi(Alibi::PerSequence));
    if !quick {
        out.push(Spec::new(Case::new(2, 257, 1000, 4, 4, d, causal, dtype), Inputs::Normal, Storage::Bhsd).with_alibi(Alibi::PerSequence));
        let case = Case::new(1, 1000, 300, 4, 2, d, causal, dtype);
        out.push(Spec::with_mods(case, Inputs::LargeLogits, Window::new(64, 64), 30.0).with_alibi(Alibi::PerHead));
    }
    out
}

/// Chunked attention (`check --chunk` alone), every head dim (quick: D64, D128), both masks, bf16
/// (f16 on one shape): chunks aligned to the key blocks and not, a chunk of one key, one
/// longer than the keys, Sq > Sk (diagonals left of key 0), Sq < Sk, decode over 4097 keys,
/// with a window, with a softcap and ALiBi.
fn chunk_specs(family: KernelFamily, quick: bool) -> Vec<Spec> {
    let head_dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !quick || d == 64 || d == 128).collect();
    let mut out = Vec::new();
    for &d in &head_dims {
        for causal in [false, true] {
            let chunked = |b, sq, sk, chunk, dtype| Spec {
                chunk,
                ..Spec::new(Case::new(b, sq, sk, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd)
            };
            out.push(chunked(1, 1000, 1000, 128, DType::BF16));
            out.push(chunked(1, 1000, 1000, 100, DType::BF16));
            out.push(chunked(2, 257, 1000, 300, DType::F16));
            out.push(chunked(2, 1000, 257, 64, DType::BF16));
            out.push(chunked(3, 1, 4097, 1024, DType::BF16));
            if !quick {
                out.push(chunked(2, 113, 113, 1, DType::BF16));
                out.push(chunked(1, 300, 200, 8192, DType::BF16));
                out.push(Spec { window: Window::new(127, 0), ..chunked(1, 1000, 1000, 200, DType::BF16) });
                let capped = Spec {
                    chunk: 96,
                    ..Spec::with_mods(Case::new(1, 1000, 300, 4, 2, d, causal, DType::BF16), Inputs::LargeLogits, Window::UNBOUNDED, 30.0)
                };
                out.push(capped.with_alibi(Alibi::PerHead));
            }
        }
    }
    out
}

/// Learnable sinks (part of every run; `check --sinks` runs them alone), the forward families'
/// every head dim (quick: D64, D128),
/// both masks: Sq = Sk with GQA, Sq < Sk in f16, Sq > Sk (causal rows with no key: o = 0, lse =
/// the sink), decode over 4k keys (GQA heads packed as rows, each its own head's sink; split
/// as the dispatcher splits it), gpt-oss's window (128, 0), and a softcap with ALiBi; for the
/// family that splits, forced splits (the combine folds the sink): Sq > 1 causal, Sq > Sk
/// (rows every split finds empty), MQA decode over more splits than some rows' keys.
pub fn sinks_specs(family: KernelFamily, quick: bool) -> Vec<Spec> {
    let head_dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !quick || d == 64 || d == 128).collect();
    let mut out = Vec::new();
    for &d in &head_dims {
        for causal in [false, true] {
            let with_sinks = |b, sq, sk, hq, hkv, dtype| Spec {
                sinks: true,
                ..Spec::new(Case::new(b, sq, sk, hq, hkv, d, causal, dtype), Inputs::Normal, Storage::Bshd)
            };
            out.push(with_sinks(1, 1000, 1000, 8, 2, DType::BF16));
            out.push(with_sinks(2, 257, 1000, 4, 1, DType::F16));
            out.push(with_sinks(2, 1000, 257, 8, 2, DType::BF16));
            out.push(with_sinks(3, 1, 4097, 8, 2, DType::BF16));
            if !quick {
                out.push(Spec { window: Window::new(128, 0), ..with_sinks(1, 1000, 1000, 8, 2, DType::BF16) });
                let capped =
                    Spec::with_mods(Case::new(1, 1000, 300, 4, 2, d, causal, DType::BF16), Inputs::LargeLogits, Window::UNBOUNDED, 30.0);
                out.push(Spec { sinks: true, ..capped.with_alibi(Alibi::PerHead) });
            }
            if family == KernelFamily::FwdSm80 {
                out.push(Spec { splits: Some(3), ..with_sinks(2, 113, 1000, 4, 2, DType::BF16) });
                out.push(Spec { splits: Some(2), ..with_sinks(1, 300, 200, 4, 2, DType::F16) });
                if !quick {
                    out.push(Spec { splits: Some(64), ..with_sinks(2, 1, 1000, 8, 1, DType::BF16) });
                }
            }
        }
    }
    out
}

/// V's own head dim (`check --value-dim`): each (D, Dv) pair fwd_sm90 has a form for
/// (`fwd_sm90::VALUE_HEAD_DIMS`), both dtypes and masks, over odd lengths both ways, GQA,
/// decode, large logits, BHSD strides, a window, a softcap with ALiBi, a chunk and sinks (every
/// form calls with the pair reach); other families have none. Apart from the other runs while
/// the library refuses the pairs (`dispatch::value_head_dim_form`).
pub fn value_dim_specs(family: KernelFamily, quick: bool) -> Vec<Spec> {
    if family != KernelFamily::FwdSm90 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in super::ValueDimPoint::forward() {
        let plain = |c| Spec::new(c, Inputs::Normal, Storage::Bshd);
        out.push(plain(p.case(1, 1000, 1000, 8, 2)));
        out.push(plain(p.case(2, 113, 1000, 4, 1)));
        out.push(plain(p.case(2, 1000, 113, 8, 8)));
        out.push(plain(p.case(3, 1, 4097, 8, 2)));
        if quick {
            continue;
        }
        out.push(Spec { scale: Some(1.0), ..Spec::new(p.case(1, 130, 600, 4, 2), Inputs::LargeLogits, Storage::Bshd) });
        out.push(Spec::new(p.case(2, 257, 257, 4, 2), Inputs::RisingLogits, Storage::Bhsd));
        out.push(Spec::with_mods(p.case(1, 1000, 1000, 8, 2), Inputs::Normal, Window::new(100, 20), 0.0));
        out.push(Spec::with_mods(p.case(1, 600, 300, 4, 2), Inputs::LargeLogits, Window::UNBOUNDED, 30.0).with_alibi(Alibi::PerHead));
        out.push(Spec { chunk: 256, ..plain(p.case(1, 1000, 1000, 4, 2)) });
        out.push(Spec { sinks: true, ..plain(p.case(2, 300, 1000, 8, 2)) });
    }
    out.extend(qv_specs(quick));
    out
}

/// FlashAttention-3's `qv` (`fwd_sm90::QV_HEAD_DIMS`, dense keys), at its default scale (D +
/// Dv)^-1/2: both dtypes and masks over odd lengths both ways and GQA; beyond quick, decode,
/// a window with a softcap on large logits, sinks.
fn qv_specs(quick: bool) -> Vec<Spec> {
    let mut out = Vec::new();
    for p in super::ValueDimPoint::forward().filter(|p| flashcore::kernels::QV_HEAD_DIMS.contains(&(p.head_dim, p.head_dim_v))) {
        let scale = Some(1.0 / ((p.head_dim + p.head_dim_v) as f32).sqrt());
        let qv = |c, inputs| Spec { qv: true, scale, ..Spec::new(c, inputs, Storage::Bshd) };
        out.push(qv(p.case(1, 1000, 1000, 8, 2), Inputs::Normal));
        out.push(qv(p.case(2, 113, 1000, 4, 1), Inputs::Normal));
        out.push(qv(p.case(2, 1000, 113, 8, 8), Inputs::Normal));
        if quick {
            continue;
        }
        out.push(qv(p.case(3, 1, 4097, 8, 2), Inputs::Normal));
        out.push(Spec { window: Window::new(100, 20), softcap: 30.0, ..qv(p.case(1, 600, 300, 4, 2), Inputs::LargeLogits) });
        out.push(Spec { sinks: true, ..qv(p.case(2, 300, 1000, 8, 2), Inputs::Normal) });
    }
    out
}

/// Dropout (fwd_sm80's and fwd_sm90's forms): p 0.17 on Sq < Sk with GQA, 0.5 with a window and ALiBi per
/// sequence on Sq > Sk, 0.1 in decode (no GQA packing under dropout).
fn dropout_specs(d: usize, causal: bool, dtype: DType, quick: bool) -> Vec<Spec> {
    let drop = |p, offset| Some(flashcore::Dropout { p, seed: 0x5eed_d0d0 ^ d as u64, offset });
    let mut out =
        vec![Spec { dropout: drop(0.17, 0), ..Spec::new(Case::new(1, 200, 1000, 4, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd) }];
    if !quick {
        let case = Case::new(2, 300, 257, 8, 2, d, causal, dtype);
        out.push(Spec {
            dropout: drop(0.5, 7),
            ..Spec::with_mods(case, Inputs::Normal, Window::new(100, 20), 0.0).with_alibi(Alibi::PerSequence)
        });
        out.push(Spec { dropout: drop(0.1, 3), ..Spec::new(Case::new(2, 1, 1000, 8, 2, d, causal, dtype), Inputs::Normal, Storage::Bshd) });
    }
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

/// Runs `family` on the inputs into NaN-poisoned buffers; returns (o, lse).
fn run_poisoned(
    ctx: &Context,
    family: KernelFamily,
    spec: &Spec,
    (q, k, v): (&Stored, &Stored, &Stored),
    qv: Option<&Stored>,
) -> Result<(Vec<u16>, Vec<f32>)> {
    let case = &spec.case;
    let params = AttnParams {
        causal: case.causal,
        kernel: Some(family),
        num_splits: spec.splits,
        softmax_scale: Some(spec.scale()),
        window: spec.window,
        attention_chunk: spec.chunk,
        softcap: spec.softcap,
        dropout: spec.dropout,
        ..AttnParams::default()
    };
    let lse_len = case.batch * case.heads_q * case.seqlen_q;
    let slopes = upload_slopes(ctx, &spec.slopes())?;
    let state = upload_dropout_state(ctx, spec.dropout)?;
    let sinks = upload_slopes(ctx, &spec.sinks())?;
    let inputs = FwdInputs {
        alibi_slopes: slopes.as_ref().map(AlibiSlopes::of),
        dropout_state: state.as_ref().map(DropoutState::of),
        learnable_sink: sinks.as_ref().map(LearnableSinks::of),
        qv: qv.map(Stored::view),
        ..FwdInputs::dense(q.view(), k.view(), v.view())
    };
    poisoned_run(ctx, case.o_shape(), case.dtype, lse_len, |o, lse| {
        ctx.attention_into(&inputs, FwdOutputs { o, lse: Some(LseViewMut::of(lse)), probs: None }, &params)
    })
}

pub fn check_one(ctx: &Context, family: KernelFamily, spec: &Spec) -> Result<Outcome> {
    let case = &spec.case;
    let host = random_qkv(case, spec.inputs, 0x5eed ^ case.seqlen_q as u64 ^ ((case.head_dim as u64) << 20));
    let up = |data: &[f32], shape| Stored::upload(ctx, data, shape, case.dtype, spec.storage);
    let (q, k, v) = (up(&host.q, case.q_shape())?, up(&host.k, case.kv_shape())?, up(&host.v, case.v_shape())?);
    let qv_host = spec.qv.then(|| normal(case.o_shape().iter().product(), 1.0, case.dtype, 0x9b ^ case.seqlen_q as u64));
    let qv = qv_host.as_deref().map(|h| up(h, case.o_shape())).transpose()?;

    let first = run_poisoned(ctx, family, spec, (&q, &k, &v), qv.as_ref())?;
    let deterministic = same_bits(&first, &run_poisoned(ctx, family, spec, (&q, &k, &v), qv.as_ref())?);
    let (o_bits, lse) = first;
    let o: Vec<f32> = o_bits.iter().map(|&b| case.dtype.decode(b)).collect();

    let (oracle, ref_o, ref_lse) = oracle(ctx, family, spec, (&host, qv_host.as_deref()), &q, &k, &v)?;
    let (rel, max_abs, lse_err, failure) = judge(&o, &ref_o, &lse, &ref_lse, case.dtype, deterministic);
    let splits = spec.splits.map(|n| format!("_split{n}")).unwrap_or_default();
    let scale = spec.scale.map(|s| format!("_scale{s}")).unwrap_or_default();
    let bhsd = if spec.storage == Storage::Bhsd { "_bhsd" } else { "" };
    let score = super::score_suffix(spec.window, spec.softcap) + &super::chunk_suffix(spec.chunk);
    let drop = spec.dropout.map(|d| format!("_dropout{}", d.p)).unwrap_or_default();
    let sinks = if spec.sinks { "_sinks" } else { "" };
    let qv_suffix = if spec.qv { "_qv" } else { "" };
    let name =
        format!("{}{}{bhsd}{splits}{scale}{score}{}{drop}{sinks}{qv_suffix}", case.name, inputs_suffix(spec.inputs), spec.alibi.suffix());
    Ok(Outcome { spec_name: name, kernel: family, oracle, rel, max_abs, lse_err, deterministic, failure })
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
    (host, qv): (&HostQkv, Option<&[f32]>),
    q: &Stored,
    k: &Stored,
    v: &Stored,
) -> Result<(&'static str, Vec<f64>, Vec<f64>)> {
    let case = &spec.case;
    let work = case.batch * case.heads_q * case.seqlen_q * case.seqlen_k * case.head_dim;
    if work <= CPU_REFERENCE_MAX_WORK {
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let slopes = wide_slopes(&spec.slopes());
        let sinks = wide_slopes(&spec.sinks());
        let qv = qv.map(wide).unwrap_or_default();
        let mask = RefMask {
            causal: case.causal,
            window: (spec.window != Window::UNBOUNDED).then_some(spec.window),
            chunk: spec.chunk,
            softcap: spec.softcap as f64,
            sinks: &sinks,
            alibi_slopes: &slopes,
            dropout: spec.dropout,
            qv: &qv,
            ..RefMask::default()
        };
        let r = reference::attention_masked(&wide(&host.q), &wide(&host.k), &wide(&host.v), &case.shape(), spec.scale() as f64, &mask);
        return Ok(("cpu-f64", r.o, r.lse));
    }
    if family == KernelFamily::Reference || spec.qv {
        bail!("case {} is too large for the CPU oracle, which alone checks the GPU reference and qv", case.name);
    }
    let (o, lse) = run_poisoned(ctx, KernelFamily::Reference, &Spec { splits: None, ..spec.clone() }, (q, k, v), None)?;
    Ok(("gpu-ref", o.iter().map(|&b| case.dtype.decode(b) as f64).collect(), lse.iter().map(|&x| x as f64).collect()))
}
