//! The backward's part of `flashcore check` (the reference kernels, bwd_sm80, bwd_sm90): gradients
//! against the f64 oracle (`reference::attention_backward`), NaN-poisoned gradient buffers,
//! bitwise determinism (of everything in deterministic mode and of the reference kernels; of
//! dk and dv otherwise, since dq's atomics add in a varying order).
//!
//! Tolerance: relative L2 error of each of dq, dk and dv, bf16 ≤ 1e-2 and fp16 ≤ 2e-3, as
//! for the forward (docs/design.md §8). The reference kernels compute in f32 from the rounded
//! inputs (D_i from P and dP, not from the stored o: see `kernels/reference.cu`), so what
//! remains is the rounding of the gradients themselves, ~2^-9 (bf16) and ~2^-12 (fp16)
//! relative per element: measured 1.7e-3 and 2.1e-4 on normal inputs. bwd_sm80 adds P and
//! dS rounded to 16 bits for the tensor cores, and D_i = rowsum(dout ∘ o) from the stored,
//! rounded o, as FlashAttention does. With large logits (a nearly one-hot softmax) dS =
//! P ∘ (dP − D_i) cancels and o's rounding shows in dq and dk: there the bf16 bound is
//! 1.5e-2. FlashAttention-2 (SDPA's flash backend) measures 5.7e-3 to 6.7e-3 on such inputs
//! (H100, D64-D256), bwd_sm80 5.9e-3 to 1.02e-2 (D192 the worst; fp16 1.6e-3 against 9.7e-4):
//! `python/tests/test_backward.py` holds bwd_sm80 to 2x FlashAttention-2's error there.

use anyhow::Result;
use flashcore::reference::RefMask;
use flashcore::{
    reference, AlibiSlopes, AttnParams, BwdInputs, Context, DType, DeviceTensor, DropoutState, FwdInputs, GradsMut, KernelFamily, KvLayout,
    LearnableSinks, LseView, SinkGradMut, Window,
};

use crate::cases::{errors, normal, random_qkv, Case, Inputs, Storage, Stored};
use crate::check::outcome::{grad_tolerance, judge_dsink, same_bits, Outcome};
use crate::check::{upload_dropout_state, upload_slopes, wide_slopes, Alibi};

/// A backward case: the kernels, the problem, its inputs and the storage of q, k, v and dout,
/// and the score policies (a sliding window, `Window::UNBOUNDED` for none; a softcap, 0 off;
/// ALiBi).
pub struct BwdSpec {
    family: KernelFamily,
    deterministic: bool,
    case: Case,
    inputs: Inputs,
    storage: Storage,
    window: Window,
    pub chunk: usize,
    softcap: f32,
    pub alibi: Alibi,
    dropout: Option<flashcore::Dropout>,
    /// Learnable sinks in the forward (`cases::sink_values`): the backward's dQ, dK and dV take
    /// them through the forward's LSE alone; their own gradient (`GradsMut::dsink`) is checked.
    pub sinks: bool,
}

impl BwdSpec {
    pub fn head_dim(&self) -> usize {
        self.case.head_dim
    }

    pub fn has_dropout(&self) -> bool {
        self.dropout.is_some()
    }

    pub fn family(&self) -> KernelFamily {
        self.family
    }

    pub fn case_name(&self) -> &str {
        &self.case.name
    }

    /// V has a head dim of its own (`check --value-dim`).
    pub fn own_value_dim(&self) -> bool {
        self.case.head_dim_v.is_some()
    }
}

impl BwdSpec {
    fn new(family: KernelFamily, deterministic: bool, case: Case, inputs: Inputs, storage: Storage) -> Self {
        Self {
            family,
            deterministic,
            case,
            inputs,
            storage,
            window: Window::UNBOUNDED,
            chunk: 0,
            softcap: 0.0,
            alibi: Alibi::Off,
            dropout: None,
            sinks: false,
        }
    }

    fn params(&self) -> AttnParams {
        AttnParams {
            causal: self.case.causal,
            window: self.window,
            attention_chunk: self.chunk,
            softcap: self.softcap,
            dropout: self.dropout,
            ..AttnParams::default()
        }
    }
}

/// The backward cases: every head dim, dtype and mask; odd lengths, Sq ≠ Sk both ways
/// (with rows that see no key), GQA 1/4/8, BHSD strides, large logits; the fast kernels'
/// deterministic mode on a quarter of them (half of the smoke cases) and the longest; the
/// score policies (`mods_specs`).
pub fn specs(family: KernelFamily, quick: bool, smoke: bool) -> Vec<BwdSpec> {
    let lengths: &[(usize, usize)] = if smoke {
        &[(130, 200)]
    } else if quick {
        &[(1, 1), (113, 113), (7, 300)]
    } else {
        &[(1, 1), (7, 7), (113, 113), (1000, 1000), (113, 1000), (1000, 113), (1, 4097), (7, 4097)]
    };
    let mut out = Vec::new();
    let mut n = 0usize;
    for dtype in [DType::BF16, DType::F16] {
        for &d in family.head_dims() {
            if quick && d != 64 && d != 128 {
                continue;
            }
            for causal in [false, true] {
                for &(sq, sk) in lengths {
                    let (hkv, ratio) = [(2, 1), (1, 4), (1, 8)][n % 3];
                    n += 1;
                    let storage = if n.is_multiple_of(5) { Storage::Bhsd } else { Storage::Bshd };
                    let every = if smoke { 2 } else { 4 };
                    let deterministic = family != KernelFamily::Reference && n % every == every - 1;
                    let case = Case::new(2, sq, sk, hkv * ratio, hkv, d, causal, dtype);
                    out.push(BwdSpec::new(family, deterministic, case, Inputs::Normal, storage));
                }
                if !smoke {
                    let case = Case::new(1, 200, 300, 4, 2, d, causal, dtype);
                    out.push(BwdSpec::new(family, false, case, Inputs::LargeLogits, Storage::Bshd));
                }
                out.extend(mods_specs(family, d, causal, dtype, quick, smoke));
                if matches!(family, KernelFamily::BwdSm80 | KernelFamily::BwdSm90) && !smoke {
                    // Dropout: the forward's mask regenerated, deterministic or not.
                    let drop = |p, offset| Some(flashcore::Dropout { p, seed: 0xd0d0 ^ d as u64, offset });
                    let case = Case::new(2, 113, 300, 4, 2, d, causal, dtype);
                    out.push(BwdSpec { dropout: drop(0.17, 0), ..BwdSpec::new(family, false, case, Inputs::Normal, Storage::Bshd) });
                    let case = Case::new(2, 300, 257, 8, 2, d, causal, dtype);
                    out.push(BwdSpec {
                        dropout: drop(0.5, 9),
                        window: Window::new(100, 20),
                        softcap: 30.0,
                        alibi: Alibi::PerSequence,
                        ..BwdSpec::new(family, true, case, Inputs::LargeLogits, Storage::Bshd)
                    });
                }
            }
        }
    }
    // The head dims run as the next size (`check::padded_dims`): odd lengths, GQA, BHSD
    // strides, deterministic mode, large logits, a window with a softcap; bf16, f16 once.
    for d in crate::check::padded_dims(family, quick, smoke) {
        for causal in [false, true] {
            let lengths: &[(usize, usize)] = if smoke { &[(130, 200)] } else { &[(1, 1), (113, 113), (1000, 113), (7, 300)] };
            for (i, &(sq, sk)) in lengths.iter().enumerate() {
                let (hkv, ratio) = [(2, 1), (1, 4), (1, 8)][i % 3];
                let storage = if i == 2 { Storage::Bhsd } else { Storage::Bshd };
                let dtype = if i == 3 { DType::F16 } else { DType::BF16 };
                out.push(BwdSpec::new(
                    family,
                    i % 2 == 1,
                    Case::new(2, sq, sk, hkv * ratio, hkv, d, causal, dtype),
                    Inputs::Normal,
                    storage,
                ));
            }
            if !smoke {
                out.push(BwdSpec::new(
                    family,
                    false,
                    Case::new(1, 200, 300, 4, 2, d, causal, DType::BF16),
                    Inputs::LargeLogits,
                    Storage::Bshd,
                ));
                let case = Case::new(1, 1000, 300, 4, 2, d, causal, DType::BF16);
                out.push(BwdSpec {
                    window: Window::new(64, 64),
                    softcap: 30.0,
                    ..BwdSpec::new(family, false, case, Inputs::LargeLogits, Storage::Bshd)
                });
                let case = Case::new(2, 300, 1000, 8, 2, d, causal, DType::BF16);
                out.push(BwdSpec { alibi: Alibi::PerSequence, ..BwdSpec::new(family, true, case, Inputs::Normal, Storage::Bshd) });
            }
        }
    }
    if !quick && !smoke {
        for causal in [false, true] {
            for deterministic in [false, true] {
                if deterministic && family == KernelFamily::Reference {
                    continue;
                }
                let case = || Case::new(1, 4097, 4097, 2, 1, 64, causal, DType::BF16);
                out.push(BwdSpec::new(family, deterministic, case(), Inputs::Normal, Storage::Bshd));
                // Many key blocks under a window: bwd_sm90's deterministic order over the key
                // blocks that see a query block (from the first, not from key block 0).
                let window = Window::new(1000, 100);
                out.push(BwdSpec { window, ..BwdSpec::new(family, deterministic, case(), Inputs::Normal, Storage::Bshd) });
            }
        }
    }
    if !smoke {
        out.extend(chunk_specs(family, quick));
    }
    out
}

/// Learnable sinks through the backward (`check --sinks`): the forward with sinks (the default
/// kernel), then each backward family's dQ, dK, dV and dsink against the f64 oracle with the
/// same sinks, every head dim (quick: D64, D128), both masks: two sequences of Sq = Sk with GQA
/// (dsink sums over both), Sq < Sk, Sq > Sk (rows with no key), a window (gpt-oss's 128),
/// every other one deterministic.
pub fn sinks_specs(family: KernelFamily, quick: bool) -> Vec<BwdSpec> {
    let head_dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !quick || d == 64 || d == 128).collect();
    let fast = family != KernelFamily::Reference;
    let mut out = Vec::new();
    for &d in &head_dims {
        for causal in [false, true] {
            let shapes = [(2, 1000, 1000, 8, 2), (1, 257, 1000, 4, 1), (1, 1000, 257, 8, 2)];
            for (i, (b, sq, sk, hq, hkv)) in shapes.into_iter().enumerate() {
                let case = Case::new(b, sq, sk, hq, hkv, d, causal, DType::BF16);
                out.push(BwdSpec { sinks: true, ..BwdSpec::new(family, fast && i % 2 == 1, case, Inputs::Normal, Storage::Bshd) });
            }
            if !quick {
                let case = Case::new(1, 1000, 1000, 8, 2, d, causal, DType::BF16);
                out.push(BwdSpec {
                    sinks: true,
                    window: Window::new(128, 0),
                    ..BwdSpec::new(family, false, case, Inputs::Normal, Storage::Bshd)
                });
            }
        }
    }
    out
}

/// V's own head dim's backward (`check --value-dim`): bwd_sm90's forms of its pairs
/// (`flashcore::kernels::BACKWARD_VALUE_HEAD_DIMS`), both dtypes and masks: GQA, Sq < Sk, Sq > Sk (rows
/// that see no key), one deterministic; beyond quick, a window, a softcap with ALiBi, a chunk,
/// learnable sinks (their gradient), BHSD strides.
pub fn value_dim_specs(family: KernelFamily, quick: bool) -> Vec<BwdSpec> {
    if family != KernelFamily::BwdSm90 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in super::ValueDimPoint::backward() {
        let plain = |c, deterministic| BwdSpec::new(family, deterministic, c, Inputs::Normal, Storage::Bshd);
        out.push(plain(p.case(1, 1000, 1000, 8, 2), false));
        out.push(plain(p.case(2, 113, 1000, 4, 1), true));
        out.push(plain(p.case(2, 1000, 113, 8, 8), false));
        if quick {
            continue;
        }
        out.push(BwdSpec { window: Window::new(100, 20), ..plain(p.case(1, 1000, 1000, 8, 2), true) });
        let capped =
            BwdSpec { softcap: 30.0, ..BwdSpec::new(family, false, p.case(2, 600, 300, 4, 2), Inputs::LargeLogits, Storage::Bshd) };
        out.push(BwdSpec { alibi: Alibi::PerHead, ..capped });
        out.push(BwdSpec { chunk: 256, ..plain(p.case(1, 1000, 1000, 4, 2), false) });
        out.push(BwdSpec { sinks: true, ..plain(p.case(2, 300, 1000, 8, 2), false) });
        out.push(BwdSpec::new(family, false, p.case(2, 257, 257, 4, 2), Inputs::Normal, Storage::Bhsd));
    }
    out
}

/// Chunked attention's backward (`check --chunk` alone), every head dim (quick: D64, D128), both
/// masks: chunks aligned to the key blocks and not, Sq > Sk and Sq < Sk, a chunk of one key,
/// one longer than the keys, with a window, with a softcap and ALiBi; every other one
/// deterministic (the fast kernels: the query blocks a key block visits are the chunk's).
fn chunk_specs(family: KernelFamily, quick: bool) -> Vec<BwdSpec> {
    let head_dims: Vec<usize> = family.head_dims().iter().copied().filter(|&d| !quick || d == 64 || d == 128).collect();
    let fast = family != KernelFamily::Reference;
    let mut out = Vec::new();
    for &d in &head_dims {
        for causal in [false, true] {
            let mut shapes = vec![(1000, 1000, 128, 8, 2), (1000, 1000, 100, 2, 2), (257, 1000, 300, 4, 1), (1000, 257, 64, 8, 2)];
            if !quick {
                shapes.extend([(113, 113, 1, 4, 2), (300, 200, 8192, 4, 2)]);
            }
            for (i, (sq, sk, chunk, hq, hkv)) in shapes.into_iter().enumerate() {
                let case = Case::new(1, sq, sk, hq, hkv, d, causal, DType::BF16);
                out.push(BwdSpec { chunk, ..BwdSpec::new(family, fast && i % 2 == 1, case, Inputs::Normal, Storage::Bshd) });
            }
            if !quick {
                let case = Case::new(1, 1000, 1000, 8, 2, d, causal, DType::BF16);
                out.push(BwdSpec {
                    window: Window::new(127, 0),
                    chunk: 200,
                    ..BwdSpec::new(family, fast, case, Inputs::Normal, Storage::Bshd)
                });
                let case = Case::new(2, 1000, 300, 4, 2, d, causal, DType::BF16);
                let capped = BwdSpec { chunk: 96, softcap: 30.0, ..BwdSpec::new(family, false, case, Inputs::LargeLogits, Storage::Bshd) };
                out.push(BwdSpec { alibi: Alibi::PerHead, ..capped });
            }
        }
    }
    out
}

/// Sliding windows (one key, two, 128 back, ±256, 64 ahead and all back) on square, taller
/// and wider shapes of odd lengths (rows that see no key among them) and GQA 1/4/4, every
/// other one deterministic (the fast kernels); softcaps 30 and 50 on logits that reach about
/// ±30, alone and with a window; ALiBi per head and per sequence, Sq ≠ Sk both ways, alone
/// and with a window and a softcap. Smoke: one window, one softcap, both, ALiBi, all three.
fn mods_specs(family: KernelFamily, d: usize, causal: bool, dtype: DType, quick: bool, smoke: bool) -> Vec<BwdSpec> {
    let with = |case, inputs, window, softcap, deterministic| BwdSpec {
        window,
        softcap,
        ..BwdSpec::new(family, deterministic && family != KernelFamily::Reference, case, inputs, Storage::Bshd)
    };
    let alibi = |alibi, spec: BwdSpec| BwdSpec { alibi, ..spec };
    if smoke {
        let case = || Case::new(1, 130, 200, 4, 2, d, causal, dtype);
        return vec![
            with(case(), Inputs::Normal, Window::new(100, 20), 0.0, true),
            with(case(), Inputs::LargeLogits, Window::UNBOUNDED, 30.0, false),
            with(case(), Inputs::LargeLogits, Window::new(50, -1), 50.0, false),
            alibi(Alibi::PerSequence, with(Case::new(2, 130, 200, 4, 2, d, causal, dtype), Inputs::Normal, Window::UNBOUNDED, 0.0, true)),
            alibi(Alibi::PerHead, with(case(), Inputs::LargeLogits, Window::new(50, -1), 50.0, false)),
        ];
    }
    let windows: &[(i32, i32)] = if quick { &[(127, 0), (-1, 64)] } else { &[(0, 0), (1, 0), (127, 0), (256, 256), (-1, 64)] };
    let shapes = [(1000, 1000), (113, 1000), (1000, 113)];
    let mut out = Vec::new();
    for (i, &(left, right)) in windows.iter().enumerate() {
        let (sq, sk) = shapes[i % shapes.len()];
        let (hq, hkv) = [(8, 2), (2, 2), (4, 1)][i % 3];
        let case = Case::new(1, sq, sk, hq, hkv, d, causal, dtype);
        out.push(with(case, Inputs::Normal, Window::new(left, right), 0.0, i % 2 == 1));
    }
    for &softcap in if quick { &[30.0][..] } else { &[30.0, 50.0][..] } {
        let case = Case::new(1, 200, 1000, 4, 2, d, causal, dtype);
        out.push(with(case, Inputs::LargeLogits, Window::UNBOUNDED, softcap, softcap == 50.0));
    }
    let case = Case::new(2, 1000, 300, 4, 2, d, causal, dtype);
    out.push(with(case, Inputs::LargeLogits, Window::new(64, 64), 30.0, false));
    out.push(alibi(Alibi::PerHead, with(Case::new(2, 1000, 257, 8, 2, d, causal, dtype), Inputs::Normal, Window::UNBOUNDED, 0.0, false)));
    out.push(alibi(
        Alibi::PerSequence,
        with(Case::new(2, 257, 1000, 4, 1, d, causal, dtype), Inputs::Normal, Window::UNBOUNDED, 0.0, true),
    ));
    if !quick {
        let case = Case::new(2, 1000, 300, 4, 2, d, causal, dtype);
        out.push(alibi(Alibi::PerSequence, with(case, Inputs::LargeLogits, Window::new(64, 64), 30.0, true)));
    }
    out
}

/// Runs the forward (default kernel), then the backward twice into NaN-poisoned buffers.
pub fn check_one(ctx: &Context, spec: &BwdSpec) -> Result<Outcome> {
    let case = &spec.case;
    let seed = 0xbacc ^ case.seqlen_q as u64 ^ ((case.head_dim as u64) << 20);
    let host = random_qkv(case, spec.inputs, seed);
    let dout_host = normal(case.o_shape().iter().product(), 1.0, case.dtype, seed ^ 0xd0);
    let up = |data: &[f32], shape| Stored::upload(ctx, data, shape, case.dtype, spec.storage);
    let (q, k, v, dout) =
        (up(&host.q, case.q_shape())?, up(&host.k, case.kv_shape())?, up(&host.v, case.v_shape())?, up(&dout_host, case.o_shape())?);
    let slopes_host = spec.alibi.slopes(case.batch, case.heads_q);
    let slopes = upload_slopes(ctx, &slopes_host)?;
    let alibi_slopes = slopes.as_ref().map(AlibiSlopes::of);
    let sinks_host = super::sink_values(spec.sinks, case.heads_q);
    let sinks = upload_slopes(ctx, &sinks_host)?;
    let learnable_sink = sinks.as_ref().map(LearnableSinks::of);
    let fwd =
        ctx.attention(&FwdInputs { alibi_slopes, learnable_sink, ..FwdInputs::dense(q.view(), k.view(), v.view()) }, &spec.params())?;
    let params = AttnParams { kernel: Some(spec.family), deterministic: spec.deterministic, ..spec.params() };
    // The forward above drew its mask from the host's pair; the backward reads it on the device.
    let state = upload_dropout_state(ctx, spec.dropout)?;
    let dropout_state = state.as_ref().map(DropoutState::of);

    // With sinks, their gradient too (f32 [Hq]; empty without).
    let run = || -> Result<([Vec<u16>; 3], Vec<f32>)> {
        let nan = super::poison::nan_bits(case.dtype);
        let mut dq = DeviceTensor::filled(ctx, nan, case.q_shape(), case.dtype)?;
        let mut dk = DeviceTensor::filled(ctx, nan, case.kv_shape(), case.dtype)?;
        let mut dv = DeviceTensor::filled(ctx, nan, case.v_shape(), case.dtype)?;
        let (o, lse) = (fwd.o.view(), LseView::of(&fwd.lse));
        let dense = BwdInputs::new(q.view(), k.view(), v.view(), o, lse, dout.view(), KvLayout::Dense);
        let inputs = BwdInputs { alibi_slopes, dropout_state, learnable_sink, ..dense };
        let mut dsink = ctx.stream().clone_htod(&vec![f32::NAN; if spec.sinks { case.heads_q } else { 0 }])?;
        let grads = GradsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
        let grads = if spec.sinks { grads.with_dsink(SinkGradMut::of(&mut dsink)) } else { grads };
        ctx.attention_backward_into(&inputs, grads, &params)?;
        Ok(([dq.to_bits(ctx)?, dk.to_bits(ctx)?, dv.to_bits(ctx)?], ctx.stream().clone_dtoh(&dsink)?))
    };
    // bwd_sm80 and bwd_sm90 add dQ with atomics (bulk reduce-adds), in an order that varies
    // run to run, unless deterministic; their dK and dV (no atomics) and everything of the
    // reference kernels must repeat bit for bit.
    let (first, first_dsink) = run()?;
    let (second, second_dsink) = run()?;
    let atomic_dq = matches!(spec.family, KernelFamily::BwdSm80 | KernelFamily::BwdSm90);
    let repeats = if atomic_dq && !spec.deterministic { 1 } else { 0 };
    let deterministic = first[repeats..] == second[repeats..] && same_bits(&first_dsink, &second_dsink);

    let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let scale = 1.0 / (case.head_dim as f64).sqrt();
    let wide_slopes = wide_slopes(&slopes_host);
    let wide_sinks = super::wide_slopes(&sinks_host);
    let mask = RefMask { sinks: &wide_sinks, ..RefMask::of(&spec.params()).with_alibi(&wide_slopes) };
    let want = reference::attention_backward_masked(
        &wide(&host.q),
        &wide(&host.k),
        &wide(&host.v),
        &wide(&dout_host),
        &case.shape(),
        scale,
        &mask,
    );
    let (mut rel, mut max_abs, mut failure) = (0f64, 0f64, None);
    for ((name, bits), want) in ["dq", "dk", "dv"].iter().zip(&first).zip([&want.dq, &want.dk, &want.dv]) {
        let got: Vec<f32> = bits.iter().map(|&b| case.dtype.decode(b)).collect();
        let (r, m) = errors(&got, want);
        if got.iter().any(|x| !x.is_finite()) {
            failure.get_or_insert(format!("NaN/Inf in {name} (unwritten or overflowed elements)"));
        } else if r > grad_tolerance(case.dtype, spec.inputs) {
            failure.get_or_insert(format!("{name} rel error {r:.2e} > {:.1e}", grad_tolerance(case.dtype, spec.inputs)));
        }
        rel = rel.max(r);
        max_abs = max_abs.max(m);
    }
    if spec.sinks {
        let (r, judged) = judge_dsink(&first_dsink, &want.dsinks, &want.dsink_scales, case.dtype);
        let m = first_dsink.iter().zip(&want.dsinks).map(|(&g, w)| (g as f64 - w).abs()).fold(0f64, f64::max);
        failure = failure.or(judged);
        rel = rel.max(r);
        max_abs = max_abs.max(m);
    }
    if !deterministic {
        let what = if repeats == 1 { "dk or dv" } else { "the gradients" };
        failure.get_or_insert(format!("{what} differ bitwise between two runs"));
    }
    let bhsd = if spec.storage == Storage::Bhsd { "_bhsd" } else { "" };
    let large = if spec.inputs == Inputs::LargeLogits { "_large-logits" } else { "" };
    let det = if spec.deterministic { "_deterministic" } else { "" };
    let score = super::score_suffix(spec.window, spec.softcap) + &super::chunk_suffix(spec.chunk);
    Ok(Outcome {
        spec_name: format!(
            "bwd_{}{bhsd}{large}{score}{}{}{}{det}",
            case.name,
            spec.alibi.suffix(),
            spec.dropout.map(|d| format!("_dropout{}", d.p)).unwrap_or_default(),
            if spec.sinks { "_sinks" } else { "" }
        ),
        kernel: spec.family,
        oracle: "cpu-f64",
        rel,
        max_abs,
        lse_err: 0.0,
        deterministic,
        failure,
    })
}
