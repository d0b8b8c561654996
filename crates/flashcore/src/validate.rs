//! Checks of the attention arguments, each failure an [`Error`] naming the argument.

use crate::error::{Error, Result};
use crate::params::ProblemShape;
use crate::tensor::{DType, TensorView};

/// Kernel grids put heads in `gridDim.y` and batch in `gridDim.z`, which stop at 65535.
const MAX_GRID_YZ: usize = 65535;

/// Validates `q`, `k`, `v` and the output `o` on `device`; returns the problem's shape.
pub(crate) fn problem(q: &TensorView, k: &TensorView, v: &TensorView, o: &TensorView, device: usize) -> Result<ProblemShape> {
    for (arg, t) in [("q", q), ("k", k), ("v", v), ("o", o)] {
        tensor(arg, t, device)?;
    }
    let [b, sq, hq, d] = q.layout.shape;
    let [kb, sk, hkv, kd] = k.layout.shape;
    if kb != b {
        return Err(shape_err("k", format!("batch {kb} differs from q's batch {b}")));
    }
    if kd != d {
        return Err(shape_err("k", format!("head dim {kd} differs from q's head dim {d}")));
    }
    if v.layout.shape != k.layout.shape {
        return Err(shape_err("v", format!("{:?} differs from k's {:?}", v.layout.shape, k.layout.shape)));
    }
    if o.layout.shape != q.layout.shape {
        return Err(shape_err("o", format!("{:?} differs from q's {:?}", o.layout.shape, q.layout.shape)));
    }
    if hq % hkv != 0 {
        return Err(shape_err("k", format!("q heads ({hq}) are not a multiple of k/v heads ({hkv})")));
    }
    if b > MAX_GRID_YZ || hq > MAX_GRID_YZ {
        return Err(shape_err("q", format!("batch {b} and heads {hq} must each be at most {MAX_GRID_YZ}")));
    }
    if sq > i32::MAX as usize || sk > i32::MAX as usize {
        return Err(shape_err("q", "sequence lengths must be below 2^31".into()));
    }
    let dtype = q.layout.dtype;
    for (arg, t) in [("k", k), ("v", v), ("o", o)] {
        if t.layout.dtype != dtype {
            return Err(Error::DType { arg, msg: format!("{} differs from q's {dtype}", t.layout.dtype) });
        }
    }
    Ok(ProblemShape { batch: b, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d })
}

/// Validates the log-sum-exp buffer's length against the problem.
pub(crate) fn lse(len: usize, shape: &ProblemShape) -> Result<()> {
    let want = shape.batch * shape.heads_q * shape.seqlen_q;
    if len != want {
        return Err(shape_err("lse", format!("{len} elements, need B*Hq*Sq = {want}")));
    }
    Ok(())
}

fn tensor(arg: &'static str, t: &TensorView, device: usize) -> Result<()> {
    if t.device != device {
        return Err(Error::DeviceMismatch { arg, tensor_device: t.device, context_device: device });
    }
    if t.layout.shape.contains(&0) {
        return Err(shape_err(arg, format!("{:?} is empty", t.layout.shape)));
    }
    if !matches!(t.layout.dtype, DType::F16 | DType::BF16) {
        return Err(Error::DType { arg, msg: format!("{} is not supported", t.layout.dtype) });
    }
    if t.layout.strides[3] != 1 {
        return Err(Error::Stride { arg, msg: format!("last dim must be contiguous (stride 1), got {:?}", t.layout.strides) });
    }
    // Kernels move 16 bytes (8 elements) at a time along each row.
    if let Some(i) = (0..3).find(|&i| t.layout.strides[i] % 8 != 0 && t.layout.shape[i] > 1) {
        return Err(Error::Stride { arg, msg: format!("stride of dim {i} is {}, must be a multiple of 8 elements (16 bytes)", t.layout.strides[i]) });
    }
    if t.layout.shape[3] % 8 != 0 {
        return Err(shape_err(arg, format!("head dim {} must be a multiple of 8", t.layout.shape[3])));
    }
    if t.ptr % 16 != 0 {
        return Err(Error::Alignment { arg, ptr: t.ptr });
    }
    Ok(())
}

fn shape_err(arg: &'static str, msg: String) -> Error {
    Error::Shape { arg, msg }
}
