//! Runs into NaN-poisoned buffers (what a kernel leaves unwritten stays NaN, which never
//! passes), and bitwise comparisons of two runs.

use anyhow::Result;
use cudarc::driver::CudaSlice;
use flashcore::{Context, DType, DeviceTensor, TensorViewMut};

/// A quiet NaN of `dtype`, as bits.
pub fn nan_bits(dtype: DType) -> u16 {
    match dtype {
        DType::F16 => 0x7e00,
        DType::BF16 => 0x7fc0,
        DType::E4M3 => 0x7f,
    }
}

/// `run(o, lse)` into a NaN-poisoned `o` of `shape` and `lse` of `lse_len` f32 values:
/// returns o's bits and lse (what a run leaves unwritten stays NaN, which never passes).
pub fn poisoned_run(
    ctx: &Context,
    shape: [usize; 4],
    dtype: DType,
    lse_len: usize,
    run: impl FnOnce(TensorViewMut, &mut CudaSlice<f32>) -> flashcore::Result<()>,
) -> Result<(Vec<u16>, Vec<f32>)> {
    let mut o = DeviceTensor::filled(ctx, nan_bits(dtype), shape, dtype)?;
    let mut lse = ctx.stream().clone_htod(&vec![f32::NAN; lse_len.max(1)])?;
    run(o.view_mut(), &mut lse)?;
    let mut lse = ctx.stream().clone_dtoh(&lse)?;
    lse.truncate(lse_len);
    Ok((o.to_bits(ctx)?, lse))
}

/// Whether two runs' (o bits, lse) are bitwise equal.
pub fn same_bits(a: &(Vec<u16>, Vec<f32>), b: &(Vec<u16>, Vec<f32>)) -> bool {
    a.0 == b.0 && a.1.len() == b.1.len() && a.1.iter().zip(&b.1).all(|(x, y)| x.to_bits() == y.to_bits())
}
