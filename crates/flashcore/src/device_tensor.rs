//! [`DeviceTensor`]: a contiguous BSHD tensor FlashCore allocates, uploads and downloads on
//! a [`Context`]'s stream (tests, the CLI and fresh outputs; callers with their own memory pass
//! views).

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::context::Context;
use crate::error::{DriverContext, Error, Result};
use crate::tensor::{DType, Layout, TensorView, TensorViewMut};

/// A contiguous BSHD tensor in device memory, owned by FlashCore.
#[derive(Debug)]
pub struct DeviceTensor {
    buf: CudaSlice<u16>,
    layout: Layout,
    device: usize,
}

impl DeviceTensor {
    /// Uploads `data` (row-major BSHD, rounded to `dtype`).
    pub fn from_f32(ctx: &Context, data: &[f32], shape: [usize; 4], dtype: DType) -> Result<Self> {
        let layout = Layout::contiguous(shape, dtype);
        if data.len() != layout.span() {
            return Err(Error::Shape { arg: "data", msg: format!("{} values for shape {shape:?}", data.len()) });
        }
        let bits: Vec<u16> = data.iter().map(|&x| dtype.encode(x)).collect();
        Self::from_bits(ctx, &bits, shape, dtype)
    }

    /// Uploads raw 16-bit patterns of `dtype`.
    pub fn from_bits(ctx: &Context, bits: &[u16], shape: [usize; 4], dtype: DType) -> Result<Self> {
        let layout = Layout::contiguous(shape, dtype);
        if bits.len() != layout.span() {
            return Err(Error::Shape { arg: "data", msg: format!("{} values for shape {shape:?}", bits.len()) });
        }
        // An empty tensor (no sequences or no rows: a call with nothing to compute) still gets
        // one element of memory: CUDA allocates no zero-byte buffers, and a view needs an address.
        let buf = if bits.is_empty() { ctx.stream().alloc_zeros(1) } else { ctx.stream().clone_htod(bits) };
        Ok(Self { buf: buf.ctx("uploading a tensor")?, layout, device: ctx.ordinal() })
    }

    /// A tensor whose every element has the bit pattern `bits` (NaN poisoning, say).
    pub fn filled(ctx: &Context, bits: u16, shape: [usize; 4], dtype: DType) -> Result<Self> {
        let n = Layout::contiguous(shape, dtype).span();
        Self::from_bits(ctx, &vec![bits; n], shape, dtype)
    }

    /// Sets every element to the bit pattern `bits`.
    pub fn fill(&mut self, ctx: &Context, bits: u16) -> Result<()> {
        let host = vec![bits; self.buf.len()];
        ctx.stream().memcpy_htod(&host, &mut self.buf).ctx("filling a tensor")
    }

    /// Downloads the raw 16-bit patterns.
    pub fn to_bits(&self, ctx: &Context) -> Result<Vec<u16>> {
        let mut bits = ctx.stream().clone_dtoh(&self.buf).ctx("downloading a tensor")?;
        bits.truncate(self.layout.span());
        Ok(bits)
    }

    /// Downloads and widens to `f32`.
    pub fn to_f32(&self, ctx: &Context) -> Result<Vec<f32>> {
        let dtype = self.layout.dtype;
        Ok(self.to_bits(ctx)?.into_iter().map(|b| dtype.decode(b)).collect())
    }

    /// The tensor's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// A read-only view.
    pub fn view(&self) -> TensorView<'_> {
        let (ptr, _sync) = self.buf.device_ptr(self.buf.stream());
        TensorView { ptr, layout: self.layout, device: self.device, _borrow: PhantomData }
    }

    /// A writable view.
    pub fn view_mut(&mut self) -> TensorViewMut<'_> {
        let stream = self.buf.stream().clone();
        let (ptr, _sync) = self.buf.device_ptr_mut(&stream);
        TensorViewMut { ptr, layout: self.layout, device: self.device, _borrow: PhantomData }
    }
}
