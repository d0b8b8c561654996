//! What `attn` reads and writes, and its moves to and from the GPU.

use anyhow::{bail, Result};
use flashcore::{Context, DType, DeviceTensor};

use crate::io::HostTensor;

/// `t`'s shape as `[B, S, H, D]`; the error names it `name`.
pub(crate) fn shape4(t: &HostTensor, name: &str) -> Result<[usize; 4]> {
    match t.shape[..] {
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => bail!("`{name}` must be rank 4 [B, S, H, D], got {:?}", t.shape),
    }
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
