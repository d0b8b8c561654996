//! What can be checked of candle tensors before any GPU work (shapes, dtypes, the last dim's
//! stride, then devices): each failure is a candle error naming the argument. FlashCore checks
//! the rest (alignment, head dims, the options) when the call is made, naming the argument
//! too.

use candle_core::{DType, Result, Tensor};

/// `t` is on a CUDA device.
pub(crate) fn on_cuda(arg: &str, t: &Tensor) -> Result<()> {
    if !t.device().is_cuda() {
        candle_core::bail!("flashcore: `{arg}` must be on a CUDA device, it is on {:?}", t.device().location())
    }
    Ok(())
}

/// `t` is bf16 or f16 and of `q`'s dtype.
pub(crate) fn half_like(arg: &str, t: &Tensor, q: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::BF16 | DType::F16 if t.dtype() == q.dtype() => Ok(()),
        DType::BF16 | DType::F16 => candle_core::bail!("flashcore: `{arg}` is {:?} but `q` is {:?}", t.dtype(), q.dtype()),
        other => candle_core::bail!("flashcore: `{arg}` must be bf16 or f16, got {other:?}"),
    }
}

/// `t`'s last dim is contiguous (stride 1), as the kernels read rows of D values.
pub(crate) fn last_dim_contiguous(arg: &str, t: &Tensor) -> Result<()> {
    let stride = t.stride();
    if t.dims().last().copied().unwrap_or(0) > 1 && stride.last() != Some(&1) {
        candle_core::bail!("flashcore: the last dim of `{arg}` must be contiguous (stride 1), its strides are {stride:?}")
    }
    Ok(())
}

/// `t` has rank `rank`.
pub(crate) fn rank(arg: &str, t: &Tensor, rank: usize, what: &str) -> Result<()> {
    if t.rank() != rank {
        candle_core::bail!("flashcore: `{arg}` must be {what} (rank {rank}), its shape is {:?}", t.dims())
    }
    Ok(())
}

/// What every attention input must be: 16-bit, of `q`'s dtype, its last dim contiguous.
pub(crate) fn attention_input(arg: &str, t: &Tensor, q: &Tensor) -> Result<()> {
    half_like(arg, t, q)?;
    last_dim_contiguous(arg, t)
}

/// `q` is on a CUDA device and every other tensor of the call on the same one (checked after
/// the shapes and dtypes, so that those errors come first whatever the device).
pub(crate) fn devices(q: &Tensor, others: &[(&str, Option<&Tensor>)]) -> Result<()> {
    on_cuda("q", q)?;
    for (arg, t) in others.iter().filter_map(|(arg, t)| t.map(|t| (arg, t))) {
        on_cuda(arg, t)?;
        if !t.device().same_device(q.device()) {
            candle_core::bail!("flashcore: `{arg}` is on {:?}, `q` on {:?}", t.device().location(), q.device().location())
        }
    }
    Ok(())
}

/// q `[B, Sq, Hq, D]`, k and v `[B, Sk, Hkv, D]` (packed, without B) with `Hq % Hkv == 0`.
pub(crate) fn qkv(q: &Tensor, k: &Tensor, v: &Tensor, packed: bool) -> Result<()> {
    let (r, what) = if packed { (3, "[total, heads, head_dim]") } else { (4, "[batch, seqlen, heads, head_dim]") };
    rank("q", q, r, what)?;
    rank("k", k, r, what)?;
    rank("v", v, r, what)?;
    if k.dims() != v.dims() {
        candle_core::bail!("flashcore: `v` must be shaped as `k` {:?}, it is {:?}", k.dims(), v.dims())
    }
    let (qd, kd) = (q.dims(), k.dims());
    if !packed && qd[0] != kd[0] {
        candle_core::bail!("flashcore: `k` has batch {} but `q` has {}", kd[0], qd[0])
    }
    if qd[r - 1] != kd[r - 1] {
        candle_core::bail!("flashcore: `k` has head dim {} but `q` has {}", kd[r - 1], qd[r - 1])
    }
    let (hq, hkv) = (qd[r - 2], kd[r - 2]);
    if hkv == 0 || hq % hkv != 0 {
        candle_core::bail!("flashcore: `k` has {hkv} heads, which must divide `q`'s {hq}")
    }
    for (arg, t) in [("q", q), ("k", k), ("v", v)] {
        attention_input(arg, t, q)?;
    }
    Ok(())
}

/// A contiguous 1-D int32 (or uint32, candle's usual index type) vector of `len` values.
pub(crate) fn index_vector(arg: &str, t: &Tensor, len: Option<usize>) -> Result<()> {
    if !matches!(t.dtype(), DType::U32 | DType::I32) {
        candle_core::bail!("flashcore: `{arg}` must be u32 or i32, got {:?}", t.dtype())
    }
    rank(arg, t, 1, "a vector")?;
    if let Some(len) = len {
        if t.dims()[0] != len {
            candle_core::bail!("flashcore: `{arg}` must have {len} values, it has {}", t.dims()[0])
        }
    }
    if !t.is_contiguous() {
        candle_core::bail!("flashcore: `{arg}` must be contiguous")
    }
    Ok(())
}

/// Learnable sinks: f32, `[Hq]`, contiguous.
pub(crate) fn learnable_sink(t: &Tensor, heads: usize) -> Result<()> {
    if t.dtype() != DType::F32 {
        candle_core::bail!("flashcore: `learnable_sink` must be f32, got {:?}", t.dtype())
    }
    if t.dims() != [heads] {
        candle_core::bail!("flashcore: `learnable_sink` must be [{heads}], it is {:?}", t.dims())
    }
    if !t.is_contiguous() {
        candle_core::bail!("flashcore: `learnable_sink` must be contiguous")
    }
    Ok(())
}

/// ALiBi slopes: f32, `[Hq]` or `[B, Hq]`, contiguous.
pub(crate) fn alibi_slopes(t: &Tensor, batch: usize, heads: usize) -> Result<()> {
    if t.dtype() != DType::F32 {
        candle_core::bail!("flashcore: `alibi_slopes` must be f32, got {:?}", t.dtype())
    }
    if t.dims() != [heads] && t.dims() != [batch, heads] {
        candle_core::bail!("flashcore: `alibi_slopes` must be [{heads}] or [{batch}, {heads}], it is {:?}", t.dims())
    }
    if !t.is_contiguous() {
        candle_core::bail!("flashcore: `alibi_slopes` must be contiguous")
    }
    Ok(())
}
