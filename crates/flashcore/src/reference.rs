//! The f64 CPU reference: the oracle every kernel is checked against.
//!
//! Slow and obviously right: one query row at a time, a plain softmax with the row max
//! subtracted, in f64. Parallel over (batch, query head) with rayon. Same semantics as the
//! kernels (see [`AttnParams`]):
//!
//! - `s_ij = softmax_scale · q_i · k_j` (with FlashAttention-3's `qv`, `RefMask::qv`:
//!   `softmax_scale · (q_i · k_j + qv_i · v_j)`);
//! - causal is bottom-right aligned: query `i` sees key `j` iff `j <= i + Sk - Sq`;
//! - GQA/MQA: query head `h` reads key/value head `h / (Hq / Hkv)`;
//! - a sliding window (`RefMask::window`) keeps keys `i + Sk - Sq - left <= j <= i + Sk - Sq
//!   + right` (`-1`: that side unbounded);
//! - softcap `c > 0` replaces `s_ij` by `c · tanh(s_ij / c)` before the softmax;
//! - ALiBi adds `-slope_bh · |i + Sk - Sq - j|` to the (capped) score (`RefMask::alibi_slopes`);
//! - dropout (`RefMask::dropout`) keeps `P_ij` where the kernels' mask keeps it
//!   ([`crate::Dropout::keeps`]), scaled by `1 / (1 - p)`, in the output and the gradients
//!   (the LSE is the undropped softmax's);
//! - `lse_i = ln Σ_j exp(s_ij)` over the visible keys; a row that sees no key (causal with
//!   `Sq > Sk`, or outside its window) gives `o = 0` and `lse = -inf`, never NaN.

use crate::params::{AttnParams, Window};
use crate::shape::ProblemShape;
use rayon::prelude::*;

/// Output of the reference: `o` is `[B, Sq, Hq, D]` contiguous, `lse` is `[B, Hq, Sq]`
/// (natural log).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceOutput {
    /// Attention output, `[B, Sq, Hq, D]` contiguous.
    pub o: Vec<f64>,
    /// Log-sum-exp of each row's logits, `[B, Hq, Sq]`, natural log; `-inf` for rows that
    /// see no key.
    pub lse: Vec<f64>,
}

/// Which keys each row sees and how its scores are transformed (see the module's rules).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RefMask<'a> {
    /// Causal, bottom-right aligned.
    pub causal: bool,
    /// A sliding window, or none.
    pub window: Option<Window>,
    /// Chunked attention's chunk ([`AttnParams::attention_chunk`]); 0 is off.
    pub chunk: usize,
    /// Logit softcap; 0 is off.
    pub softcap: f64,
    /// Learnable sinks (gpt-oss; FlashAttention-4's `learnable_sink`): one logit a query head,
    /// `[Hq]`, in every row's softmax denominator beside the visible keys' scores, with no value:
    /// `o = Σ exp(s − m)·v / (Σ exp(s − m) + exp(sink − m))`, the LSE including it. Neither
    /// scaled nor softcapped; a row that sees no key gives `o = 0` and `lse = sink`. Empty: none.
    pub sinks: &'a [f64],
    /// ALiBi slopes: `[Hq]` (every sequence's) or `[B, Hq]` row-major; empty is off. Score
    /// `(i, j)` of sequence `b`, head `h` gains `-slope · |i + Sk - Sq - j|` after the softcap.
    pub alibi_slopes: &'a [f64],
    /// Dropout, its mask the kernels' ([`crate::Dropout::keeps`]) for batch entry
    /// `first_batch + b` (a sequence run alone keeps its place in the batch's mask).
    pub dropout: Option<crate::Dropout>,
    /// See `dropout`.
    pub first_batch: usize,
    /// FlashAttention-3's `qv`, `[B, Sq, Hq, Dv]` contiguous like the output: `qv_i · v_j`
    /// joins `q_i · k_j` in every score before the scale. Empty: none.
    pub qv: &'a [f64],
    /// The dtype P is rounded to before P·V, or none: an emulation of a kernel's rounding (the
    /// e4m3 forms': `check` bounds their error by this emulation's), the row sums unrounded.
    pub p_rounding: Option<crate::tensor::DType>,
}

impl<'a> RefMask<'a> {
    /// The mask and softcap of `params` (its window and chunk as given, causal besides); no ALiBi.
    pub fn of(params: &AttnParams) -> Self {
        let window = (params.window != Window::UNBOUNDED).then_some(params.window);
        RefMask {
            causal: params.causal,
            window,
            chunk: params.attention_chunk,
            softcap: params.softcap as f64,
            sinks: &[],
            alibi_slopes: &[],
            dropout: params.dropout,
            first_batch: 0,
            qv: &[],
            p_rounding: None,
        }
    }

    /// This mask with ALiBi `slopes` (`[Hq]` or `[B, Hq]`).
    pub fn with_alibi(self, slopes: &'a [f64]) -> Self {
        RefMask { alibi_slopes: slopes, ..self }
    }

    /// The mask of sequence `b` alone (of `heads_q` heads): its row of `[B, Hq]` slopes.
    pub fn for_sequence(&self, b: usize, heads_q: usize) -> Self {
        let slopes = if self.alibi_slopes.len() > heads_q { &self.alibi_slopes[b * heads_q..][..heads_q] } else { self.alibi_slopes };
        RefMask { alibi_slopes: slopes, first_batch: self.first_batch + b, ..*self }
    }

    /// Dropout's factor for score `(i, j)` of batch entry `b`, head `h` (of `hq`): `1 / (1 -
    /// p)` where kept, 0 where dropped, 1 without dropout.
    fn kept(&self, (b, h, hq): (usize, usize, usize), i: usize, j: usize) -> f64 {
        match &self.dropout {
            None => 1.0,
            Some(d) if d.keeps(self.first_batch + b, h, hq, i, j) => 1.0 / (1.0 - d.p as f64),
            Some(_) => 0.0,
        }
    }

    /// ALiBi's bias of score `(i, j)` of sequence `b`, head `h` (of `hq`), `sq` queries over
    /// `sk` keys: 0 without slopes.
    fn bias(&self, (b, h, hq): (usize, usize, usize), i: usize, j: usize, (sq, sk): (usize, usize)) -> f64 {
        if self.alibi_slopes.is_empty() {
            return 0.0;
        }
        let slope = if self.alibi_slopes.len() == hq { self.alibi_slopes[h] } else { self.alibi_slopes[b * hq + h] };
        -slope * (i as f64 + sk as f64 - sq as f64 - j as f64).abs()
    }

    /// Keys `[first, last)` query row `i` of `sq` sees among `sk` (empty: none).
    fn visible(&self, i: usize, sq: usize, sk: usize) -> (usize, usize) {
        crate::params::visible_keys(i as i64 + sk as i64 - sq as i64, sk, self.causal, self.window, self.chunk)
    }

    fn score(&self, s: f64) -> f64 {
        if self.softcap > 0.0 {
            self.softcap * (s / self.softcap).tanh()
        } else {
            s
        }
    }

    /// `d score(s) / ds` from the transformed score `c = score(s)`: `1 − tanh²(s / softcap)`
    /// `= 1 − (c / softcap)²` with a softcap, else 1.
    fn score_grad(&self, c: f64) -> f64 {
        if self.softcap > 0.0 {
            1.0 - (c / self.softcap).powi(2)
        } else {
            1.0
        }
    }
}

/// Attention of `q: [B, Sq, Hq, D]` over `k: [B, Sk, Hkv, D]` and `v: [B, Sk, Hkv, Dv]`, all
/// contiguous BSHD; the output is `[B, Sq, Hq, Dv]` (`Dv = shape.head_dim_v`).
///
/// # Panics
/// If a slice's length does not match `shape`, or `Hkv` is 0 or does not divide `Hq`.
/// (The public GPU API validates its arguments before it calls this.)
pub fn attention(q: &[f64], k: &[f64], v: &[f64], shape: &ProblemShape, softmax_scale: f64, causal: bool) -> ReferenceOutput {
    attention_masked(q, k, v, shape, softmax_scale, &RefMask { causal, ..RefMask::default() })
}

/// [`attention`] under any [`RefMask`]: a sliding window, softcapping.
///
/// # Panics
/// As [`attention`], and if `mask.sinks` is neither empty nor one a query head.
pub fn attention_masked(q: &[f64], k: &[f64], v: &[f64], shape: &ProblemShape, softmax_scale: f64, mask: &RefMask) -> ReferenceOutput {
    let ProblemShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv } = *shape;
    assert!(hkv > 0 && hq % hkv == 0, "heads_q = {hq} must be a multiple of heads_kv = {hkv}");
    let (q_len, k_len, v_len) = (batch * sq * hq * d, batch * sk * hkv * d, batch * sk * hkv * dv);
    for (name, t, want) in [("q", q, q_len), ("k", k, k_len), ("v", v, v_len)] {
        assert_eq!(t.len(), want, "{name} has {} elements, {shape:?} needs {want}", t.len());
    }
    assert!(mask.sinks.is_empty() || mask.sinks.len() == hq, "sinks has {} elements, one a query head ({hq}) needed", mask.sinks.len());
    let qv_len = batch * sq * hq * dv;
    assert!(mask.qv.is_empty() || mask.qv.len() == qv_len, "qv has {} elements, {shape:?} needs {qv_len}", mask.qv.len());
    let group = hq / hkv;

    // One job per (batch, query head); each returns that head's [Sq, Dv] output and [Sq] lse.
    let heads: Vec<(Vec<f64>, Vec<f64>)> = (0..batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let q_row = |i: usize| &q[((b * sq + i) * hq + h) * d..][..d];
            let kv_row = |j: usize| (b * sk + j) * hkv + h / group;
            // q_i·k_j, and qv_i·v_j with qv.
            let logit = |i: usize, j: usize| {
                let qk = dot(q_row(i), &k[kv_row(j) * d..][..d]);
                if mask.qv.is_empty() {
                    qk
                } else {
                    qk + dot(&mask.qv[((b * sq + i) * hq + h) * dv..][..dv], &v[kv_row(j) * dv..][..dv])
                }
            };
            let mut o = vec![0.0; sq * dv];
            let mut lse = vec![f64::NEG_INFINITY; sq];
            let sink = mask.sinks.get(h).copied().unwrap_or(f64::NEG_INFINITY);
            for i in 0..sq {
                let (first, last) = mask.visible(i, sq, sk);
                if first == last {
                    lse[i] = sink; // o stays 0: only the sink, which has no value
                    continue;
                }
                let bias = |j| mask.bias((b, h, hq), i, j, (sq, sk));
                let s: Vec<f64> = (first..last).map(|j| mask.score(softmax_scale * logit(i, j)) + bias(j)).collect();
                let max = s.iter().copied().fold(sink, f64::max);
                let p: Vec<f64> = s.iter().map(|&s| (s - max).exp()).collect();
                let sum: f64 = p.iter().sum::<f64>() + (sink - max).exp();
                let o_i = &mut o[i * dv..][..dv];
                for (j, &p) in (first..last).zip(&p) {
                    let p = mask.p_rounding.map_or(p, |t| t.decode(t.encode(p as f32)) as f64);
                    let weight = p / sum * mask.kept((b, h, hq), i, j);
                    for (o, &v) in o_i.iter_mut().zip(&v[kv_row(j) * dv..][..dv]) {
                        *o += weight * v;
                    }
                }
                lse[i] = max + sum.ln();
            }
            (o, lse)
        })
        .collect();

    let mut o = vec![0.0; batch * sq * hq * dv];
    let mut lse = Vec::with_capacity(batch * hq * sq);
    for (bh, (o_head, lse_head)) in heads.into_iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
        for (i, row) in o_head.chunks_exact(dv.max(1)).enumerate() {
            o[((b * sq + i) * hq + h) * dv..][..dv].copy_from_slice(row);
        }
        lse.extend(lse_head);
    }
    ReferenceOutput { o, lse }
}

/// A paged KV cache as the reference reads it (see [`crate::PagedKv`]): pools `[num_pages,
/// page_size, Hkv, D]` (V's `Dv`) contiguous, a block table `[B, max_pages]` row-major, and each
/// sequence's key count (its cached keys plus any appended, already written into the pools).
#[derive(Debug, Clone, Copy)]
pub struct RefPagedCache<'a> {
    /// The K pool.
    pub k: &'a [f64],
    /// The V pool.
    pub v: &'a [f64],
    /// `[B, max_pages]`.
    pub block_table: &'a [i32],
    /// Columns of `block_table`.
    pub max_pages: usize,
    /// Keys a page.
    pub page_size: usize,
    /// `[B]`: keys each sequence holds.
    pub seqlens: &'a [usize],
}

impl RefPagedCache<'_> {
    /// Sequence `b`'s keys and values, `[1, seqlens[b], Hkv, D]` and `[.., Dv]`, gathered from
    /// the pages its table row names (`rows` = Hkv · D and Hkv · Dv elements a key).
    ///
    /// # Panics
    /// If a used table entry names no page of the pools.
    pub fn gather(&self, b: usize, (k_row, v_row): (usize, usize)) -> (Vec<f64>, Vec<f64>) {
        let len = self.seqlens[b];
        let (mut k, mut v) = (Vec::with_capacity(len * k_row), Vec::with_capacity(len * v_row));
        for j in 0..len {
            let page = self.block_table[b * self.max_pages + j / self.page_size];
            let slot = page as usize * self.page_size + j % self.page_size;
            k.extend_from_slice(&self.k[slot * k_row..][..k_row]);
            v.extend_from_slice(&self.v[slot * v_row..][..v_row]);
        }
        (k, v)
    }
}

/// Attention of `q [B, Sq, Hq, D]` over a paged cache: gather each sequence's keys, then
/// attend with [`attention_masked`] (the mask bottom-right aligned to the sequence's own key
/// count). `shape.seqlen_k` is ignored.
pub fn attention_paged(q: &[f64], cache: &RefPagedCache, shape: &ProblemShape, softmax_scale: f64, mask: &RefMask) -> ReferenceOutput {
    let ProblemShape { batch, seqlen_q: sq, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv, .. } = *shape;
    let mut out = ReferenceOutput { o: Vec::with_capacity(batch * sq * hq * dv), lse: Vec::with_capacity(batch * hq * sq) };
    for b in 0..batch {
        let (k, v) = cache.gather(b, (hkv * d, hkv * dv));
        let one = ProblemShape { batch: 1, seqlen_k: cache.seqlens[b], ..*shape };
        let r = attention_masked(&q[b * sq * hq * d..][..sq * hq * d], &k, &v, &one, softmax_scale, &mask.for_sequence(b, hq));
        out.o.extend(r.o);
        out.lse.extend(r.lse);
    }
    out
}

/// Gradients of the reference: `dq [B, Sq, Hq, D]`, `dk [B, Sk, Hkv, D]`, `dv [B, Sk, Hkv,
/// Dv]`, contiguous.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceGrads {
    /// Gradient with respect to `q`.
    pub dq: Vec<f64>,
    /// Gradient with respect to `k` (summed over the query heads that share each KV head).
    pub dk: Vec<f64>,
    /// Gradient with respect to `v` (likewise summed).
    pub dv: Vec<f64>,
    /// Gradient with respect to the sinks, `[Hq]` (empty without sinks): `−Σ P_sink · D_i`
    /// over every batch entry's rows, `P_sink = exp(sink − lse)` and `D_i = rowsum(dO ∘ O)`.
    pub dsinks: Vec<f64>,
    /// The size of `dsinks`' terms, `Σ P_sink · Σ_c |dO_c · O_c|` a head: what a kernel's
    /// rounding of `dsinks` is relative to. Its `D_i` comes from `O` stored in the inputs'
    /// dtype, an error of `D_i` that scales with `|dO|·|O|`, not with `D_i`, which cancels;
    /// and the rows' shares cancel in the sum again.
    pub dsink_scales: Vec<f64>,
}

/// Gradients of `Σ dout ∘ o` with `o = attention(q, k, v)`, by the textbook formulas, per
/// (batch, query head), over the visible keys: `P = softmax(S)`, `dV = Pᵀ dO`,
/// `dP = dO Vᵀ`, `dS = P ∘ (dP − rowsum(dO ∘ O))`, `dQ = scale · dS K`,
/// `dK = scale · dSᵀ Q`; query heads sharing a KV head add their dK and dV. With sinks, `P`
/// includes the sink's share of each row and `dsink = −Σ P_sink · D_i`. `o` comes from
/// this module's own forward, so the result is the exact gradient of the f64 forward. Rows
/// that see no key contribute nothing (their dQ is 0).
///
/// # Panics
/// As [`attention`], and if `dout` does not have the output's length (`[B, Sq, Hq, Dv]`).
pub fn attention_backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    shape: &ProblemShape,
    softmax_scale: f64,
    causal: bool,
) -> ReferenceGrads {
    attention_backward_masked(q, k, v, dout, shape, softmax_scale, &RefMask { causal, ..RefMask::default() })
}

/// [`attention_backward`] under any [`RefMask`]: the visible keys are the window's, and a
/// softcapped score `c = cap · tanh(s / cap)` (`s = scale · q·k`) passes its gradient on times
/// `dc/ds = 1 − (c / cap)²`: `dS = P ∘ (dP − rowsum(dO ∘ O)) ∘ (1 − (C / cap)²)`, then
/// `dQ = scale · dS K` and `dK = scale · dSᵀ Q` as without one. ALiBi's bias, a constant of
/// the score, changes `P` alone.
///
/// # Panics
/// As [`attention_backward`].
pub fn attention_backward_masked(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    shape: &ProblemShape,
    softmax_scale: f64,
    mask: &RefMask,
) -> ReferenceGrads {
    let ProblemShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv } = *shape;
    let fwd = attention_masked(q, k, v, shape, softmax_scale, mask);
    assert_eq!(dout.len(), fwd.o.len(), "dout has {} elements, the output {}", dout.len(), fwd.o.len());
    let group = hq / hkv;
    let q_row = |b: usize, i: usize, h: usize| (b * sq + i) * hq + h;
    let kv_row = |b: usize, j: usize, h: usize| (b * sk + j) * hkv + h / group;

    // One job per (batch, query head): its dQ rows, its share of dK and dV, and of its sink's.
    let heads: Vec<HeadGrads> = (0..batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let (mut dq, mut dk, mut d_v) = (vec![0.0; sq * d], vec![0.0; sk * d], vec![0.0; sk * dv]);
            let (mut dsink, mut dsink_scale) = (0.0, 0.0);
            for i in 0..sq {
                let (first, last) = mask.visible(i, sq, sk);
                let lse = fwd.lse[(b * hq + h) * sq + i];
                let row = q_row(b, i, h);
                let (q_i, do_i, o_i) = (&q[row * d..][..d], &dout[row * dv..][..dv], &fwd.o[row * dv..][..dv]);
                let d_i = dot(do_i, o_i);
                if let Some(&sink) = mask.sinks.get(h) {
                    dsink -= (sink - lse).exp() * d_i;
                    dsink_scale += (sink - lse).exp() * do_i.iter().zip(o_i).map(|(a, b)| (a * b).abs()).sum::<f64>();
                }
                for j in first..last {
                    let (k_j, v_j) = (&k[kv_row(b, j, h) * d..][..d], &v[kv_row(b, j, h) * dv..][..dv]);
                    let c = mask.score(softmax_scale * dot(q_i, k_j));
                    let p = (c + mask.bias((b, h, hq), i, j, (sq, sk)) - lse).exp();
                    let kept = mask.kept((b, h, hq), i, j);
                    let ds = p * (kept * dot(do_i, v_j) - d_i) * mask.score_grad(c);
                    for c in 0..dv {
                        d_v[j * dv + c] += p * kept * do_i[c];
                    }
                    for c in 0..d {
                        dq[i * d + c] += softmax_scale * ds * k_j[c];
                        dk[j * d + c] += softmax_scale * ds * q_i[c];
                    }
                }
            }
            HeadGrads { dq, dk, dv: d_v, dsink, dsink_scale }
        })
        .collect();

    let (dsinks, dsink_scales) = (vec![0.0; mask.sinks.len()], vec![0.0; mask.sinks.len()]);
    let mut grads = ReferenceGrads { dq: vec![0.0; q.len()], dk: vec![0.0; k.len()], dv: vec![0.0; v.len()], dsinks, dsink_scales };
    for (bh, HeadGrads { dq, dk, dv: d_v, dsink, dsink_scale }) in heads.into_iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
        if let Some(total) = grads.dsinks.get_mut(h) {
            *total += dsink;
            grads.dsink_scales[h] += dsink_scale;
        }
        for i in 0..sq {
            grads.dq[q_row(b, i, h) * d..][..d].copy_from_slice(&dq[i * d..][..d]);
        }
        for j in 0..sk {
            for (acc, part, width) in [(&mut grads.dk, &dk, d), (&mut grads.dv, &d_v, dv)] {
                for (a, x) in acc[kv_row(b, j, h) * width..][..width].iter_mut().zip(&part[j * width..][..width]) {
                    *a += x;
                }
            }
        }
    }
    grads
}

/// One (batch, query head)'s gradients in the backward: its dQ rows `[Sq, D]`, its share of
/// dK `[Sk, D]` and dV `[Sk, Dv]` (its KV head's), and of its sink's.
struct HeadGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dsink: f64,
    dsink_scale: f64,
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

#[cfg(test)]
mod paged_tests {
    use super::*;

    #[test]
    fn a_shuffled_paged_cache_gives_the_dense_result() {
        // Two sequences of 5 and 3 keys (Hkv 1, D 2) in pages of 2 keys, pages shuffled.
        let (hkv, d, page) = (1, 2, 2);
        let keys: Vec<Vec<f64>> = vec![(0..10).map(|x| x as f64 * 0.1).collect(), (0..6).map(|x| 1.0 - x as f64 * 0.2).collect()];
        let table = [3, 0, 4, 1, 2, /* unused: */ -9];
        let mut pool = vec![f64::NAN; 5 * page * d];
        for (b, k) in keys.iter().enumerate() {
            for j in 0..k.len() / d {
                let at = (table[b * 3 + j / page] as usize * page + j % page) * d;
                pool[at..at + d].copy_from_slice(&k[j * d..][..d]);
            }
        }
        let cache = RefPagedCache { k: &pool, v: &pool, block_table: &table, max_pages: 3, page_size: page, seqlens: &[5, 3] };
        let q = [0.3, -0.2, 0.5, 0.1, 0.7, 0.7, -1.0, 0.4];
        let shape = ProblemShape { batch: 2, seqlen_q: 2, seqlen_k: 0, heads_q: 1, heads_kv: hkv, head_dim: d, head_dim_v: d };
        let mask = RefMask { causal: true, ..RefMask::default() };
        let paged = attention_paged(&q, &cache, &shape, 0.5, &mask);
        for (b, k) in keys.iter().enumerate() {
            let one = ProblemShape { batch: 1, seqlen_k: k.len() / d, ..shape };
            let dense = attention_masked(&q[b * 4..][..4], k, k, &one, 0.5, &mask);
            assert_eq!(&paged.o[b * 4..][..4], &dense.o[..]);
            assert_eq!(&paged.lse[b * 2..][..2], &dense.lse[..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> ProblemShape {
        ProblemShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: d }
    }

    /// Deterministic values in [-1, 1) (splitmix64), so tests need no RNG crate.
    fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect()
    }

    /// Random q, k, v for `s`.
    fn qkv(s: &ProblemShape, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let nq = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
        let keys = s.batch * s.seqlen_k * s.heads_kv;
        (random(nq, seed), random(keys * s.head_dim, seed + 1), random(keys * s.head_dim_v, seed + 2))
    }

    /// FlashAttention-3's `qv` is one longer dot product: q·kᵀ + qv·vᵀ = [q, qv]·[k, v]ᵀ, so
    /// the call with `qv` equals the call at head dim D + Dv with q and k extended by qv and v
    /// (GQA, causal with Sq < Sk, a softcap and sinks beside it).
    #[test]
    fn qv_is_the_dot_product_over_q_and_qv_together() {
        let (d, dv) = (3, 5);
        let s = ProblemShape { head_dim_v: dv, ..shape(2, 4, 7, 4, 2, d) };
        let (q, k, v) = qkv(&s, 11);
        let qv = random(s.batch * s.seqlen_q * s.heads_q * dv, 99);
        let rows = |t: &[f64], n: usize, w: usize| t.chunks_exact(w).take(n).map(<[f64]>::to_vec).collect::<Vec<_>>();
        let join = |a: &[f64], wa: usize, b: &[f64], wb: usize| -> Vec<f64> {
            rows(a, a.len() / wa, wa).into_iter().zip(rows(b, b.len() / wb, wb)).flat_map(|(x, y)| x.into_iter().chain(y)).collect()
        };
        let sinks = [0.5, -1.0, 2.0, 0.0];
        let mask = RefMask { causal: true, softcap: 2.0, sinks: &sinks, ..RefMask::default() };
        let got = attention_masked(&q, &k, &v, &s, 0.3, &RefMask { qv: &qv, ..mask });
        let wide = ProblemShape { head_dim: d + dv, ..s };
        let want = attention_masked(&join(&q, d, &qv, dv), &join(&k, d, &v, dv), &v, &wide, 0.3, &mask);
        for (a, b) in got.o.iter().zip(&want.o).chain(got.lse.iter().zip(&want.lse)) {
            assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} against {b}");
        }
        let plain = attention_masked(&q, &k, &v, &s, 0.3, &mask);
        assert!(plain.o.iter().zip(&got.o).any(|(a, b)| (a - b).abs() > 1e-3), "qv changes the output");
    }

    /// Columns `from..from + width` of each row of `t` (rows of `row` elements), zero-padded to
    /// `pad` columns.
    fn columns(t: &[f64], row: usize, from: usize, width: usize, pad: usize) -> Vec<f64> {
        t.chunks_exact(row).flat_map(|r| r[from..from + width].iter().copied().chain(std::iter::repeat_n(0.0, pad - width))).collect()
    }

    #[test]
    fn a_v_head_dim_of_its_own_gives_each_column_block_of_v_alone() {
        // D 3, Dv 5 = v's columns 0..3 and 3..5: the weights depend on q and k alone, so o's
        // columns are those of the calls with each block as v (Dv = D, the second zero-padded),
        // and the LSE is theirs; causal with Sq > Sk (empty rows), GQA, sinks and a softcap.
        let s = ProblemShape { head_dim_v: 5, ..shape(2, 5, 4, 4, 2, 3) };
        let (q, k, v) = qkv(&s, 111);
        let mask = RefMask { causal: true, softcap: 2.0, sinks: &[0.5, -1.0, 1.5, 0.0], ..RefMask::default() };
        let whole = attention_masked(&q, &k, &v, &s, 0.9, &mask);
        assert_eq!(whole.o.len(), 2 * 5 * 4 * 5, "o is [B, Sq, Hq, Dv]");
        let square = shape(2, 5, 4, 4, 2, 3);
        let first = attention_masked(&q, &k, &columns(&v, 5, 0, 3, 3), &square, 0.9, &mask);
        let second = attention_masked(&q, &k, &columns(&v, 5, 3, 2, 3), &square, 0.9, &mask);
        assert_close(&columns(&whole.o, 5, 0, 3, 3), &first.o, 1e-15);
        assert_close(&columns(&whole.o, 5, 3, 2, 3), &second.o, 1e-15);
        assert_close(&whole.lse, &first.lse, 0.0);
        assert!(whole.o.iter().any(|&x| x.abs() > 1e-2) && whole.o[..5].iter().all(|&x| x == 0.0), "a row without keys is 0");
    }

    /// `attention_backward_masked`'s gradients of `[q, k, v, dout]`, each element asserted
    /// within `tol` of the central difference of the loss `Σ dout ∘ o` (step 1e-5).
    fn gradients_by_finite_differences(inputs: [&Vec<f64>; 4], s: &ProblemShape, scale: f64, mask: &RefMask, tol: f64) -> ReferenceGrads {
        let [q, k, v, dout] = inputs;
        let grads = attention_backward_masked(q, k, v, dout, s, scale, mask);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| dot(&attention_masked(q, k, v, s, scale, mask).o, dout);
        let h = 1e-5;
        for (name, x, g) in [("q", q, &grads.dq), ("k", k, &grads.dk), ("v", v, &grads.dv)] {
            for n in 0..x.len() {
                let (mut plus, mut minus) = (x.clone(), x.clone());
                plus[n] += h;
                minus[n] -= h;
                let at = |t: &[f64]| match name {
                    "q" => loss(t, k, v),
                    "k" => loss(q, t, v),
                    _ => loss(q, k, t),
                };
                let numeric = (at(&plus) - at(&minus)) / (2.0 * h);
                assert!((numeric - g[n]).abs() < tol, "d{name}[{n}] ({s:?}, {mask:?}): {} vs {numeric}", g[n]);
            }
        }
        grads
    }

    #[test]
    fn gradients_with_a_v_head_dim_of_its_own_match_finite_differences() {
        // Dv wider and narrower than D, dO shaped like o, dV like v; sinks, a window, a chunk.
        let cases = [
            (5, 3, RefMask { causal: true, sinks: &[0.3, -1.2, 2.0, 0.0], ..RefMask::default() }),
            (2, 4, RefMask { window: Some(Window::new(1, 0)), softcap: 1.5, ..RefMask::default() }),
            (6, 4, RefMask { causal: true, chunk: 3, ..RefMask::default() }),
        ];
        for (dv, d, mask) in cases {
            let s = ProblemShape { head_dim_v: dv, ..shape(2, 5, 6, 4, 2, d) };
            let (q, k, v) = qkv(&s, 113);
            let dout = random(2 * 5 * 4 * dv, 127);
            let grads = gradients_by_finite_differences([&q, &k, &v, &dout], &s, 1.3, &mask, 1e-8);
            assert_eq!((grads.dq.len(), grads.dk.len(), grads.dv.len()), (q.len(), k.len(), v.len()));
            assert!(grads.dv.iter().any(|&x| x.abs() > 1e-3) && grads.dq.iter().any(|&x| x.abs() > 1e-3), "gradients worth testing");
        }
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let same_inf = x.is_infinite() && x == y;
            assert!(same_inf || (x - y).abs() <= tol, "element {i}: {x} vs {y}");
        }
    }

    /// Brute force: the mask spelled out with signed indices, no max subtraction.
    fn brute_force(q: &[f64], k: &[f64], v: &[f64], s: &ProblemShape, scale: f64, causal: bool) -> ReferenceOutput {
        let (sq, sk, hq, hkv, d) = (s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim);
        let mut o = vec![0.0; s.batch * sq * hq * d];
        let mut lse = vec![f64::NEG_INFINITY; s.batch * hq * sq];
        for b in 0..s.batch {
            for h in 0..hq {
                let kh = h * hkv / hq;
                for i in 0..sq {
                    let mut weights = vec![0.0; sk];
                    for (j, w) in weights.iter_mut().enumerate() {
                        if causal && j as isize > i as isize + sk as isize - sq as isize {
                            continue;
                        }
                        let logit: f64 = (0..d).map(|c| q[((b * sq + i) * hq + h) * d + c] * k[((b * sk + j) * hkv + kh) * d + c]).sum();
                        *w = (scale * logit).exp();
                    }
                    let sum: f64 = weights.iter().sum();
                    if sum == 0.0 {
                        continue;
                    }
                    lse[(b * hq + h) * sq + i] = sum.ln();
                    for (j, w) in weights.iter().enumerate() {
                        for c in 0..d {
                            o[((b * sq + i) * hq + h) * d + c] += w / sum * v[((b * sk + j) * hkv + kh) * d + c];
                        }
                    }
                }
            }
        }
        ReferenceOutput { o, lse }
    }

    #[test]
    fn a_causal_chunk_is_each_chunk_alone() {
        // Sq = Sk = 12 in chunks of 4 under the causal mask: rows 4c..4c+3 attend to keys
        // 4c..4c+3 as a causal problem of 4 tokens of its own.
        let whole = shape(1, 12, 12, 2, 1, 3);
        let (q, k, v) = qkv(&whole, 5);
        let chunked = attention_masked(&q, &k, &v, &whole, 0.7, &RefMask { causal: true, chunk: 4, ..RefMask::default() });
        let part = shape(1, 4, 4, 2, 1, 3);
        for c in 0..3 {
            let rows = |t: &[f64], heads: usize| t[c * 4 * heads * 3..][..4 * heads * 3].to_vec();
            let alone = attention(&rows(&q, 2), &rows(&k, 1), &rows(&v, 1), &part, 0.7, true);
            assert_close(&chunked.o[c * 4 * 2 * 3..][..4 * 2 * 3], &alone.o, 1e-14);
            for h in 0..2 {
                assert_close(&chunked.lse[h * 12 + c * 4..][..4], &alone.lse[h * 4..][..4], 1e-14);
            }
        }
    }

    #[test]
    fn sinks_join_each_rows_denominator_without_a_value() {
        // Brute force: the softmax over the visible keys' scores and the head's sink, whose
        // probability multiplies no value; a row that sees no key (causal, Sq > Sk) gives o = 0
        // and lse = sink. Sinks far below, near and above the scores.
        let s = shape(2, 6, 4, 4, 2, 3);
        let (q, k, v) = qkv(&s, 21);
        let sinks = [-30.0, 0.0, 0.7, 5.0];
        let got = attention_masked(&q, &k, &v, &s, 0.8, &RefMask { causal: true, sinks: &sinks, ..RefMask::default() });
        for b in 0..2 {
            for h in 0..4 {
                for i in 0..6 {
                    let diag = i as i64 + 4 - 6;
                    let logits: Vec<f64> = (0..=diag.max(-1))
                        .filter(|&j| j >= 0)
                        .map(|j| 0.8 * dot(&q[((b * 6 + i) * 4 + h) * 3..][..3], &k[((b * 4 + j as usize) * 2 + h / 2) * 3..][..3]))
                        .collect();
                    let denominator: f64 = logits.iter().map(|l| l.exp()).sum::<f64>() + sinks[h].exp();
                    let lse = got.lse[(b * 4 + h) * 6 + i];
                    assert!((lse - denominator.ln()).abs() < 1e-12, "b{b} h{h} i{i}: {lse} vs {}", denominator.ln());
                    for c in 0..3 {
                        let want: f64 =
                            logits.iter().enumerate().map(|(j, l)| l.exp() / denominator * v[((b * 4 + j) * 2 + h / 2) * 3 + c]).sum();
                        assert!((got.o[((b * 6 + i) * 4 + h) * 3 + c] - want).abs() < 1e-12);
                    }
                    if logits.is_empty() {
                        assert_eq!(lse, sinks[h], "a row without keys: lse = sink");
                    }
                }
            }
        }
    }

    #[test]
    fn sink_gradients_match_finite_differences() {
        // d/dsink of Σ dout ∘ o, by central differences, beside dq, dk, dv (checked as the
        // other masks' are): causal Sq > Sk (rows without keys), a window, GQA.
        let s = shape(2, 5, 4, 4, 2, 3);
        let (q, k, v) = qkv(&s, 33);
        let dout: Vec<f64> = (0..q.len()).map(|i| ((i * 37 % 17) as f64 - 8.0) / 8.0).collect();
        let sinks = [0.3, -1.2, 2.0, 0.0];
        for window in [None, Some(Window::new(1, 0))] {
            fn mask(window: Option<Window>, sinks: &[f64]) -> RefMask<'_> {
                RefMask { causal: true, window, sinks, ..RefMask::default() }
            }
            let grads = attention_backward_masked(&q, &k, &v, &dout, &s, 0.9, &mask(window, &sinks));
            let loss = |sinks: &[f64]| -> f64 {
                let o = attention_masked(&q, &k, &v, &s, 0.9, &mask(window, sinks)).o;
                o.iter().zip(&dout).map(|(o, g)| o * g).sum()
            };
            for h in 0..4 {
                let eps = 1e-6;
                let (mut up, mut down) = (sinks, sinks);
                up[h] += eps;
                down[h] -= eps;
                let want = (loss(&up) - loss(&down)) / (2.0 * eps);
                assert!((grads.dsinks[h] - want).abs() < 1e-7, "{window:?} h{h}: {} vs {want}", grads.dsinks[h]);
                // The size of dsink's terms bounds the sum, and exceeds it where the terms cancel.
                assert!(grads.dsink_scales[h] >= grads.dsinks[h].abs() - 1e-12, "h{h}: {} < |{}|", grads.dsink_scales[h], grads.dsinks[h]);
            }
            assert!(grads.dsink_scales.iter().zip(&grads.dsinks).any(|(s, g)| *s > g.abs() + 1e-6), "some head's terms cancel");
            let no_sinks = attention_backward_masked(&q, &k, &v, &dout, &s, 0.9, &mask(window, &[]));
            assert!(no_sinks.dsinks.is_empty() && no_sinks.dsink_scales.is_empty());
            assert!(grads.dq.iter().zip(&no_sinks.dq).any(|(a, b)| (a - b).abs() > 1e-6), "the sinks change dq");
        }
    }

    #[test]
    fn window_and_softcap_match_the_brute_force() {
        // The brute force masks with the window's inequalities on signed indices, keeps a key
        // only in the chunk of the row's diagonal (equal chunk indices, floored), and applies
        // the softcap to each logit; Sq < Sk and Sq > Sk both, windows and chunks that leave
        // rows empty, chunks alone (the window (-1, -1)).
        for (sq, sk) in [(5, 9), (9, 4), (7, 7)] {
            let s = shape(2, sq, sk, 4, 2, 3);
            let (q, k, v) = qkv(&s, 11);
            let masks =
                [(0, 0, false), (1, 0, false), (2, 3, false), (-1, 1, false), (2, -1, true), (3, 5, true), (-1, -1, false), (-1, -1, true)];
            for ((left, right, causal), chunk) in masks.into_iter().flat_map(|m| [0usize, 1, 3, 4].map(|c| (m, c))) {
                for softcap in [0.0, 1.5] {
                    let mask = RefMask { causal, window: Some(Window::new(left, right)), chunk, softcap, ..RefMask::default() };
                    let got = attention_masked(&q, &k, &v, &s, 0.9, &mask);
                    let (mut o, mut lse) = (vec![0.0; got.o.len()], vec![f64::NEG_INFINITY; got.lse.len()]);
                    for b in 0..2 {
                        for h in 0..4 {
                            for i in 0..sq {
                                let diag = i as i64 + sk as i64 - sq as i64;
                                let seen = |j: i64| {
                                    (left < 0 || j >= diag - left as i64)
                                        && (right < 0 || j <= diag + right as i64)
                                        && (!causal || j <= diag)
                                        && (chunk == 0 || j.div_euclid(chunk as i64) == diag.div_euclid(chunk as i64))
                                };
                                let w: Vec<f64> = (0..sk)
                                    .map(|j| {
                                        if !seen(j as i64) {
                                            return 0.0;
                                        }
                                        let logit =
                                            0.9 * dot(&q[((b * sq + i) * 4 + h) * 3..][..3], &k[((b * sk + j) * 2 + h / 2) * 3..][..3]);
                                        (if softcap > 0.0 { softcap * (logit / softcap).tanh() } else { logit }).exp()
                                    })
                                    .collect();
                                let sum: f64 = w.iter().sum();
                                if sum > 0.0 {
                                    lse[(b * 4 + h) * sq + i] = sum.ln();
                                    for (j, w) in w.iter().enumerate() {
                                        for c in 0..3 {
                                            o[((b * sq + i) * 4 + h) * 3 + c] += w / sum * v[((b * sk + j) * 2 + h / 2) * 3 + c];
                                        }
                                    }
                                }
                            }
                        }
                    }
                    assert_close(&got.o, &o, 1e-12);
                    assert_close(&got.lse, &lse, 1e-12);
                    assert!(got.lse.iter().any(|l| l.is_finite()), "({left}, {right}) causal {causal} chunk {chunk}");
                }
            }
        }
    }

    #[test]
    fn one_query_two_keys_by_hand() {
        // Logits 0 and ln 2: weights 1/3 and 2/3, so o = 3/3 + 2·6/3 = 5 and lse = ln 3.
        let out = attention(&[1.0], &[0.0, 2f64.ln()], &[3.0, 6.0], &shape(1, 1, 2, 1, 1, 1), 1.0, false);
        assert_close(&out.o, &[5.0], 1e-14);
        assert_close(&out.lse, &[3f64.ln()], 1e-14);
        // The scale multiplies the logits: scale 2 gives ln 4, weights 1/5 and 4/5.
        let out = attention(&[1.0], &[0.0, 2f64.ln()], &[3.0, 6.0], &shape(1, 1, 2, 1, 1, 1), 2.0, false);
        assert_close(&out.o, &[3.0 / 5.0 + 24.0 / 5.0], 1e-14);
        assert_close(&out.lse, &[5f64.ln()], 1e-14);
    }

    #[test]
    fn large_logits_do_not_overflow() {
        // exp(1000) overflows f64; the max subtraction keeps it exact.
        let out = attention(&[1000.0], &[1.0, 1.0, -1.0], &[1.0, 3.0, 100.0], &shape(1, 1, 3, 1, 1, 1), 1.0, false);
        assert_close(&out.o, &[2.0], 1e-12);
        assert_close(&out.lse, &[1000.0 + 2f64.ln()], 1e-12);
    }

    #[test]
    fn matches_brute_force_on_random_inputs() {
        for (sq, sk) in [(4, 4), (3, 7), (7, 3), (1, 5), (6, 1)] {
            for causal in [false, true] {
                let s = shape(2, sq, sk, 4, 2, 5);
                let (q, k, v) = qkv(&s, 7);
                let got = attention(&q, &k, &v, &s, 0.7, causal);
                let want = brute_force(&q, &k, &v, &s, 0.7, causal);
                assert_close(&got.o, &want.o, 1e-13);
                assert_close(&got.lse, &want.lse, 1e-13);
            }
        }
    }

    #[test]
    fn shifting_all_keys_shifts_each_rows_logits_only() {
        // k_j + c adds scale·q_i·c to every logit of row i: o is unchanged, lse_i moves by it.
        let s = shape(1, 3, 5, 1, 1, 4);
        let (q, k, v) = qkv(&s, 11);
        let c = [0.5, -2.0, 1.5, 3.0];
        let shifted: Vec<f64> = k.iter().enumerate().map(|(n, k)| k + c[n % 4]).collect();
        let base = attention(&q, &k, &v, &s, 0.9, false);
        let out = attention(&q, &shifted, &v, &s, 0.9, false);
        assert_close(&out.o, &base.o, 1e-12);
        for i in 0..3 {
            let shift = 0.9 * dot(&q[i * 4..][..4], &c);
            assert!((out.lse[i] - base.lse[i] - shift).abs() < 1e-12);
        }
    }

    #[test]
    fn permuting_keys_and_values_together_changes_nothing() {
        let s = shape(1, 3, 5, 2, 2, 3);
        let (q, k, v) = qkv(&s, 23);
        let row = 2 * 3; // Hkv · D values per key position.
        let perm = [3, 0, 4, 1, 2];
        let permute = |t: &[f64]| -> Vec<f64> { perm.iter().flat_map(|&j| t[j * row..][..row].to_vec()).collect() };
        let base = attention(&q, &k, &v, &s, 0.5, false);
        let out = attention(&q, &permute(&k), &permute(&v), &s, 0.5, false);
        assert_close(&out.o, &base.o, 1e-14);
        assert_close(&out.lse, &base.lse, 1e-14);
    }

    #[test]
    fn causal_first_row_is_the_first_value() {
        let s = shape(2, 4, 4, 3, 3, 2);
        let (q, k, v) = qkv(&s, 31);
        let out = attention(&q, &k, &v, &s, 1.3, true);
        for b in 0..2 {
            for h in 0..3 {
                let at = (b * 4 * 3 + h) * 2; // Row 0 of (b, h), in q, k, v and o alike.
                assert_close(&out.o[at..][..2], &v[at..][..2], 1e-15);
                assert_close(&out.lse[(b * 3 + h) * 4..][..1], &[1.3 * dot(&q[at..][..2], &k[at..][..2])], 1e-14);
            }
        }
    }

    #[test]
    fn gqa_equals_mha_with_repeated_kv_heads() {
        let (gqa, mha) = (shape(2, 3, 6, 8, 2, 4), shape(2, 3, 6, 8, 8, 4));
        let (q, k, v) = qkv(&gqa, 41);
        // Query heads 0..4 share kv head 0, heads 4..8 kv head 1.
        let repeat = |t: &[f64]| -> Vec<f64> { t.chunks(4).flat_map(|head| [head; 4].concat()).collect() };
        let (k_mha, v_mha) = (repeat(&k), repeat(&v));
        assert_eq!(k_mha.len(), 2 * 6 * 8 * 4);
        assert_eq!(k_mha[(5 * 8 + 3) * 4..][..4], k[(5 * 2) * 4..][..4]);
        let got = attention(&q, &k, &v, &gqa, 0.5, true);
        let want = attention(&q, &k_mha, &v_mha, &mha, 0.5, true);
        assert_eq!(got, want);
    }

    #[test]
    fn fully_masked_rows_give_zero_and_minus_infinity() {
        // Sq = 5 > Sk = 2: rows 0..3 see no key, row 3 sees k0, row 4 sees k0 and k1.
        let s = shape(1, 5, 2, 1, 1, 3);
        let (q, k, v) = qkv(&s, 53);
        let out = attention(&q, &k, &v, &s, 1.0, true);
        assert!(out.o.iter().chain(&out.lse).all(|x| !x.is_nan()));
        assert!(out.o[..9].iter().all(|&x| x == 0.0));
        assert_eq!(out.lse[..3], [f64::NEG_INFINITY; 3]);
        assert_close(&out.o[9..12], &v[..3], 1e-15);
        assert!(out.lse[3..].iter().all(|x| x.is_finite()));
    }

    #[test]
    fn lse_normalizes_the_visible_weights() {
        let s = shape(1, 4, 6, 1, 1, 3);
        let (q, k, _) = qkv(&s, 61);
        let v = vec![0.0; k.len()];
        for causal in [false, true] {
            let out = attention(&q, &k, &v, &s, 2.0, causal);
            for i in 0..4 {
                let visible = if causal { i + 3 } else { 6 };
                let total: f64 = (0..visible).map(|j| (2.0 * dot(&q[i * 3..][..3], &k[j * 3..][..3]) - out.lse[i]).exp()).sum();
                assert!((total - 1.0).abs() < 1e-14, "row {i}: Σ exp(s - lse) = {total}");
            }
        }
    }

    #[test]
    fn causal_mask_is_bottom_right_aligned() {
        // With one-hot values (D = Sk, v_j = e_j) row i of o is row i's weights, so its
        // support is exactly the set of keys query i sees.
        for (sq, sk) in [(3, 5), (5, 3), (4, 4), (1, 6)] {
            let s = shape(1, sq, sk, 1, 1, sk);
            let q = random(sq * sk, 71);
            let k = random(sk * sk, 72);
            let v: Vec<f64> = (0..sk * sk).map(|n| if n / sk == n % sk { 1.0 } else { 0.0 }).collect();
            let out = attention(&q, &k, &v, &s, 1.0, true);
            for i in 0..sq {
                for j in 0..sk {
                    let visible = j as isize <= i as isize + sk as isize - sq as isize;
                    assert_eq!(out.o[i * sk + j] > 0.0, visible, "Sq {sq}, Sk {sk}: q{i} k{j}");
                }
            }
        }
    }

    /// `Σ dout ∘ o`, the loss whose gradient `attention_backward` returns.
    fn loss(q: &[f64], k: &[f64], v: &[f64], dout: &[f64], s: &ProblemShape, scale: f64, causal: bool) -> f64 {
        dot(&attention(q, k, v, s, scale, causal).o, dout)
    }

    #[test]
    fn gradients_match_finite_differences() {
        // Sq > Sk under causal leaves rows that see no key; GQA sums two query heads per KV head.
        for (sq, sk, causal) in [(3, 5, false), (3, 5, true), (5, 3, true), (4, 4, true)] {
            let s = shape(2, sq, sk, 4, 2, 3);
            let (q, k, v) = qkv(&s, 83);
            let dout = random(q.len(), 89);
            let grads = attention_backward(&q, &k, &v, &dout, &s, 0.8, causal);
            let h = 1e-5;
            for (name, x, g) in [("q", &q, &grads.dq), ("k", &k, &grads.dk), ("v", &v, &grads.dv)] {
                for n in 0..x.len() {
                    let (mut plus, mut minus) = (x.clone(), x.clone());
                    plus[n] += h;
                    minus[n] -= h;
                    let at = |t: &[f64]| match name {
                        "q" => loss(t, &k, &v, &dout, &s, 0.8, causal),
                        "k" => loss(&q, t, &v, &dout, &s, 0.8, causal),
                        _ => loss(&q, &k, t, &dout, &s, 0.8, causal),
                    };
                    let numeric = (at(&plus) - at(&minus)) / (2.0 * h);
                    assert!((numeric - g[n]).abs() < 1e-8, "d{name}[{n}] (Sq {sq}, Sk {sk}, causal {causal}): {} vs {numeric}", g[n]);
                }
            }
        }
    }

    #[test]
    fn masked_and_softcapped_gradients_match_finite_differences() {
        // Brute force: central differences of the masked, softcapped forward's loss. Inputs
        // times 2 and scale 1.5 put logits up to about ±15 against softcaps of 1.5 and 4, so
        // tanh is far from linear; windows that leave rows empty, Sq ≠ Sk both ways, GQA.
        let cases = [
            (3, 6, RefMask { softcap: 1.5, ..RefMask::default() }),
            (5, 3, RefMask { causal: true, softcap: 4.0, ..RefMask::default() }),
            (4, 7, RefMask { causal: false, window: Some(Window::new(1, 0)), ..RefMask::default() }),
            (6, 4, RefMask { causal: false, window: Some(Window::new(0, 2)), softcap: 1.5, ..RefMask::default() }),
            (5, 5, RefMask { causal: true, window: Some(Window::new(2, -1)), softcap: 4.0, ..RefMask::default() }),
            // Sinks (one a query head of 4): causal Sq > Sk (rows without keys), with a softcap.
            (6, 4, RefMask { causal: true, sinks: &[0.3, -1.2, 2.0, 0.0], ..RefMask::default() }),
            (5, 7, RefMask { softcap: 1.5, sinks: &[1.0, 1.0, -0.5, 3.0], ..RefMask::default() }),
            // Chunks: causal over Sq < Sk, alone over Sq > Sk, with a window and a softcap.
            (5, 8, RefMask { causal: true, chunk: 3, ..RefMask::default() }),
            (7, 4, RefMask { chunk: 2, ..RefMask::default() }),
            (6, 6, RefMask { window: Some(Window::new(1, 1)), chunk: 4, softcap: 1.5, ..RefMask::default() }),
            // ALiBi, per head and per (batch, head), with a softcap and a window.
            (4, 7, RefMask { alibi_slopes: &[0.5, 0.25, 1.0, 2.0], ..RefMask::default() }),
            (6, 3, RefMask { causal: true, softcap: 4.0, alibi_slopes: &[0.3, 0.1, 0.7, 1.1, 0.2, 0.9, 0.4, 0.6], ..RefMask::default() }),
            (5, 5, RefMask { window: Some(Window::new(1, 2)), alibi_slopes: &[1.5, 0.5, 0.25, 0.125], ..RefMask::default() }),
            // Dropout: a fixed mask (seed, offset), with a softcap and causal besides.
            (6, 9, RefMask { dropout: Some(crate::Dropout { p: 0.3, seed: 7, offset: 1 }), ..RefMask::default() }),
            (
                7,
                5,
                RefMask { causal: true, softcap: 4.0, dropout: Some(crate::Dropout { p: 0.5, seed: 9, offset: 3 }), ..RefMask::default() },
            ),
        ];
        for (sq, sk, mask) in cases {
            let s = shape(2, sq, sk, 4, 2, 3);
            let (q, k, v) = qkv(&s, 101);
            let (q, k): (Vec<f64>, Vec<f64>) = (q.iter().map(|x| 2.0 * x).collect(), k.iter().map(|x| 2.0 * x).collect());
            let dout = random(q.len(), 103);
            let grads = gradients_by_finite_differences([&q, &k, &v, &dout], &s, 1.5, &mask, 1e-7);
            assert!(grads.dq.iter().any(|&x| x.abs() > 1e-3), "{mask:?}: a gradient worth testing");
        }
    }

    #[test]
    fn alibi_matches_the_brute_force() {
        // The bias -slope · |i + Sk - Sq - j| added to each (capped) logit, slopes per head and
        // per (batch, head), causal or not, Sq < Sk and Sq > Sk; per-sequence slopes equal the
        // sequence run alone with its row of them.
        let per_head = [0.5, 0.0, 1.25, 0.3];
        let per_batch = [0.5, 0.0, 1.25, 0.3, 2.0, 0.1, 0.7, 0.05];
        for (sq, sk) in [(5, 9), (9, 4)] {
            let s = shape(2, sq, sk, 4, 2, 3);
            let (q, k, v) = qkv(&s, 17);
            for (causal, softcap, slopes) in [(false, 0.0, &per_head[..]), (true, 0.0, &per_batch[..]), (false, 1.5, &per_batch[..])] {
                let mask = RefMask { causal, softcap, alibi_slopes: slopes, ..RefMask::default() };
                let got = attention_masked(&q, &k, &v, &s, 0.9, &mask);
                let (mut o, mut lse) = (vec![0.0; got.o.len()], vec![f64::NEG_INFINITY; got.lse.len()]);
                for b in 0..2 {
                    for h in 0..4 {
                        let slope = if slopes.len() == 4 { slopes[h] } else { slopes[b * 4 + h] };
                        for i in 0..sq {
                            let diag = i as i64 + sk as i64 - sq as i64;
                            let w: Vec<f64> = (0..sk)
                                .map(|j| {
                                    if causal && j as i64 > diag {
                                        return 0.0;
                                    }
                                    let logit = 0.9 * dot(&q[((b * sq + i) * 4 + h) * 3..][..3], &k[((b * sk + j) * 2 + h / 2) * 3..][..3]);
                                    let capped = if softcap > 0.0 { softcap * (logit / softcap).tanh() } else { logit };
                                    (capped - slope * (diag - j as i64).abs() as f64).exp()
                                })
                                .collect();
                            let sum: f64 = w.iter().sum();
                            if sum > 0.0 {
                                lse[(b * 4 + h) * sq + i] = sum.ln();
                                for (j, w) in w.iter().enumerate() {
                                    for c in 0..3 {
                                        o[((b * sq + i) * 4 + h) * 3 + c] += w / sum * v[((b * sk + j) * 2 + h / 2) * 3 + c];
                                    }
                                }
                            }
                        }
                    }
                }
                assert_close(&got.o, &o, 1e-12);
                assert_close(&got.lse, &lse, 1e-12);
                let plain = attention_masked(&q, &k, &v, &s, 0.9, &RefMask { alibi_slopes: &[], ..mask });
                assert!(plain.lse.iter().zip(&got.lse).any(|(a, b)| (a - b).abs() > 0.1), "the bias changes the result");
                // Sequence 1 alone, with its row of the slopes.
                let one = shape(1, sq, sk, 4, 2, 3);
                let (qn, kn) = (sq * 4 * 3, sk * 2 * 3);
                let alone = attention_masked(&q[qn..], &k[kn..], &v[kn..], &one, 0.9, &mask.for_sequence(1, 4));
                assert_close(&alone.o, &got.o[qn..], 1e-12);
            }
        }
    }

    #[test]
    fn rows_that_see_no_key_have_zero_gradient_and_no_nan() {
        let s = shape(1, 5, 2, 2, 1, 4);
        let (q, k, v) = qkv(&s, 97);
        let grads = attention_backward(&q, &k, &v, &random(q.len(), 98), &s, 1.0, true);
        assert!(grads.dq.iter().chain(&grads.dk).chain(&grads.dv).all(|x| x.is_finite()));
        assert!(grads.dq[..3 * 2 * 4].iter().all(|&x| x == 0.0), "rows 0..3 see no key");
    }

    #[test]
    #[should_panic(expected = "k has 5 elements")]
    fn inconsistent_lengths_panic_with_a_message() {
        attention(&[0.0; 4], &[0.0; 5], &[0.0; 4], &shape(1, 2, 2, 1, 1, 2), 1.0, false);
    }
}
