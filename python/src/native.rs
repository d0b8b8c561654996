//! The C entry points of the native autograd path: `python/flashcore/native/attention.cpp`, a
//! PyTorch operator with its autograd rule in C++ that the package compiles on first use
//! (`flashcore/_native.py`), calls these with its tensors' addresses and layouts. They run the
//! same cores as the Python functions ([`forward_on`], [`backward_on`]), for dense and packed
//! batches (the layout is data: a [`NativeVarlen`] whose `packed` is 0 is a dense call).
//!
//! Why: a Python `torch.autograd.Function` costs ~10 µs of host time a call, and the
//! arguments' trip through Python objects a few more, on calls whose kernels take
//! microseconds (docs/python.md#speed); in C++ the node costs ~1 µs and the
//! tensors' layouts are read from the tensors themselves.
//!
//! The contract: plain C structs, a status code with the error's text, no unwinding across the
//! boundary. The structs here are its one source: `attention.cpp` declares them again for its
//! compiler (`kAbiVersion` there, [`ABI_VERSION`] here), and `python/tests/test_wheel.py`
//! (`test_native_abi_structs_agree_between_rust_and_cpp`) fails where the two differ.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use flashcore::{
    AlibiSlopes, AttnParams, CallerStream, DType, Error, ExternalStream, Fp8Descales, KvLayout, Layout, SeqLensView, VarlenBatch, Window,
};

use crate::{backward_on, error_kind, forward_on, ErrorKind};

/// The struct layouts' version: `attention.cpp` refuses entry points of another.
pub const ABI_VERSION: u64 = 5;

/// A tensor: address, shape and strides (elements, four dims), dtype (0 f16, 1 bf16).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NativeTensor {
    ptr: u64,
    shape: [i64; 4],
    strides: [i64; 4],
    dtype: i32,
}

/// The options every call takes (`flashcore::AttnParams`): flash_attn's window sides (-1
/// unbounded), softcap 0 for none, `num_splits` 0 for FlashCore's choice.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NativeOptions {
    softmax_scale: f32,
    causal: i32,
    window_left: i32,
    window_right: i32,
    attention_chunk: i32,
    softcap: f32,
    num_splits: i32,
    deterministic: i32,
}

/// A packed batch (flash_attn's varlen arguments, `flashcore::VarlenBatch`) when `packed` is
/// 1: int32 device vectors as address and elements (`seqused_k` 0 where absent; an empty
/// vector may have address 0, which the Rust library then refuses by name), the longest
/// sequence's lengths, and `check` (1: check the vectors' values first,
/// FLASHCORE_CHECK_VARLEN). All zero for a dense call; the tensors of a packed one are `[1,
/// total, H, D]`, its lse `[Hq, total_q]`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NativeVarlen {
    cu_seqlens_q: u64,
    cu_seqlens_q_len: u64,
    cu_seqlens_k: u64,
    cu_seqlens_k_len: u64,
    seqused_k: u64,
    seqused_k_len: u64,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    packed: i32,
    check: i32,
}

/// Scratch memory from the caller's allocator: `alloc(ctx, bytes)` returns an address usable
/// in stream order until the call returns, or 0 when the allocation failed (the caller keeps
/// its own error).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NativeScratch {
    alloc: unsafe extern "C" fn(*mut c_void, usize) -> u64,
    ctx: *mut c_void,
}

/// Where a call runs: device ordinal, PyTorch's current raw stream of it, scratch.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NativeCall {
    device: i32,
    stream: u64,
    scratch: NativeScratch,
}

/// A forward: `o` written, and `lse` (f32, `lse_len` values) when `lse` is not 0; ALiBi's f32
/// slopes when `alibi` is not 0; a packed batch when `varlen.packed` is 1.
#[repr(C)]
pub struct NativeForward {
    call: NativeCall,
    q: NativeTensor,
    k: NativeTensor,
    v: NativeTensor,
    o: NativeTensor,
    lse: u64,
    lse_len: u64,
    alibi: u64,
    alibi_len: u64,
    options: NativeOptions,
    varlen: NativeVarlen,
}

/// A backward: `dq`, `dk`, `dv` written from the forward's tensors and `dout`.
#[repr(C)]
pub struct NativeBackward {
    call: NativeCall,
    q: NativeTensor,
    k: NativeTensor,
    v: NativeTensor,
    o: NativeTensor,
    dout: NativeTensor,
    dq: NativeTensor,
    dk: NativeTensor,
    dv: NativeTensor,
    lse: u64,
    lse_len: u64,
    alibi: u64,
    alibi_len: u64,
    options: NativeOptions,
    varlen: NativeVarlen,
}

/// Success; an error's status is its [`ErrorKind`] (the Python exception `attention.cpp`
/// raises for it), a panic's `ErrorKind::Runtime`.
const OK: i32 = 0;

fn layout(t: &NativeTensor, arg: &'static str) -> flashcore::Result<Layout> {
    let dtype = match t.dtype {
        0 => DType::F16,
        1 => DType::BF16,
        other => return Err(Error::DType { arg, msg: format!("dtype code {other} (0 float16, 1 bfloat16)") }),
    };
    let dims = |xs: [i64; 4], what: &str| -> flashcore::Result<[usize; 4]> {
        let mut out = [0; 4];
        for (o, x) in out.iter_mut().zip(xs) {
            *o = usize::try_from(x).map_err(|_| Error::Param { arg, msg: format!("negative {what}: {xs:?}") })?;
        }
        Ok(out)
    };
    Ok(Layout { shape: dims(t.shape, "size")?, strides: dims(t.strides, "stride")?, dtype })
}

impl NativeOptions {
    /// The Rust API's parameters: these options, straight (the Rust API checks them).
    fn params(&self) -> AttnParams {
        AttnParams {
            softmax_scale: Some(self.softmax_scale),
            causal: self.causal != 0,
            window: Window::new(self.window_left, self.window_right),
            // A negative chunk reads as too long: the Rust API refuses it by name.
            attention_chunk: usize::try_from(self.attention_chunk).unwrap_or(usize::MAX),
            softcap: self.softcap,
            num_splits: (self.num_splits > 0).then_some(self.num_splits as usize),
            deterministic: self.deterministic != 0,
            ..AttnParams::default()
        }
    }
}

impl NativeVarlen {
    /// The Rust API's packed batch, None for a dense call; `Param` naming the length that is
    /// not one (a negative maximum).
    ///
    /// # Safety
    /// As [`forward_on`]: int32 CUDA memory of these lengths, alive across the call.
    unsafe fn batch(&self) -> flashcore::Result<Option<VarlenBatch<'static>>> {
        if self.packed == 0 {
            return Ok(None);
        }
        let length =
            |n: i64, arg: &'static str| usize::try_from(n).map_err(|_| Error::Param { arg, msg: format!("must be >= 0, got {n}") });
        // SAFETY: this function's contract.
        let seqlens = |ptr: u64, len: u64| unsafe { SeqLensView::from_raw(ptr, len as usize) };
        Ok(Some(VarlenBatch {
            cu_seqlens_q: seqlens(self.cu_seqlens_q, self.cu_seqlens_q_len),
            cu_seqlens_k: seqlens(self.cu_seqlens_k, self.cu_seqlens_k_len),
            seqused_k: (self.seqused_k != 0).then(|| seqlens(self.seqused_k, self.seqused_k_len)),
            max_seqlen_q: length(self.max_seqlen_q, "max_seqlen_q")?,
            max_seqlen_k: length(self.max_seqlen_k, "max_seqlen_k")?,
        }))
    }
}

/// `ptr`'s slopes as the Rust API takes them, None for 0.
///
/// # Safety
/// As [`forward_on`]: f32 CUDA memory of `len` values, alive across the call.
unsafe fn alibi(ptr: u64, len: u64) -> Option<AlibiSlopes<'static>> {
    // SAFETY: this function's contract.
    (ptr != 0).then(|| unsafe { AlibiSlopes::from_raw(ptr, len as usize) })
}

/// Runs `body`, turning an error (or a panic, which must not unwind into C++) into a status
/// code and the error's text, NUL-terminated and cut to fit `message[..capacity]`.
///
/// # Safety
/// `message` points at `capacity` writable bytes.
unsafe fn guarded(message: *mut c_char, capacity: usize, body: impl FnOnce() -> flashcore::Result<()>) -> i32 {
    let (code, text) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return OK,
        Ok(Err(e)) => (error_kind(&e) as i32, e.to_string()),
        Err(_) => (ErrorKind::Runtime as i32, "flashcore: internal error (a panic in the native entry point)".to_string()),
    };
    if capacity > 0 {
        let n = text.len().min(capacity - 1);
        // SAFETY: `n + 1 <= capacity` bytes of `message`, this function's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), message.cast::<u8>(), n);
            *message.add(n) = 0;
        }
    }
    code
}

/// The scratch allocator as the Rust API takes it.
///
/// # Safety
/// `s` is the caller's allocator, valid across the call (the entry points' contract).
unsafe fn scratch_fn(s: NativeScratch) -> impl FnMut(usize) -> flashcore::Result<u64> {
    // SAFETY: this function's contract: `alloc` takes its own `ctx` and any size.
    move |bytes| match unsafe { (s.alloc)(s.ctx, bytes) } {
        0 => Err(Error::Param { arg: "scratch", msg: format!("allocating {bytes} bytes of scratch memory failed") }),
        ptr => Ok(ptr),
    }
}

/// The device's shared context, as the Python entry points' (`crate::context`).
fn context_of(device: i32) -> flashcore::Result<std::sync::Arc<flashcore::Context>> {
    let ordinal = usize::try_from(device).map_err(|_| Error::Param { arg: "device", msg: format!("not a CUDA device: {device}") })?;
    flashcore::Context::shared(ordinal)
}

/// The forward (see [`NativeForward`]); a status code, the error's text in `message`.
///
/// # Safety
/// `args` points at a valid `NativeForward` whose addresses are live CUDA memory of its
/// device with the layouts given (as [`forward_on`]); `message` at `capacity` bytes.
unsafe extern "C" fn native_forward(args: *const NativeForward, message: *mut c_char, capacity: usize) -> i32 {
    // SAFETY: this function's contract.
    unsafe {
        guarded(message, capacity, || {
            let a = &*args;
            let tensors = [(a.q, "q"), (a.k, "k"), (a.v, "v"), (a.o, "o")];
            let mut resolved = [(0, Layout { shape: [0; 4], strides: [0; 4], dtype: DType::F16 }); 4];
            for (slot, (t, name)) in resolved.iter_mut().zip(tensors) {
                *slot = (t.ptr, layout(&t, name)?);
            }
            let ctx = context_of(a.call.device)?;
            let mut scratch = scratch_fn(a.call.scratch);
            let caller = CallerStream { stream: ExternalStream::from_raw(a.call.stream as usize), scratch: &mut scratch };
            let lse = (a.lse != 0).then_some((a.lse, a.lse_len as usize));
            let params = a.options.params();
            let keys = a.varlen.batch()?.map_or(KvLayout::Dense, KvLayout::Varlen);
            forward_on(
                &ctx,
                a.call.device as usize,
                caller,
                (resolved, None, Fp8Descales::default()),
                lse,
                keys,
                (alibi(a.alibi, a.alibi_len), None, None),
                None,
                &params,
                a.varlen.check != 0,
            )
        })
    }
}

/// The backward (see [`NativeBackward`]); a status code, the error's text in `message`.
///
/// # Safety
/// As [`native_forward`], for a valid `NativeBackward`.
unsafe extern "C" fn native_backward(args: *const NativeBackward, message: *mut c_char, capacity: usize) -> i32 {
    // SAFETY: this function's contract.
    unsafe {
        guarded(message, capacity, || {
            let a = &*args;
            let named = [(a.q, "q"), (a.k, "k"), (a.v, "v"), (a.o, "o"), (a.dout, "dout"), (a.dq, "dq"), (a.dk, "dk"), (a.dv, "dv")];
            let mut tensors = [(0, Layout { shape: [0; 4], strides: [0; 4], dtype: DType::F16 }); 8];
            for (slot, (t, name)) in tensors.iter_mut().zip(named) {
                *slot = (t.ptr, layout(&t, name)?);
            }
            let ctx = context_of(a.call.device)?;
            let params = a.options.params();
            let mut scratch = scratch_fn(a.call.scratch);
            let caller = CallerStream { stream: ExternalStream::from_raw(a.call.stream as usize), scratch: &mut scratch };
            backward_on(
                &ctx,
                a.call.device as usize,
                caller,
                tensors,
                (a.lse, a.lse_len as usize),
                a.varlen.batch()?,
                (alibi(a.alibi, a.alibi_len), None, None),
                None,
                &params,
                a.varlen.check != 0,
            )
        })
    }
}

/// `(ABI_VERSION, address of the forward entry, address of the backward entry)`, which the
/// Python side hands to the compiled operator library once (`flashcore/_native.py`).
pub fn entry_points() -> (u64, u64, u64) {
    let forward: unsafe extern "C" fn(*const NativeForward, *mut c_char, usize) -> i32 = native_forward;
    let backward: unsafe extern "C" fn(*const NativeBackward, *mut c_char, usize) -> i32 = native_backward;
    (ABI_VERSION, forward as usize as u64, backward as usize as u64)
}
