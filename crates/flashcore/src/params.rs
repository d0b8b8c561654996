//! Attention parameters and the problem shape, with its FLOP and byte counts.

use crate::error::{Error, Result};
use crate::shape::ProblemShape;

/// Parameters of one attention call.
///
/// ```
/// use flashcore::AttnParams;
/// let p = AttnParams::causal();
/// assert!(p.causal && p.softmax_scale.is_none());
/// let p = AttnParams { softmax_scale: Some(0.1), ..AttnParams::default() };
/// assert_eq!(p.scale_for(64), 0.1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttnParams {
    /// Multiplies `q·k`; `None` means `1/sqrt(D)`. Must be finite and ≥ 0.
    pub softmax_scale: Option<f32>,
    /// Causal mask, **bottom-right aligned** when `Sq != Sk` (as FlashAttention ≥ 2.1):
    /// query `i` sees key `j` iff `j <= i + Sk - Sq`. With `Sq = 3, Sk = 5` (`x` = visible):
    ///
    /// ```text
    ///          k0 k1 k2 k3 k4
    ///     q0 [ x  x  x  .  . ]
    ///     q1 [ x  x  x  x  . ]
    ///     q2 [ x  x  x  x  x ]
    /// ```
    ///
    /// With `Sq > Sk` the first `Sq - Sk` query rows see no key at all: their output is 0
    /// and their log-sum-exp is `-inf`.
    pub causal: bool,
    /// Force a kernel family; `None` lets FlashCore pick the fastest for the device.
    pub kernel: Option<crate::kernels::KernelFamily>,
    /// Split-KV: how many CTAs share each query tile's keys (their partial results are
    /// merged by a second pass). `None` picks it from the grid and the GPU (decode and
    /// other grids too small to fill it are split); `Some(1)` never splits. Only the
    /// `fwd_sm80` family splits; capped at the number of key tiles. Over a KV cache
    /// ([`crate::PagedKv`]) the split tiles instead share the key tiles of all query tiles of a
    /// head in B x query blocks x `num_splits` equal chunks, whatever the sequences' lengths.
    ///
    /// In a deterministic backward run by bwd_sm80, the number of slices dQ's sums are split
    /// into (CTAs a KV head; `None`: as many as fill the GPU once), capped at the key blocks:
    /// the gradients are bitwise the same for the same count, so a fixed count makes a
    /// sequence's gradients in a packed batch bitwise those of the sequence alone.
    pub num_splits: Option<usize>,
    /// Backward only: bitwise-reproducible gradients (no order-dependent float atomics), at
    /// a cost, run to run on one GPU model (bwd_sm80 splits dQ's sums by the SM count). The
    /// forward is always deterministic.
    pub deterministic: bool,
    /// Sliding-window attention (flash_attn's `window_size`): query `i` sees key `j` iff
    /// `i + Sk - Sq - left <= j <= i + Sk - Sq + right` (bottom-right aligned, as the causal
    /// mask); `-1` leaves a side unbounded. With `causal` the right side is 0. The default,
    /// [`Window::UNBOUNDED`], is no window. The backward takes it too (the same window).
    pub window: Window,
    /// Chunked attention (Llama 4; FlashAttention-3's `attention_chunk`): the keys are cut into
    /// chunks of this many from key 0, and query `i` sees only keys of the chunk that holds its
    /// diagonal key `i + Sk - Sq` (with `causal`, those up to the diagonal; with a `window`,
    /// those the window keeps too). `0` is off. Runs as a window whose sides are at most
    /// `attention_chunk - 1` ([`AttnParams::mask`]).
    pub attention_chunk: usize,
    /// Logit softcapping (Gemma 2): each score `s = q·k · softmax_scale` becomes
    /// `softcap · tanh(s / softcap)` before the softmax (the scale applies inside the tanh,
    /// as in flash_attn). `0` is off; otherwise finite and > 0. The backward takes it too.
    pub softcap: f32,
    /// Attention dropout ([`crate::Dropout`]: the probability and the generator state), or
    /// none. Runs on the Ampere-class kernels (fwd_sm80, bwd_sm80) on every GPU; the backward
    /// takes the forward's, to regenerate its mask.
    pub dropout: Option<crate::Dropout>,
}

/// A sliding window's sides, in keys: `-1` is unbounded (see [`AttnParams::window`]).
///
/// ```
/// use flashcore::{AttnParams, Window};
/// let p = AttnParams { window: Window::new(127, 0), ..AttnParams::default() };
/// assert_eq!(p.mask(), (false, Some(Window::new(127, 0))));
/// assert_eq!(AttnParams { window: Window::new(-1, 0), ..p }.mask(), (true, None), "(-1, 0) is causal");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Keys before the query's diagonal it sees (`-1`: all).
    pub left: i32,
    /// Keys after the query's diagonal it sees (`-1`: all).
    pub right: i32,
}

impl Window {
    /// No window: every key (or, causal, every key up to the diagonal).
    pub const UNBOUNDED: Window = Window { left: -1, right: -1 };

    /// The window `(left, right)`, flash_attn's `window_size`.
    pub const fn new(left: i32, right: i32) -> Self {
        Window { left, right }
    }
}

impl Default for Window {
    fn default() -> Self {
        Window::UNBOUNDED
    }
}

impl AttnParams {
    /// Causal attention with the default scale.
    pub fn causal() -> Self {
        Self { causal: true, ..Self::default() }
    }

    /// The scale actually used for head dim `head_dim`.
    pub fn scale_for(&self, head_dim: usize) -> f32 {
        self.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }

    /// The mask the kernels run: (causal, a window), with causal folded into the window's
    /// right side (0) when there is a window, and a window that is only causal (`(-1, 0)`)
    /// or unbounded returned as none.
    /// Chunked attention runs as a window too, each side at most a chunk less one (a key
    /// further from the diagonal is in another chunk), the chunk's bounds beside it.
    pub fn mask(&self) -> (bool, Option<Window>) {
        let right = if self.causal { 0 } else { self.window.right };
        if self.attention_chunk > 0 {
            let most = i32::try_from(self.attention_chunk - 1).unwrap_or(i32::MAX);
            let side = |s: i32| if s < 0 { most } else { s.min(most) };
            return (false, Some(Window { left: side(self.window.left), right: side(right) }));
        }
        match (self.window.left, right) {
            (-1, -1) => (false, None),
            (-1, 0) => (true, None),
            (left, right) => (false, Some(Window { left, right })),
        }
    }

    /// Checks the scalar parameters for head dim `head_dim`, as every call (GPU or CPU
    /// reference) does before it runs: the scale actually used (finite and >= 0), the
    /// window's sides (-1 or >= 0) and the softcap (0, or finite and > 0). The error names the
    /// argument.
    ///
    /// ```
    /// use flashcore::AttnParams;
    /// assert!(AttnParams::causal().check(128).is_ok());
    /// let bad = AttnParams { softmax_scale: Some(f32::NAN), ..AttnParams::default() };
    /// assert!(bad.check(128).unwrap_err().to_string().contains("softmax_scale"));
    /// ```
    pub fn check(&self, head_dim: usize) -> Result<()> {
        let scale = self.scale_for(head_dim);
        if !scale.is_finite() || scale < 0.0 {
            return Err(Error::Param { arg: "softmax_scale", msg: format!("{scale} must be finite and >= 0") });
        }
        self.check_window_and_softcap()
    }

    /// Checks the window's sides (-1 or >= 0), the chunk (fits an `i32`) and the softcap (0, or
    /// finite and > 0), the part of [`AttnParams::check`] that needs no head dim: the error
    /// names the argument.
    pub fn check_window_and_softcap(&self) -> Result<()> {
        let Window { left, right } = self.window;
        if left < -1 || right < -1 {
            let msg = format!("({left}, {right}): each side must be -1 (unbounded) or >= 0");
            return Err(Error::Param { arg: "window", msg });
        }
        if self.attention_chunk > i32::MAX as usize {
            return Err(Error::Param { arg: "attention_chunk", msg: format!("{} must be at most {}", self.attention_chunk, i32::MAX) });
        }
        if !self.softcap.is_finite() || self.softcap < 0.0 {
            return Err(Error::Param { arg: "softcap", msg: format!("{} must be 0 (off), or finite and > 0", self.softcap) });
        }
        self.dropout.as_ref().map_or(Ok(()), crate::Dropout::check)
    }

    /// Whether scores are softcapped.
    pub fn has_softcap(&self) -> bool {
        self.softcap != 0.0
    }

    /// The (query, key) pairs a sequence of `seqlen_q` queries over `seqlen_k` keys attends
    /// to under this mask (causal and window, bottom-right aligned: query `i` sees keys
    /// `i + Sk - Sq - left ..= i + Sk - Sq + right`, clamped to the keys), counted exactly.
    /// The one count behind every FLOP figure: dense problems, windows, and each sequence
    /// of a packed batch (`bench` sums it over the sequences).
    ///
    /// ```
    /// use flashcore::{AttnParams, Window};
    /// assert_eq!(AttnParams::default().visible_pairs(3, 5), 15);
    /// assert_eq!(AttnParams::causal().visible_pairs(3, 5), 3 + 4 + 5);
    /// let w = AttnParams { window: Window::new(1, 0), ..AttnParams::default() };
    /// assert_eq!(w.visible_pairs(4, 4), 1 + 2 + 2 + 2);
    /// ```
    pub fn visible_pairs(&self, seqlen_q: usize, seqlen_k: usize) -> u64 {
        let (causal, window) = self.mask();
        (0..seqlen_q)
            .map(|i| {
                let (first, end) =
                    visible_keys(i as i64 + seqlen_k as i64 - seqlen_q as i64, seqlen_k, causal, window, self.attention_chunk);
                (end - first) as u64
            })
            .sum()
    }
}

/// Keys `[first, end)` that a query row sees among `seqlen_k` (`first == end`: none), its
/// diagonal key `diagonal = i + Sk - Sq` (bottom-right aligned; may be negative or past the
/// keys): up to the diagonal when `causal`; within `window`'s sides of it (-1 unbounded); with
/// `chunk` > 0, within the diagonal's chunk `[c, c + chunk)`, `c` the largest multiple of
/// `chunk` not above it. The host's one statement of the rule the kernels' `KeyMask`
/// (`kernels/common/mask.cuh`) applies: the reference and the pair counts take it.
pub(crate) fn visible_keys(diagonal: i64, seqlen_k: usize, causal: bool, window: Option<Window>, chunk: usize) -> (usize, usize) {
    let (mut first, mut end) = (0i64, seqlen_k as i64);
    if causal {
        end = end.min(diagonal + 1);
    }
    if let Some(w) = window {
        if w.right >= 0 {
            end = end.min(diagonal + w.right as i64 + 1);
        }
        if w.left >= 0 {
            first = first.max(diagonal - w.left as i64);
        }
    }
    if chunk > 0 {
        let start = diagonal.div_euclid(chunk as i64) * chunk as i64;
        first = first.max(start);
        end = end.min(start + chunk as i64);
    }
    let end = end.max(0);
    (first.clamp(0, end) as usize, end as usize)
}

/// The problem's counts under a mask, here beside the mask's rules.
impl ProblemShape {
    /// Number of (query, key) pairs one head of one batch entry attends to under `params`'s
    /// mask (its causal flag and window); see [`AttnParams::visible_pairs`].
    pub fn visible_pairs(&self, params: &AttnParams) -> u64 {
        params.visible_pairs(self.seqlen_q, self.seqlen_k)
    }

    /// Matrix FLOPs of the forward pass, `2·B·Hq·(D + Dv)·(visible pairs)` (`4·B·Hq·D` a pair
    /// with one head dim): the products `q·k` (`2·D` FLOPs) and `p·v` (`2·Dv`) per (query, key)
    /// pair the mask of `params` lets through. Causal with `Sq = Sk`
    /// (and no window) counts exactly half, `Sq·Sk/2`, the convention of FlashAttention's
    /// and cuDNN's benchmarks; every other mask counts its pairs exactly, so a windowed
    /// case's rate compares with a causal one's per visible pair. The backward's are 2.5x.
    pub fn flops(&self, params: &AttnParams) -> f64 {
        let per_pair = 2.0 * (self.batch * self.heads_q * (self.head_dim + self.head_dim_v)) as f64;
        if params.mask() == (true, None) && self.seqlen_q == self.seqlen_k {
            per_pair * (self.seqlen_q * self.seqlen_k) as f64 / 2.0
        } else {
            per_pair * self.visible_pairs(params) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(sq: usize, sk: usize) -> ProblemShape {
        ProblemShape { batch: 1, seqlen_q: sq, seqlen_k: sk, heads_q: 1, heads_kv: 1, head_dim: 1, head_dim_v: 1 }
    }

    fn windowed(left: i32, right: i32, causal: bool) -> AttnParams {
        AttnParams { causal, window: Window::new(left, right), ..AttnParams::default() }
    }

    /// The pairs by brute force over every (query, key) under the documented rule.
    fn brute(sq: usize, sk: usize, p: &AttnParams) -> u64 {
        let right = if p.causal { 0 } else { p.window.right };
        let chunk = p.attention_chunk as i64;
        let sees = |i: i64, j: i64| {
            let diag = i + sk as i64 - sq as i64;
            (p.window.left < 0 || j >= diag - p.window.left as i64)
                && (right < 0 || j <= diag + right as i64)
                && (chunk == 0 || j.div_euclid(chunk) == diag.div_euclid(chunk))
        };
        (0..sq as i64).map(|i| (0..sk as i64).filter(|&j| sees(i, j)).count() as u64).sum()
    }

    #[test]
    fn visible_pairs_count_the_bottom_right_mask() {
        let causal = AttnParams::causal();
        assert_eq!(shape(3, 5).visible_pairs(&causal), 3 + 4 + 5);
        assert_eq!(shape(4, 4).visible_pairs(&causal), 10);
        assert_eq!(shape(5, 2).visible_pairs(&causal), 1 + 2);
        assert_eq!(shape(5, 2).visible_pairs(&AttnParams::default()), 10);
    }

    #[test]
    fn visible_pairs_count_windows_exactly() {
        for (sq, sk) in [(1, 1), (4, 4), (3, 5), (5, 2), (1, 7), (7, 1), (37, 100), (100, 37), (0, 5), (5, 0)] {
            for (left, right) in [(-1, -1), (-1, 0), (0, 0), (1, 0), (3, 2), (-1, 4), (6, -1), (200, 0)] {
                for (causal, chunk) in [false, true].into_iter().flat_map(|c| [0, 1, 3, 8, 64].map(|n| (c, n))) {
                    let p = AttnParams { attention_chunk: chunk, ..windowed(left, right, causal) };
                    let what = format!("sq {sq} sk {sk} window ({left}, {right}) causal {causal} chunk {chunk}");
                    assert_eq!(p.visible_pairs(sq, sk), brute(sq, sk, &p), "{what}");
                }
            }
        }
        // S 16k, window (4096, 0): row i sees min(i, 4096) + 1 keys.
        let w = windowed(4096, 0, false).visible_pairs(16384, 16384);
        assert_eq!(w, (0..16384u64).map(|i| i.min(4096) + 1).sum::<u64>());
    }

    #[test]
    fn the_scale_must_be_finite_and_not_negative() {
        let scaled = |s| AttnParams { softmax_scale: Some(s), ..AttnParams::default() };
        assert!(scaled(0.125).check(64).is_ok());
        assert!(scaled(0.0).check(64).is_ok());
        for bad in [-0.125, f32::NAN, f32::INFINITY] {
            assert!(matches!(scaled(bad).check(64), Err(Error::Param { arg: "softmax_scale", .. })), "{bad}");
        }
    }

    #[test]
    fn a_chunk_runs_as_a_window_of_at_most_a_chunk_each_side() {
        let chunked = |left, right, causal| AttnParams { attention_chunk: 8, ..windowed(left, right, causal) };
        assert_eq!(chunked(-1, -1, false).mask(), (false, Some(Window::new(7, 7))));
        assert_eq!(chunked(-1, -1, true).mask(), (false, Some(Window::new(7, 0))), "causal folded in");
        assert_eq!(chunked(3, 100, false).mask(), (false, Some(Window::new(3, 7))));
        let one = AttnParams { attention_chunk: 1, ..AttnParams::default() };
        assert_eq!(one.mask(), (false, Some(Window::new(0, 0))), "a chunk of one key: the diagonal alone");
        let too_long = AttnParams { attention_chunk: 1 << 31, ..AttnParams::default() };
        assert!(matches!(too_long.check(64), Err(Error::Param { arg: "attention_chunk", .. })));
        // Llama 4's chunk of 8192 keys over 16k causal: each row sees its chunk's keys up to itself.
        let llama = AttnParams { attention_chunk: 8192, ..AttnParams::causal() };
        assert_eq!(llama.visible_pairs(16384, 16384), 2 * (8192 * 8193 / 2));
    }

    #[test]
    fn window_sides_and_softcap_are_checked() {
        let with = |window, softcap| AttnParams { window, softcap, ..AttnParams::default() };
        assert!(with(Window::UNBOUNDED, 0.0).check(64).is_ok());
        assert!(with(Window::new(0, 0), 50.0).check(64).is_ok());
        for bad in [Window::new(-2, 0), Window::new(4, -7)] {
            assert!(matches!(with(bad, 0.0).check(64), Err(Error::Param { arg: "window", .. })), "{bad:?}");
        }
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(with(Window::UNBOUNDED, bad).check(64), Err(Error::Param { arg: "softcap", .. })), "{bad}");
        }
    }

    #[test]
    fn flops_match_the_dense_formula() {
        let s = ProblemShape { batch: 2, seqlen_q: 8, seqlen_k: 16, heads_q: 4, heads_kv: 2, head_dim: 64, head_dim_v: 64 };
        let (dense, causal) = (AttnParams::default(), AttnParams::causal());
        assert_eq!(s.flops(&dense), 4.0 * 2.0 * 4.0 * 8.0 * 16.0 * 64.0);
        let square = ProblemShape { seqlen_k: 8, ..s };
        assert_eq!(square.flops(&causal), square.flops(&dense) / 2.0, "causal Sq = Sk is half by convention");
        assert_eq!(square.flops(&windowed(-1, 0, false)), square.flops(&causal), "(-1, 0) is the causal mask");
        let w = windowed(2, 0, false);
        assert_eq!(square.flops(&w), 4.0 * 2.0 * 4.0 * 64.0 * w.visible_pairs(8, 8) as f64, "a window counts its pairs");
        assert_eq!(square.flops(&AttnParams { softcap: 30.0, ..dense }), square.flops(&dense), "softcap adds no matrix FLOPs");
    }
}
