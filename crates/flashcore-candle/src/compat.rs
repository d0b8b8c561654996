//! candle-flash-attn 0.11's public functions, with its names, signatures and semantics, on
//! FlashCore's kernels and with a backward. Differences: none in what a valid call returns
//! (bf16 rounding aside); `mm_prefix_ranges` (bidirectional multimodal prefixes) is refused by
//! name; head dims are those FlashCore runs (every multiple of 8 up to 256 on Hopper).
//!
//! Window arguments follow candle-flash-attn: `None` is unbounded on that side, and
//! `window_size_left = None, window_size_right = Some(0)` is causal. Varlen `seqlens_q` and
//! `seqlens_k` are cumulative, `[B + 1]` u32 (or i32).

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use crate::api::{attention, attention_varlen, attention_varlen_with_kvcache, VarlenSeqs};
use crate::check;
use crate::kvcache::{lengths_of, KvCache};
use crate::op::{AttnOp, Packing};
use crate::options::AttnOptions;

/// candle-flash-attn's op struct, for callers that build it and `apply_op3` it themselves.
/// Its backward recomputes the log-sum-exp with a second forward (the struct has no room to
/// keep it); the functions below keep it instead.
pub struct FlashAttn {
    /// Multiplies `q·k`.
    pub softmax_scale: f32,
    /// ALiBi slopes, f32 `[Hq]` or `[B, Hq]`.
    pub alibi_slopes: Option<Tensor>,
    /// Keys before the diagonal each query sees (`None`: all).
    pub window_size_left: Option<usize>,
    /// Keys after the diagonal each query sees (`None`: all; `Some(0)` with no left bound: causal).
    pub window_size_right: Option<usize>,
    /// Logit softcap.
    pub softcap: Option<f32>,
}

impl FlashAttn {
    fn options(&self) -> AttnOptions {
        AttnOptions::from_window(self.softmax_scale, self.window_size_left, self.window_size_right)
            .with_alibi(self.alibi_slopes.as_ref())
            .with_softcap(self.softcap)
    }

    fn op(&self) -> AttnOp {
        AttnOp::new(self.options(), Packing::Dense, false)
    }
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::device::cpu_refused()
    }

    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.op().cuda_fwd(q, q_l, k, k_l, v, v_l)
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        dout: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.op().bwd(q, k, v, o, dout)
    }
}

/// Dense attention with candle-flash-attn's window spelling and the other options.
fn dense(q: &Tensor, k: &Tensor, v: &Tensor, options: AttnOptions) -> Result<Tensor> {
    attention(q, k, v, &options)
}

/// Flash attention: `softmax(q·kᵀ · softmax_scale) · v`, `q [B, Sq, Hq, D]`, `k, v [B, Sk, Hkv, D]`
/// → `[B, Sq, Hq, D]`; `causal` bottom-right aligned.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    dense(q, k, v, AttnOptions::from_causal(softmax_scale, causal))
}

/// [`flash_attn`] with a sliding window (`None`: unbounded on that side).
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    dense(q, k, v, AttnOptions::from_window(softmax_scale, window_size_left, window_size_right))
}

/// [`flash_attn`] with ALiBi slopes (f32 `[Hq]`).
pub fn flash_attn_alibi(q: &Tensor, k: &Tensor, v: &Tensor, alibi_slopes: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    let options = AttnOptions::from_causal(softmax_scale, causal).with_alibi(Some(alibi_slopes));
    dense(q, k, v, options)
}

/// [`flash_attn_windowed`] with ALiBi slopes.
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let options = AttnOptions::from_window(softmax_scale, window_size_left, window_size_right).with_alibi(Some(alibi_slopes));
    dense(q, k, v, options)
}

/// [`flash_attn_windowed`] with optional ALiBi slopes and a logit softcap.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let options =
        AttnOptions::from_window(softmax_scale, window_size_left, window_size_right).with_alibi(alibi_slopes).with_softcap(Some(softcap));
    dense(q, k, v, options)
}

/// A packed batch with candle-flash-attn's arguments (cumulative `seqlens_q`, `seqlens_k`).
#[allow(clippy::too_many_arguments)]
fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    options: AttnOptions,
) -> Result<Tensor> {
    let seqs = VarlenSeqs { cu_seqlens_q: seqlens_q.clone(), cu_seqlens_k: seqlens_k.clone(), max_seqlen_q, max_seqlen_k };
    attention_varlen(q, k, v, &seqs, &options)
}

/// Flash attention over a packed batch: `q [total_q, Hq, D]`, `k, v [total_k, Hkv, D]`,
/// `seqlens_q`, `seqlens_k` the cumulative lengths `[B + 1]` (u32).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let options = AttnOptions::from_causal(softmax_scale, causal);
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, options)
}

/// [`flash_attn_varlen`] with a sliding window.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let options = AttnOptions::from_window(softmax_scale, window_size_left, window_size_right);
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, options)
}

/// Packed queries over a paged KV cache: `q [total_q, Hq, D]`, `k, v [num_blocks,
/// page_block_size, Hkv, D]`, `block_table [B, max_blocks]` (u32 or i32), `seqlens_q` and
/// `seqlens_k` cumulative `[B + 1]` (sequence `b` uses its first `seqlens_k[b + 1] -
/// seqlens_k[b]` cached keys). Forward only. `page_block_size` must be a multiple of 16;
/// `mm_prefix_ranges` is not supported (an error naming it).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    let _ = max_seqlen_k; // the cache's lengths bound the keys
    if mm_prefix_ranges.is_some() {
        candle_core::bail!("flashcore: `mm_prefix_ranges` (bidirectional prefix ranges) is not supported")
    }
    check::rank("k", k, 4, "[num_blocks, page_block_size, heads, head_dim]")?;
    if k.dims()[1] != page_block_size {
        candle_core::bail!("flashcore: `page_block_size` {page_block_size} differs from `k`'s dim 1 ({})", k.dims()[1])
    }
    check::rank("q", q, 3, "[total_q, heads, head_dim]")?;
    check::index_vector("seqlens_k", seqlens_k, None)?;
    let options = AttnOptions::from_window(softmax_scale, window_size_left, window_size_right).with_softcap(softcap);
    let cache = KvCache { cache_seqlens: Some(lengths_of(seqlens_k)?), block_table: Some(block_table.clone()) };
    attention_varlen_with_kvcache(q, k, v, seqlens_q, max_seqlen_q, &cache, &options)
}

/// [`flash_attn_varlen`] with ALiBi slopes.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let options = AttnOptions::from_causal(softmax_scale, causal).with_alibi(Some(alibi_slopes));
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, options)
}

/// [`flash_attn_varlen_windowed`] with ALiBi slopes.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let options = AttnOptions::from_window(softmax_scale, window_size_left, window_size_right).with_alibi(Some(alibi_slopes));
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, options)
}

/// [`flash_attn_varlen_windowed`] with optional ALiBi slopes and a logit softcap.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let options =
        AttnOptions::from_window(softmax_scale, window_size_left, window_size_right).with_alibi(alibi_slopes).with_softcap(Some(softcap));
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, options)
}
