//! What `attn` reads and writes, and its moves to and from the GPU.

use anyhow::{bail, Result};
use flashcore::{Context, DType, DeviceTensor};

use crate::attn::args::{gpu_dtype, AttnArgs};
use crate::io::HostTensor;

/// GPU 0 and the dtype it runs `q` in (`--dtype`, else the file's). The GPU first: without
/// one, that is what to say, whatever the file's dtype.
pub(crate) fn gpu_and_dtype(args: &AttnArgs, q: &HostTensor) -> Result<(Context, DType)> {
    let ctx = Context::new(0)?;
    Ok((ctx, gpu_dtype(args, q)?))
}

/// `t`'s shape as `[B, S, H, D]`; the error names it `name`.
pub(crate) fn shape4(t: &HostTensor, name: &str) -> Result<[usize; 4]> {
    match t.shape[..] {
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => bail!("`{name}` must be rank 4 [B, S, H, D], got {:?}", t.shape),
    }
}

/// A shape error as the library words one ("shape of `k`: ..."), so that `--cpu` refuses
/// a shape in the words the GPU path would.
pub(crate) fn shape_error(arg: &'static str, msg: String) -> anyhow::Error {
    flashcore::Error::Shape { arg, msg }.into()
}

/// Whether a layout's `v` may have a head dim of its own (`ProblemShape::head_dim_v`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueHeadDim {
    /// Dense calls: in the f64 reference (`--cpu`); the GPU kernels refuse it by name.
    Own,
    /// Packed batches and KV caches: V's head dim is the keys'.
    AsKeys,
}

/// Checks `q [B, Sq, Hq, D]` against the keys `[B', Sk, Hkv, D]` and values `[B', Sk, Hkv, Dv]`
/// (`k` and `v`, or a KV cache's `k_cache` and `v_cache`) as the library checks them, each
/// error naming the tensor, the dimension and both values: every tensor rank 4 with heads and
/// a head dim (no sequences, rows or keys is a call with nothing to compute, answered as the
/// library answers it: `o` zero, `lse` -inf), `k`'s head dim `q`'s, `v` shaped as `k` but for
/// its head dim (which `value_head_dim` lets differ or not), `q`'s heads a multiple of `k`'s.
/// The batches are the caller's to check (a packed batch's is 1, a page pool's is its page
/// count). Returns q's and k's shapes and V's head dim.
pub(crate) fn problem_shapes(
    q: &HostTensor,
    [(k_name, k), (v_name, v)]: [(&'static str, &HostTensor); 2],
    value_head_dim: ValueHeadDim,
) -> Result<([usize; 4], [usize; 4], usize)> {
    let (q_shape, k_shape) = (shape4(q, "q")?, shape4(k, k_name)?);
    let ([_, _, hq, d], [_, _, hkv, kd]) = (q_shape, k_shape);
    shape4(v, v_name)?;
    if let Some((arg, t)) = [("q", q), (k_name, k), (v_name, v)].into_iter().find(|(_, t)| t.shape[2] == 0 || t.shape[3] == 0) {
        return Err(shape_error(arg, format!("{:?} has no heads or no head dim", t.shape)));
    }
    // `k` against `q` before `v` against `k`: a `k` whose head dim is wrong is the one to name.
    if kd != d {
        return Err(shape_error(k_name, format!("head dim {kd} differs from q's head dim {d}")));
    }
    let dv = v.shape[3];
    let own_allowed = value_head_dim == ValueHeadDim::Own;
    if v.shape[..3] != k.shape[..3] || (dv != kd && !own_allowed) {
        return Err(shape_error(v_name, format!("{:?} differs from {k_name}'s {:?}", v.shape, k.shape)));
    }
    if hq % hkv != 0 {
        return Err(shape_error(k_name, format!("q heads ({hq}) are not a multiple of k/v heads ({hkv})")));
    }
    Ok((q_shape, k_shape, dv))
}

/// What `attn` writes: o, lse and, with `do` in the input, the gradients dq, dk, dv.
pub(crate) struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub grads: Option<[Vec<f64>; 3]>,
}

/// `t` on the GPU in `dtype` (its values rounded to nearest).
pub(crate) fn upload(ctx: &Context, t: &HostTensor, dtype: DType) -> Result<DeviceTensor> {
    let data: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
    Ok(DeviceTensor::from_f32(ctx, &data, shape4(t, "tensor")?, dtype)?)
}

/// `t`'s values, widened to f64.
pub(crate) fn download(ctx: &Context, t: &DeviceTensor) -> Result<Vec<f64>> {
    Ok(t.to_f32(ctx)?.into_iter().map(f64::from).collect())
}
