//! Attention parameters and the problem shape, with its FLOP and byte counts.

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
    /// `fwd_sm80` family splits; capped at the number of key tiles.
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
    /// Logit softcapping (Gemma 2): each score `s = q·k · softmax_scale` becomes
    /// `softcap · tanh(s / softcap)` before the softmax (the scale applies inside the tanh,
    /// as in flash_attn). `0` is off; otherwise finite and > 0. The backward takes it too.
    pub softcap: f32,
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
    pub fn mask(&self) -> (bool, Option<Window>) {
        let right = if self.causal { 0 } else { self.window.right };
        match (self.window.left, right) {
            (-1, -1) => (false, None),
            (-1, 0) => (true, None),
            (left, right) => (false, Some(Window { left, right })),
        }
    }

    /// Checks the window's sides (-1 or >= 0) and the softcap (0, or finite and > 0): the
    /// error names the argument. The GPU calls check them themselves.
    pub fn check_window_and_softcap(&self) -> crate::Result<()> {
        crate::validate::window_and_softcap(self.window, self.softcap)
    }

    /// Whether scores are softcapped.
    pub fn has_softcap(&self) -> bool {
        self.softcap != 0.0
    }
}

/// The shape of one attention problem: `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProblemShape {
    /// Batch size `B`.
    pub batch: usize,
    /// Query sequence length `Sq`.
    pub seqlen_q: usize,
    /// Key/value sequence length `Sk`.
    pub seqlen_k: usize,
    /// Query heads `Hq`.
    pub heads_q: usize,
    /// Key/value heads `Hkv`; `Hq % Hkv == 0` (GQA/MQA).
    pub heads_kv: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
}

impl ProblemShape {
    /// Number of (query, key) pairs one head attends to, under the mask.
    pub fn visible_pairs(&self, causal: bool) -> u64 {
        let (sq, sk) = (self.seqlen_q as u64, self.seqlen_k as u64);
        if !causal {
            return sq * sk;
        }
        // Row i sees keys 0..=i+sk-sq, clamped to [0, sk].
        (0..sq).map(|i| (i + sk + 1).saturating_sub(sq).min(sk)).sum()
    }

    /// Matrix FLOPs of the forward pass, `4·B·Hq·Sq·Sk·D`: two products of `2·D` FLOPs
    /// per (query, key) pair. Causal with `Sq = Sk` counts exactly half, the convention of
    /// FlashAttention's and cuDNN's benchmarks; causal with `Sq != Sk` counts the visible
    /// pairs.
    pub fn flops(&self, causal: bool) -> f64 {
        let per_pair = 4.0 * (self.batch * self.heads_q * self.head_dim) as f64;
        if causal && self.seqlen_q == self.seqlen_k {
            per_pair * (self.seqlen_q * self.seqlen_k) as f64 / 2.0
        } else {
            per_pair * self.visible_pairs(causal) as f64
        }
    }

    /// The fewest bytes a forward pass moves: q, k, v read once, o written once
    /// (`elem_bytes` per element), and the f32 log-sum-exp.
    pub fn min_bytes(&self, elem_bytes: usize) -> f64 {
        let q = self.batch * self.seqlen_q * self.heads_q * self.head_dim;
        let kv = 2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim;
        ((2 * q + kv) * elem_bytes + 4 * self.batch * self.heads_q * self.seqlen_q) as f64
    }

    /// Bytes of K and V, the traffic that bounds decode.
    pub fn kv_bytes(&self, elem_bytes: usize) -> f64 {
        (2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim * elem_bytes) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(sq: usize, sk: usize) -> ProblemShape {
        ProblemShape { batch: 1, seqlen_q: sq, seqlen_k: sk, heads_q: 1, heads_kv: 1, head_dim: 1 }
    }

    #[test]
    fn visible_pairs_count_the_bottom_right_mask() {
        assert_eq!(shape(3, 5).visible_pairs(true), 3 + 4 + 5);
        assert_eq!(shape(4, 4).visible_pairs(true), 10);
        assert_eq!(shape(5, 2).visible_pairs(true), 1 + 2);
        assert_eq!(shape(5, 2).visible_pairs(false), 10);
    }

    #[test]
    fn flops_match_the_dense_formula() {
        let s = ProblemShape { batch: 2, seqlen_q: 8, seqlen_k: 16, heads_q: 4, heads_kv: 2, head_dim: 64 };
        assert_eq!(s.flops(false), 4.0 * 2.0 * 4.0 * 8.0 * 16.0 * 64.0);
        let square = ProblemShape { seqlen_k: 8, ..s };
        assert_eq!(square.flops(true), square.flops(false) / 2.0, "causal Sq = Sk is half by convention");
    }
}
