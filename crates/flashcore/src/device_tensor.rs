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
    /// The elements' bytes, little-endian (an element of `layout.dtype.size_bytes()` bytes).
    buf: CudaSlice<u8>,
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

    /// Uploads raw bit patterns of `dtype` (e4m3: each in its pattern's low byte).
    pub fn from_bits(ctx: &Context, bits: &[u16], shape: [usize; 4], dtype: DType) -> Result<Self> {
        let layout = Layout::contiguous(shape, dtype);
        if bits.len() != layout.span() {
            return Err(Error::Shape { arg: "data", msg: format!("{} values for shape {shape:?}", bits.len()) });
        }
        let bytes: Vec<u8> = match dtype.size_bytes() {
            1 => bits.iter().map(|&b| b as u8).collect(),
            _ => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
        };
        // An empty tensor (no sequences or no rows: a call with nothing to compute) still gets
        // one element of memory: CUDA allocates no zero-byte buffers, and a view needs an address.
        let buf = if bytes.is_empty() { ctx.stream().alloc_zeros(2) } else { ctx.stream().clone_htod(&bytes) };
        Ok(Self { buf: buf.ctx("uploading a tensor")?, layout, device: ctx.ordinal() })
    }

    /// A tensor whose every element has the bit pattern `bits` (NaN poisoning, say).
    pub fn filled(ctx: &Context, bits: u16, shape: [usize; 4], dtype: DType) -> Result<Self> {
        let n = Layout::contiguous(shape, dtype).span();
        Self::from_bits(ctx, &vec![bits; n], shape, dtype)
    }

    /// Sets every element to the bit pattern `bits` (e4m3: its low byte).
    pub fn fill(&mut self, ctx: &Context, bits: u16) -> Result<()> {
        let host: Vec<u8> = match self.layout.dtype.size_bytes() {
            1 => vec![bits as u8; self.buf.len()],
            _ => std::iter::repeat_n(bits.to_le_bytes(), self.buf.len() / 2).flatten().collect(),
        };
        ctx.stream().memcpy_htod(&host, &mut self.buf).ctx("filling a tensor")
    }

    /// Downloads the raw bit patterns (e4m3: each in a pattern's low byte).
    pub fn to_bits(&self, ctx: &Context) -> Result<Vec<u16>> {
        let bytes = ctx.stream().clone_dtoh(&self.buf).ctx("downloading a tensor")?;
        let mut bits: Vec<u16> = match self.layout.dtype.size_bytes() {
            1 => bytes.into_iter().map(u16::from).collect(),
            _ => bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect(),
        };
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
