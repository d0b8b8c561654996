//! `flashcore check`'s e4m3 forward cases (fwd_sm90's FC_FP8 forms): odd lengths both ways,
//! GQA, decode, a window, large logits, with and without descales; each into NaN-poisoned
//! buffers, twice (bitwise). The oracle runs in f64 on the dequantized inputs (the e4m3 values
//! times their descales), and the bound is an emulation's: the same f64 attention with only P
//! rounded to e4m3 before P·V (the kernels' one rounding besides the output's), whose output
//! rounded to bf16 gives the error an exact e4m3 kernel would have; the kernel's relative L2
//! error may be at most 1.1 times it (issue 53's criterion (b)), plus what the tensor cores'
//! own FP8 arithmetic adds: an e4m3 wgmma accumulates with about 13-14 mantissa bits (as
//! DeepSeek-V3's report measured on H800), so scores, and the LSE, are good to about 2^-13
//! of the sums of the products' sizes, which for rows of large logits outweighs P's rounding.
//! The output's bound takes 2^-12 of the case's largest |LSE| (the size of its largest scores)
//! for it; each row's LSE may be off by 2e-3 plus 2^-12 of the size its scores' products can
//! reach, scale·‖q_i‖·max_j ‖k_j‖ (Cauchy-Schwarz) with the descales.

use anyhow::Result;
use flashcore::reference::RefMask;
use flashcore::{reference, AttnParams, Context, DType, DeviceVec, Fp8Descales, FwdInputs, FwdOutputs, KernelFamily, LseViewMut, Window};

use crate::cases::{errors, random_qkv, Case, Inputs, Storage, Stored};
use crate::check::outcome::Outcome;
use crate::check::poison::{poisoned_run, same_bits};
use crate::check::upload_slopes;

/// How far the kernel's error may exceed the emulation's (issue 53's criterion (b)).
const OVER_EMULATION: f64 = 1.1;
/// The FP8 wgmma's accumulation error, relative to a row's largest scores (see above).
const SCORE_PRECISION: f64 = 1.0 / 4096.0;

#[derive(Clone)]
pub struct Spec {
    pub case: Case,
    inputs: Inputs,
    /// Sliding window (`Window::UNBOUNDED`: none).
    window: Window,
    /// FlashAttention-3's descales, one a (sequence, KV head), `[0.25, 4]`; else none (1).
    descales: bool,
}

/// The e4m3 cases of `family` (fwd_sm90's alone): every head dim fwd_sm90 has (D64 and D96 run
/// as D128, D192 as D256: zero-filled columns) and a padded one, both masks; beyond quick, the
/// odd shapes, decode, a window and large logits.
pub fn specs(family: KernelFamily, quick: bool) -> Vec<Spec> {
    if family != KernelFamily::FwdSm90 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let dims: &[usize] = if quick { &[64, 128, 256] } else { &[64, 80, 96, 128, 192, 256] };
    for &d in dims {
        for causal in [false, true] {
            let case = |b, sq, sk, hq, hkv| Case::new(b, sq, sk, hq, hkv, d, causal, DType::E4M3);
            let spec = |case, inputs, window, descales| Spec { case, inputs, window, descales };
            out.push(spec(case(1, 1000, 1000, 8, 2), Inputs::Normal, Window::UNBOUNDED, true));
            out.push(spec(case(2, 113, 1000, 4, 1), Inputs::Normal, Window::UNBOUNDED, false));
            if quick {
                continue;
            }
            out.push(spec(case(2, 1000, 113, 8, 8), Inputs::Normal, Window::UNBOUNDED, true));
            out.push(spec(case(3, 1, 4097, 8, 2), Inputs::Normal, Window::UNBOUNDED, true));
            out.push(spec(case(2, 257, 333, 4, 2), Inputs::LargeLogits, Window::UNBOUNDED, true));
            out.push(spec(case(1, 1000, 1000, 8, 2), Inputs::Normal, Window::new(100, 20), true));
        }
    }
    out
}

impl Spec {
    /// Descales of `heads_kv` KV heads over the batch, one a (sequence, KV head), from `[0.25,
    /// 4]`, different for q, k and v (`which`); none without `descales`.
    fn descale_values(&self, which: usize) -> Vec<f32> {
        if !self.descales {
            return Vec::new();
        }
        let n = self.case.batch * self.case.heads_kv;
        (0..n).map(|i| [0.25, 0.5, 1.0, 2.0, 4.0, 0.75, 1.5][(i * 3 + which * 2) % 7]).collect()
    }

    fn name(&self) -> String {
        let inputs = if self.inputs == Inputs::LargeLogits { "_large-logits" } else { "" };
        let descales = if self.descales { "_descales" } else { "" };
        format!("{}{inputs}{}{descales}", self.case.name, super::score_suffix(self.window, 0.0))
    }
}

/// The host values times their descales: `x` is `[B, seqlen, heads, D]`, `heads` being Hq
/// (q: a query head takes its KV head's descale) or Hkv (k, v).
fn dequantized(x: &[f32], descales: &[f32], case: &Case, seqlen: usize, heads: usize) -> Vec<f64> {
    let (group, row) = (heads / case.heads_kv, heads * case.head_dim);
    x.iter()
        .enumerate()
        .map(|(i, &x)| {
            let (b, h) = (i / row / seqlen, (i % row) / case.head_dim / group);
            x as f64 * descales.get(b * case.heads_kv + h).map_or(1.0, |&s| s as f64)
        })
        .collect()
}

/// For each LSE row (`[B, Hq, Sq]`), the size its scores' sums of products can reach:
/// `scale·‖q_i‖·max_j ‖k_j‖` over the keys of its KV head (dequantized values).
fn score_reach(q: &[f64], k: &[f64], case: &Case, scale: f64) -> Vec<f64> {
    let (d, group) = (case.head_dim, case.heads_q / case.heads_kv);
    let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
    let mut longest_key = vec![0f64; case.batch * case.heads_kv];
    for (r, row) in k.chunks(d).enumerate() {
        let (b, h) = (r / case.heads_kv / case.seqlen_k, r % case.heads_kv);
        let l = &mut longest_key[b * case.heads_kv + h];
        *l = l.max(norm(row));
    }
    let mut reach = vec![0f64; case.batch * case.heads_q * case.seqlen_q];
    for (r, row) in q.chunks(d).enumerate() {
        let (b, i, h) = (r / case.heads_q / case.seqlen_q, (r / case.heads_q) % case.seqlen_q, r % case.heads_q);
        reach[(b * case.heads_q + h) * case.seqlen_q + i] = scale * norm(row) * longest_key[b * case.heads_kv + h / group];
    }
    reach
}

pub fn check_one(ctx: &Context, spec: &Spec) -> Result<Outcome> {
    let case = &spec.case;
    let host = random_qkv(case, spec.inputs, 0xf8 ^ case.seqlen_q as u64 ^ ((case.head_dim as u64) << 20));
    let up = |data: &[f32], shape| Stored::upload(ctx, data, shape, case.dtype, Storage::Bshd);
    let (q, k, v) = (up(&host.q, case.q_shape())?, up(&host.k, case.kv_shape())?, up(&host.v, case.v_shape())?);
    let descales = [0, 1, 2].map(|which| spec.descale_values(which));
    let uploaded = descales.iter().map(|d| upload_slopes(ctx, d)).collect::<Result<Vec<_>>>()?;
    let of = |i: usize| uploaded[i].as_ref().map(DeviceVec::of);
    let params = AttnParams { causal: case.causal, kernel: Some(KernelFamily::FwdSm90), window: spec.window, ..AttnParams::default() };
    let inputs = FwdInputs::dense(q.view(), k.view(), v.view()).with_descales(Fp8Descales { q: of(0), k: of(1), v: of(2) });
    let lse_len = case.batch * case.heads_q * case.seqlen_q;
    let out = case.dtype.output();
    let run = || {
        poisoned_run(ctx, case.o_shape(), out, lse_len, |o, lse| {
            ctx.attention_into(&inputs, FwdOutputs { o, lse: Some(LseViewMut::of(lse)), probs: None }, &params)
        })
    };
    let first = run()?;
    let deterministic = same_bits(&first, &run()?);
    let (o_bits, lse) = first;
    let o: Vec<f32> = o_bits.iter().map(|&b| out.decode(b)).collect();

    let (rq, rk, rv) = (
        dequantized(&host.q, &descales[0], case, case.seqlen_q, case.heads_q),
        dequantized(&host.k, &descales[1], case, case.seqlen_k, case.heads_kv),
        dequantized(&host.v, &descales[2], case, case.seqlen_k, case.heads_kv),
    );
    let mask = RefMask { causal: case.causal, window: (spec.window != Window::UNBOUNDED).then_some(spec.window), ..RefMask::default() };
    let scale = 1.0 / (case.head_dim as f64).sqrt();
    let exact = reference::attention_masked(&rq, &rk, &rv, &case.shape(), scale, &mask);
    let emulated = reference::attention_masked(&rq, &rk, &rv, &case.shape(), scale, &RefMask { p_rounding: Some(DType::E4M3), ..mask });
    let emulated_o: Vec<f32> = emulated.o.iter().map(|&x| out.decode(out.encode(x as f32))).collect();
    let (emulation, _) = errors(&emulated_o, &exact.o);
    let largest = exact.lse.iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()));
    let bound = OVER_EMULATION * emulation + SCORE_PRECISION * largest;
    let (rel, max_abs) = errors(&o, &exact.o);
    // Each row's LSE error against its own bound.
    let reach = score_reach(&rq, &rk, case, scale);
    let (mut lse_err, mut lse_over) = (0f64, None);
    for (i, (&got, &want)) in lse.iter().zip(&exact.lse).enumerate() {
        if !want.is_finite() {
            if got != f32::NEG_INFINITY {
                lse_over = Some(format!("lse[{i}] = {got} for a fully masked row, want -inf"));
            }
            continue;
        }
        let err = (got as f64 - want).abs();
        lse_err = lse_err.max(err);
        if err.is_nan() || err > 2e-3 + SCORE_PRECISION * reach[i] {
            lse_over = Some(format!("lse[{i}] = {got}, want {want:.4}: error beyond 2e-3 + 2^-12 x {:.1}", reach[i]));
        }
    }
    let failure = if o.iter().any(|x| !x.is_finite()) {
        Some("NaN/Inf in the output (unwritten or overflowed elements)".to_string())
    } else if rel > bound {
        Some(format!("rel error {rel:.2e} > {OVER_EMULATION} x the e4m3-P emulation's {emulation:.2e} + 2^-12 x |lse| {largest:.1}"))
    } else if lse_over.is_some() {
        lse_over
    } else if !deterministic {
        Some("two runs differ bitwise".to_string())
    } else {
        None
    };
    Ok(Outcome { spec_name: spec.name(), kernel: KernelFamily::FwdSm90, oracle: "cpu-f64", rel, max_abs, lse_err, deterministic, failure })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value takes the descale of its (sequence, KV head): q's heads by group.
    #[test]
    fn dequantizing_takes_each_sequences_kv_heads_descale() {
        let case = Case::new(2, 3, 3, 4, 2, 16, false, DType::E4M3);
        let descales = [1.0, 2.0, 3.0, 4.0]; // [B, Hkv]
        let ones = |heads: usize| vec![1f32; 2 * 3 * heads * 16];
        let q = dequantized(&ones(4), &descales, &case, 3, 4);
        let k = dequantized(&ones(2), &descales, &case, 3, 2);
        // q [b, s, h, d]: head h of sequence b has KV head h / 2.
        let at = |x: &[f64], heads: usize, b: usize, s: usize, h: usize| x[((b * 3 + s) * heads + h) * 16 + 5];
        assert_eq!([at(&q, 4, 0, 1, 1), at(&q, 4, 0, 2, 2), at(&q, 4, 1, 0, 3)], [1.0, 2.0, 4.0]);
        assert_eq!([at(&k, 2, 0, 2, 1), at(&k, 2, 1, 1, 0)], [2.0, 3.0]);
        assert_eq!(dequantized(&ones(2), &[], &case, 3, 2), vec![1.0; 2 * 3 * 2 * 16], "no descales: 1");
    }
}
