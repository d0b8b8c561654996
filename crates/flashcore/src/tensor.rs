//! The borrowed views the API takes: [`TensorView`] and [`TensorViewMut`] (pointer, shape,
//! strides in elements, dtype, device), and the log-sum-exp's [`LseView`] and [`LseViewMut`].
//! The owning [`DeviceTensor`](crate::DeviceTensor) is `device_tensor`'s.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// Element type of attention inputs and outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// FP8 e4m3 (`float8_e4m3fn`: no infinities, ±448 at most), the forward's inputs alone
    /// (fwd_sm90, Hopper): `q`, `k` and `v` in e4m3 with their descales
    /// ([`crate::Fp8Descales`]), the output bf16.
    E4M3,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::E4M3 => 1,
        }
    }

    /// The output's dtype for inputs of this one: e4m3's is bf16 (as FlashAttention-3's), the
    /// others' their own.
    pub const fn output(self) -> DType {
        match self {
            DType::E4M3 => DType::BF16,
            other => other,
        }
    }

    /// The dtype named `name` (`f16`, `bf16`, `e4m3`), as [`DType::name`] gives it.
    pub fn parse(name: &str) -> Option<DType> {
        [DType::F16, DType::BF16, DType::E4M3].into_iter().find(|d| d.name() == name)
    }

    /// The short name used in kernel names and reports (`f16`, `bf16`, `e4m3`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::E4M3 => "e4m3",
        }
    }

    /// Rounds an `f32` to this dtype's bit pattern (to nearest, ties to even; e4m3 saturates at
    /// ±448, its pattern in the low byte).
    pub fn encode(self, x: f32) -> u16 {
        match self {
            DType::F16 => half::f16::from_f32(x).to_bits(),
            DType::BF16 => half::bf16::from_f32(x).to_bits(),
            DType::E4M3 => u16::from(e4m3::encode(x)),
        }
    }

    /// Widens a bit pattern of this dtype to `f32` (e4m3: the low byte).
    pub fn decode(self, bits: u16) -> f32 {
        match self {
            DType::F16 => half::f16::from_bits(bits).to_f32(),
            DType::BF16 => half::bf16::from_bits(bits).to_f32(),
            DType::E4M3 => e4m3::decode(bits as u8),
        }
    }
}

/// FP8 e4m3 (`float8_e4m3fn`): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no
/// infinities, `S.1111.111` NaN, ±448 the largest finite, 2⁻⁹ the smallest subnormal.
mod e4m3 {
    const NAN: u8 = 0x7f;
    const MAX: u8 = 0x7e; // 448

    /// `x` rounded to nearest (ties to even), saturated to ±448; NaN stays NaN. Integer work
    /// on f32's bits (the CLI encodes hundreds of millions of values a benchmark row).
    pub fn encode(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        if a.is_nan() {
            return sign | NAN;
        }
        if a >= 448.0 {
            return sign | MAX;
        }
        if a < 2f32.powi(-6) {
            // Subnormals (and the smallest normal, code 8): multiples of 2⁻⁹.
            return sign | (a * 512.0).round_ties_even() as u8;
        }
        let bits = a.to_bits();
        let mut exp = (bits >> 23) as i32 - 127; // -6 ..= 8
                                                 // f32's 23 mantissa bits to 3, to nearest, ties to even.
        let (mut mant, rest) = ((bits >> 20) & 7, bits & 0xf_ffff);
        if rest > 0x8_0000 || (rest == 0x8_0000 && mant & 1 == 1) {
            mant += 1;
        }
        if mant == 8 {
            mant = 0;
            exp += 1;
        }
        if exp > 8 || (exp == 8 && mant == 7) {
            return sign | MAX;
        }
        sign | (((exp + 7) as u8) << 3) | mant as u8
    }

    /// The value of an e4m3 pattern.
    pub fn decode(bits: u8) -> f32 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let (exp, mant) = (i32::from((bits >> 3) & 0xf), f32::from(bits & 7));
        if exp == 15 && mant == 7.0 {
            return f32::NAN;
        }
        let magnitude = if exp == 0 { mant / 8.0 * 2f32.powi(-6) } else { (1.0 + mant / 8.0) * 2f32.powi(exp - 7) };
        sign * magnitude
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_pattern_round_trips_and_rounding_is_to_nearest() {
            for bits in 0..=255u8 {
                let x = decode(bits);
                if x.is_nan() {
                    assert_eq!(bits & 0x7f, NAN);
                    continue;
                }
                // -0 and 0 both encode to their own patterns.
                assert_eq!(encode(x), bits, "pattern {bits:#04x} = {x}");
            }
            assert_eq!(decode(MAX), 448.0);
            assert_eq!(decode(1), 2f32.powi(-9));
            assert_eq!(encode(1e6), MAX);
            assert_eq!(encode(-500.0), 0x80 | MAX);
            // Halfway between 1 and 1.125 goes to the even mantissa (1); just above, up.
            assert_eq!(decode(encode(1.0625)), 1.0);
            assert_eq!(decode(encode(1.0626)), 1.125);
            assert_eq!(decode(encode(2f32.powi(-10))), 0.0, "half the smallest subnormal: to even (0)");
            assert!(decode(encode(f32::NAN)).is_nan());
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Shape `[B, S, H, D]`, strides in elements, dtype and device of a 4-D tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `[B, S, H, D]`.
    pub shape: [usize; 4],
    /// Element strides of the four dims; `strides[3]` must be 1.
    pub strides: [usize; 4],
    /// Element type.
    pub dtype: DType,
}

impl Layout {
    /// A contiguous BSHD layout.
    pub fn contiguous(shape: [usize; 4], dtype: DType) -> Self {
        let [_, s, h, d] = shape;
        Self { shape, strides: [s * h * d, h * d, d, 1], dtype }
    }

    /// Elements covered from the first to one past the last element.
    pub fn span(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        1 + (0..4).map(|i| (self.shape[i] - 1) * self.strides[i]).sum::<usize>()
    }
}

/// A borrowed, read-only device tensor.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub(crate) ptr: u64,
    pub(crate) layout: Layout,
    pub(crate) device: usize,
    pub(crate) _borrow: PhantomData<&'a ()>,
}

/// A borrowed, writable device tensor.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    pub(crate) ptr: u64,
    pub(crate) layout: Layout,
    pub(crate) device: usize,
    pub(crate) _borrow: PhantomData<&'a mut ()>,
}

impl<'a> TensorView<'a> {
    /// A view over memory FlashCore does not own (a PyTorch tensor, say).
    ///
    /// # Safety
    /// `ptr` must point to device memory on `device` holding at least `layout.span()`
    /// elements, valid and not written by others while the view is used.
    pub unsafe fn from_raw(ptr: u64, layout: Layout, device: usize) -> Self {
        Self { ptr, layout, device, _borrow: PhantomData }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Rows `start..start + len` of the sequence dim, `None` if out of range.
    pub fn narrow_seq(&self, start: usize, len: usize) -> Option<TensorView<'a>> {
        if start.checked_add(len)? > self.layout.shape[1] {
            return None;
        }
        let mut layout = self.layout;
        layout.shape[1] = len;
        let ptr = self.ptr + (start * layout.strides[1] * layout.dtype.size_bytes()) as u64;
        Some(TensorView { ptr, layout, device: self.device, _borrow: PhantomData })
    }

    /// The device address of element `[0, 0, 0, 0]`.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device ordinal.
    pub fn device(&self) -> usize {
        self.device
    }

    pub(crate) fn with_layout(&self, layout: Layout) -> TensorView<'a> {
        TensorView { layout, ..*self }
    }
}

impl TensorViewMut<'_> {
    /// A writable view over memory FlashCore does not own.
    ///
    /// # Safety
    /// As [`TensorView::from_raw`], and nothing else may read or write the memory while
    /// the view is used.
    pub unsafe fn from_raw(ptr: u64, layout: Layout, device: usize) -> Self {
        Self { ptr, layout, device, _borrow: PhantomData }
    }

    /// The view's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn as_view(&self) -> TensorView<'_> {
        TensorView { ptr: self.ptr, layout: self.layout, device: self.device, _borrow: PhantomData }
    }
}

impl Layout {
    /// A one-query-row layout `[B, 1, Hq, D]` seen as `[B, Hq / heads_kv, heads_kv, D]`:
    /// the query heads that share a KV head become that head's query rows (GQA packing for
    /// decode). Query head `h` is row `h % (Hq / heads_kv)` of head `h / (Hq / heads_kv)`,
    /// which is where the kernels' head mapping `kv = h / (Hq / Hkv)` put it. A packed
    /// batch `[1, total_q, Hq, D]` becomes `[1, Hq / heads_kv, heads_kv, D]` alike, each
    /// token's (the kernel adds the token's offset by the original token stride).
    pub(crate) fn gqa_packed(&self, heads_kv: usize) -> Layout {
        let [b, s, h, d] = self.shape;
        // One token a batch entry, or a packed batch's tokens (whose stride the kernel takes
        // apart: FwdParams::q_stride_token).
        debug_assert!((s == 1 || b == 1) && h % heads_kv == 0);
        let group = h / heads_kv;
        let [sb, _, sh, sd] = self.strides;
        Layout { shape: [b, group, heads_kv, d], strides: [sb, sh, group * sh, sd], dtype: self.dtype }
    }
}

/// A borrowed 1-D vector of `T` on the device (read by the kernels): the log-sum-exp the
/// backward reads ([`LseView`]), `cu_seqlens` and `seqused_k` ([`SeqLensView`](crate::SeqLensView)).
#[derive(Debug, Clone, Copy)]
pub struct DeviceVec<'a, T> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _borrow: PhantomData<&'a T>,
}

impl<'a, T> DeviceVec<'a, T> {
    /// A view of `slice`.
    pub fn of(slice: &'a CudaSlice<T>) -> Self {
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        Self { ptr, len: slice.len(), _borrow: PhantomData }
    }

    /// A view of caller-owned memory.
    ///
    /// # Safety
    /// `ptr` is device memory of `len` values of `T` that outlives the view's use.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        Self { ptr, len, _borrow: PhantomData }
    }

    /// Its length in values of `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A borrowed 1-D vector of `T` on the device that the kernels write: the forward's
/// log-sum-exp ([`LseViewMut`]).
#[derive(Debug)]
pub struct DeviceVecMut<'a, T> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _borrow: PhantomData<&'a mut T>,
}

impl<'a, T> DeviceVecMut<'a, T> {
    /// A writable view of `slice`.
    pub fn of(slice: &'a mut CudaSlice<T>) -> Self {
        let stream = slice.stream().clone();
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(&stream);
        Self { ptr, len, _borrow: PhantomData }
    }

    /// A writable view of caller-owned memory.
    ///
    /// # Safety
    /// `ptr` is device memory of `len` values of `T` that outlives the view's use and that
    /// nothing else reads or writes meanwhile.
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        Self { ptr, len, _borrow: PhantomData }
    }

    /// Its length in values of `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A borrowed log-sum-exp buffer on the device: `[B, Hq, Sq]` f32, contiguous (packed:
/// `[Hq, total_q]`), as the forward writes it (the backward reads it). A view of
/// [`AttnOutput::lse`](crate::AttnOutput) with [`DeviceVec::of`].
pub type LseView<'a> = DeviceVec<'a, f32>;

/// A writable log-sum-exp buffer on the device: `[B, Hq, Sq]` f32, contiguous (packed:
/// `[Hq, total_q]`), where the forward writes it.
pub type LseViewMut<'a> = DeviceVecMut<'a, f32>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Element offset of `[b, s, h, d]` under `layout`.
    fn offset(layout: &Layout, index: [usize; 4]) -> usize {
        (0..4).map(|i| index[i] * layout.strides[i]).sum()
    }

    #[test]
    fn gqa_packing_makes_each_kv_heads_query_heads_its_rows() {
        // Contiguous and PyTorch-BHSD-style strides alike.
        let contiguous = Layout::contiguous([3, 1, 8, 64], DType::BF16);
        let bhsd = Layout { shape: [3, 1, 8, 64], strides: [8 * 100 * 64, 64, 100 * 64, 1], dtype: DType::F16 };
        for layout in [contiguous, bhsd] {
            let packed = layout.gqa_packed(2);
            assert_eq!(packed.shape, [3, 4, 2, 64]);
            for b in 0..3 {
                for h in 0..8 {
                    for d in [0, 63] {
                        // Query head h reads KV head h / 4 (the kernels' mapping): row h % 4 of it.
                        assert_eq!(offset(&layout, [b, 0, h, d]), offset(&packed, [b, h % 4, h / 4, d]), "b{b} h{h}");
                    }
                }
            }
            assert_eq!(packed.span(), layout.span());
        }
    }

    #[test]
    fn gqa_packing_of_a_packed_batch_leaves_the_token_to_the_token_stride() {
        // q [1, total_q, Hq, D] of 5 tokens, contiguous and token-strided (a view of a wider
        // buffer); the kernel adds cu_seqlens_q[b] * token stride, then row r * strides[1]
        // and KV head h * strides[2] of the packed layout (fwd_sm80's row_offset).
        let contiguous = Layout::contiguous([1, 5, 8, 64], DType::BF16);
        let wide = Layout { shape: [1, 5, 8, 64], strides: [5 * 1024, 1024, 64, 1], dtype: DType::BF16 };
        for layout in [contiguous, wide] {
            let token_stride = layout.strides[1];
            let packed = layout.gqa_packed(2);
            assert_eq!(packed.shape, [1, 4, 2, 64]);
            for token in 0..5 {
                for h in 0..8 {
                    let kernel = token * token_stride + offset(&packed, [0, h % 4, h / 4, 7]);
                    assert_eq!(offset(&layout, [0, token, h, 7]), kernel, "token {token} head {h}");
                }
            }
        }
    }
}
