//! The options of one attention call, as one struct (rather than a function name per
//! combination), and how they become FlashCore's [`flashcore::AttnParams`].

use candle_core::Tensor;
use flashcore::{AttnParams, KernelFamily, Window};

/// How attention is computed: scale, masks, score transforms, and which kernels run it.
/// `AttnOptions::default()` is full (non-causal) attention scaled by `1/sqrt(D)`.
///
/// ```
/// use flashcore_candle::AttnOptions;
/// let opts = AttnOptions { window: (Some(256), Some(0)), softcap: Some(50.0), ..AttnOptions::causal() };
/// assert!(opts.causal && opts.softmax_scale.is_none());
/// ```
#[derive(Debug, Clone, Default)]
pub struct AttnOptions {
    /// Multiplies `q·k`; `None`: `1/sqrt(D)`.
    pub softmax_scale: Option<f32>,
    /// Causal mask, bottom-right aligned when `Sq != Sk` (query `i` sees key `j` iff
    /// `j <= i + Sk - Sq`), as FlashAttention 2.1 and later.
    pub causal: bool,
    /// Sliding window `(left, right)` around each query's bottom-right diagonal, in keys;
    /// `None` leaves a side unbounded (candle-flash-attn's `window_size_left/right`).
    pub window: (Option<usize>, Option<usize>),
    /// Chunked attention (Llama 4): each query sees only the keys of the chunk of this many
    /// that holds its diagonal key ([`AttnParams::attention_chunk`]); `None` off. Forward and
    /// backward.
    pub attention_chunk: Option<usize>,
    /// Logit softcap: scores become `softcap · tanh(score / softcap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// ALiBi slopes, f32 `[Hq]` or `[B, Hq]` on the GPU: score `(i, j)` gains
    /// `-slope · |i + Sk - Sq - j|`.
    pub alibi_slopes: Option<Tensor>,
    /// Learnable sinks (gpt-oss; [`flashcore::LearnableSinks`]), f32 `[Hq]` on the GPU: one
    /// logit a query head in every row's softmax denominator, with no value. The gradients of
    /// `q`, `k` and `v` take them into account; the sinks themselves get none through candle's
    /// autograd (its three-input custom op): frozen sinks, as in inference or fine-tuning
    /// that keeps them fixed.
    pub learnable_sink: Option<Tensor>,
    /// Bitwise-reproducible gradients (no order-dependent float atomics in the backward), at
    /// a cost. The forward is always deterministic.
    pub deterministic: bool,
    /// Force the forward's kernel family (`None`: the fastest for the GPU), e.g.
    /// [`KernelFamily::FwdSm80`] to run the Ampere-class kernels on a Hopper GPU.
    pub forward_kernel: Option<KernelFamily>,
    /// Force the backward's kernel family (`None`: the fastest for the GPU), e.g.
    /// [`KernelFamily::BwdSm80`].
    pub backward_kernel: Option<KernelFamily>,
}

impl AttnOptions {
    /// Causal attention scaled by `1/sqrt(D)`.
    pub fn causal() -> Self {
        Self { causal: true, ..Self::default() }
    }

    /// These options with the Ampere-class kernels (`fwd_sm80`, `bwd_sm80`) forced, as they
    /// run on an A100 or an L4, whatever the GPU.
    pub fn ampere_kernels(self) -> Self {
        Self { forward_kernel: Some(KernelFamily::FwdSm80), backward_kernel: Some(KernelFamily::BwdSm80), ..self }
    }

    /// candle-flash-attn's `softmax_scale` and `causal` arguments.
    pub(crate) fn from_causal(softmax_scale: f32, causal: bool) -> Self {
        Self { softmax_scale: Some(softmax_scale), causal, ..Self::default() }
    }

    /// These options with candle-flash-attn's optional ALiBi slopes.
    pub(crate) fn with_alibi(self, alibi_slopes: Option<&Tensor>) -> Self {
        Self { alibi_slopes: alibi_slopes.cloned(), ..self }
    }

    /// These options with candle-flash-attn's optional softcap.
    pub(crate) fn with_softcap(self, softcap: Option<f32>) -> Self {
        Self { softcap, ..self }
    }

    /// candle-flash-attn's window arguments: `window_size_right == Some(0)` with no left bound
    /// is its spelling of a causal mask.
    pub(crate) fn from_window(softmax_scale: f32, left: Option<usize>, right: Option<usize>) -> Self {
        let causal = left.is_none() && right == Some(0);
        let window = if causal { (None, None) } else { (left, right) };
        Self { softmax_scale: Some(softmax_scale), causal, window, ..Self::default() }
    }

    /// FlashCore's parameters for the forward (`backward`: for the backward).
    pub(crate) fn params(&self, backward: bool) -> AttnParams {
        // A side longer than any sequence is unbounded in effect: clamp it to the kernels' i32.
        let side = |w: Option<usize>| w.map_or(-1, |n| n.min(i32::MAX as usize) as i32);
        let window = Window::new(side(self.window.0), side(self.window.1));
        AttnParams {
            softmax_scale: self.softmax_scale,
            causal: self.causal,
            kernel: if backward { self.backward_kernel } else { self.forward_kernel },
            deterministic: self.deterministic,
            window,
            attention_chunk: self.attention_chunk.unwrap_or(0),
            softcap: self.softcap.unwrap_or(0.0),
            ..AttnParams::default()
        }
    }
}
