//! `flashcore._flashcore`: the Rust API as the Python package sees it. This layer converts
//! arguments (addresses, shapes, strides, dtype names, streams) and errors
//! (`flashcore::Error` → Python exceptions), and nothing else: tensors are validated and
//! allocated by the Python side (`flashcore/interface.py`, `_ops.py`), kernels chosen and launched by the
//! `flashcore` crate.

use std::collections::HashMap;
use std::sync::Arc;

use flashcore::dispatch::HeadDimUse;
use flashcore::{
    AlibiSlopes, AttnParams, BlockTableView, BwdInputs, CallerStream, Context, DType, DeviceVec, Dropout, DropoutState, Error,
    ExternalStream, Fp8Descales, FwdInputs, FwdOutputs, GradsMut, KvLayout, Layout, LearnableSinks, LseView, LseViewMut, PackedQueries,
    PagedKv, ProblemShape, SeqLensView, SinkGradMut, TensorView, TensorViewMut, VarlenBatch, Window,
};
use pyo3::exceptions::{PyNotImplementedError, PyPermissionError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

mod native;

/// A tensor as the Python side describes it: data pointer, shape and strides (in elements,
/// four dims) and dtype name (`"f16"`, `"bf16"`, or `"e4m3"` for an FP8 forward's inputs).
type TensorArg = (u64, [usize; 4], [usize; 4], String);

/// The Python exception a FlashCore error becomes, on both paths (the native path's C entry
/// points pass it as a status code, `native.rs`): bad arguments are `ValueError` (`TypeError`
/// for dtypes), what FlashCore cannot do yet `NotImplementedError`, a kernel cache another
/// user could write `PermissionError` (the native operator raises it as `RuntimeError`: c10 has
/// no such exception), the environment (driver, NVRTC, compiler, file system) `RuntimeError`.
/// The discriminants are those status codes.
#[derive(Clone, Copy)]
pub(crate) enum ErrorKind {
    Type = 1,
    Value = 2,
    NotImplemented = 3,
    Runtime = 4,
    Permission = 5,
}

pub(crate) fn error_kind(e: &Error) -> ErrorKind {
    match e {
        Error::DType { .. } => ErrorKind::Type,
        Error::Shape { .. } | Error::Stride { .. } | Error::Alignment { .. } | Error::DeviceMismatch { .. } | Error::Param { .. } => {
            ErrorKind::Value
        }
        Error::HeadDim { .. } | Error::Unsupported { .. } => ErrorKind::NotImplemented,
        Error::UntrustedCache { .. } => ErrorKind::Permission,
        _ => ErrorKind::Runtime,
    }
}

/// The Python exception for a FlashCore error ([`error_kind`]), with the error's text.
fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match error_kind(&e) {
        ErrorKind::Type => PyTypeError::new_err(msg),
        ErrorKind::Value => PyValueError::new_err(msg),
        ErrorKind::NotImplemented => PyNotImplementedError::new_err(msg),
        ErrorKind::Runtime => PyRuntimeError::new_err(msg),
        ErrorKind::Permission => PyPermissionError::new_err(msg),
    }
}

fn dtype(name: &str, arg: &'static str) -> PyResult<DType> {
    DType::parse(name)
        .ok_or_else(|| PyTypeError::new_err(format!("dtype of `{arg}`: {name} is not supported (float16, bfloat16, float8_e4m3fn)")))
}

fn layout((_, shape, strides, name): &TensorArg, arg: &'static str) -> PyResult<Layout> {
    Ok(Layout { shape: *shape, strides: *strides, dtype: dtype(name, arg)? })
}

/// One context per device, made on first use and kept for the process: the device's primary
/// context (PyTorch's), the JIT cache and the loaded kernels.
fn context(device: usize) -> PyResult<Arc<Context>> {
    Context::shared(device).map_err(to_py)
}

/// Where a call runs, as the Python tuple `(device, stream, scratch, check)`: `stream` is
/// PyTorch's current stream of `device` (its raw handle); `scratch(nbytes)` returns the address
/// of at least `nbytes` of device memory the call may use (split-KV partials), is called at
/// most once, and what it returns must stay allocated until the call returns (work queued on
/// `stream` after that is ordered by the caller's allocator); with `check`, the batch's or the
/// cache's device values are first checked against the contract (this synchronises: a
/// debugging aid).
#[derive(FromPyObject)]
struct CallArg(usize, usize, Py<PyAny>, bool);

/// The forward's inputs (`flashcore::FwdInputs`), as the Python tuple `(q, k, v)`.
#[derive(FromPyObject)]
struct FwdInputsArg(TensorArg, TensorArg, TensorArg);

/// The forward's outputs (`flashcore::FwdOutputs`), as the Python tuple `(o, lse)`: `lse` the
/// f32 log-sum-exp as `(address, elements)`, or `None` where it is not wanted.
#[derive(FromPyObject)]
struct FwdOutputsArg(TensorArg, Option<(u64, usize)>);

/// The backward's inputs (`flashcore::BwdInputs`), as the Python tuple `(q, k, v, o, lse,
/// dout)`: the forward's inputs, its `o` and f32 `lse` (`(address, elements)`), and `o`'s
/// gradient.
#[derive(FromPyObject)]
struct BwdInputsArg(TensorArg, TensorArg, TensorArg, TensorArg, (u64, usize), TensorArg);

/// One gradient buffer of the backward: its address alone when it is laid out like its
/// input (`torch.empty_like` of a contiguous input: the same shape and strides), which spares
/// the per-call cost of a layout crossing the boundary; else a full tensor argument.
#[derive(FromPyObject)]
enum GradArg {
    LikeInput(u64),
    Tensor(TensorArg),
}

/// The backward's outputs (`flashcore::GradsMut`, written), as the Python tuple `(dq, dk,
/// dv)`.
#[derive(FromPyObject)]
struct GradsArg(GradArg, GradArg, GradArg);

/// A call's options (`flashcore::AttnParams`), as the Python tuple `(softmax_scale, causal,
/// window_left, window_right, softcap, num_splits, deterministic, attention_chunk)`:
/// `softmax_scale` `None` for `1/sqrt(D)`, `window_left`, `window_right` flash_attn's
/// `window_size` (-1 unbounded), `softcap` 0 for none, `num_splits` `None` for FlashCore's
/// choice, `deterministic` for the backward, `attention_chunk` 0 for none. The Rust API validates them. The Python side's record is `flashcore._ops.Options`
/// (its `arg()`).
#[derive(FromPyObject)]
struct OptionsArg(Option<f32>, bool, i32, i32, f32, Option<usize>, bool, usize);

/// `options` as the Rust API takes them.
fn params(options: OptionsArg) -> AttnParams {
    let OptionsArg(softmax_scale, causal, window_left, window_right, softcap, num_splits, deterministic, attention_chunk) = options;
    let window = Window::new(window_left, window_right);
    AttnParams { softmax_scale, causal, window, attention_chunk, softcap, num_splits, deterministic, ..AttnParams::default() }
}

/// A packed batch's arguments (flash_attn's varlen form; `flashcore::VarlenBatch`):
/// `cu_seqlens_q`, `cu_seqlens_k`, `seqused_k` as `(address, elements)` of int32 device
/// vectors, then `max_seqlen_q`, `max_seqlen_k`.
type VarlenArg = ((u64, usize), (u64, usize), Option<(u64, usize)>, usize, usize);

/// A KV cache's arguments (flash_attn's `flash_attn_with_kvcache`; `flashcore::PagedKv`):
/// `k_new`, `v_new` `[B, S_new, Hkv, D]` (appended first: the caches are written),
/// `cache_seqlens` `(address, B)` int32, `block_table` `(address, [B, max_pages], row
/// stride)` int32 (`None`: contiguous caches `[B, S_cache, Hkv, D]`), and packed queries
/// (`flashcore::PackedQueries`: `q` and `o` `[1, total_q, Hq, D]`) as `(cu_seqlens_q
/// (address, B + 1), max_seqlen_q)`, or `None` for dense ones.
type PagedArg =
    (Option<TensorArg>, Option<TensorArg>, Option<(u64, usize)>, Option<(u64, [usize; 2], usize)>, Option<((u64, usize), usize)>);

/// ALiBi's slopes (`flashcore::AlibiSlopes`), as `(address, elements)` of an f32 device
/// vector: `[Hq]` or `[B, Hq]` contiguous (packed, B is the sequences).
type AlibiArg = (u64, usize);

/// Dropout as the Python tuple `(p, state)`: `p` in (0, 1) and the address of its generator
/// state on the device (`flashcore::DropoutState`: the int64 pair `(seed, offset)` that the
/// kernels read there, which the Python side draws with PyTorch's generator; CUDA-graph safe).
type DropoutArg = (f32, u64);

/// The tensors a call's scores read besides q and k, as the Rust API takes them: ALiBi's
/// slopes, dropout's generator state, learnable sinks.
pub(crate) type ScoreTensorsArg = (Option<AlibiSlopes<'static>>, Option<DropoutState<'static>>, Option<LearnableSinks<'static>>);

/// `options` with `dropout`'s probability, as the Rust API takes them (the generator state
/// is on the device: [`dropout_state`]).
fn params_with(options: OptionsArg, dropout: Option<DropoutArg>) -> AttnParams {
    let dropout = dropout.map(|(p, _)| Dropout { p, seed: 0, offset: 0 });
    AttnParams { dropout, ..params(options) }
}

/// `dropout`'s generator state as the Rust API takes it.
///
/// # Safety
/// The pair is int64 CUDA memory of the call's device, alive across the call.
unsafe fn dropout_state(dropout: Option<DropoutArg>) -> Option<DropoutState<'static>> {
    // SAFETY: this function's contract.
    dropout.map(|(_, ptr)| unsafe { DropoutState::from_raw(ptr, 2) })
}

/// Learnable sinks (`flashcore::LearnableSinks`), or where their gradient goes
/// (`flashcore::SinkGradMut`), as `(address, elements)` of an f32 device vector `[Hq]`.
type SinksArg = (u64, usize);

/// FlashAttention-3's FP8 descales, `(q, k, v)`, each `(address, elements)` of an f32 device
/// vector `[B, Hkv]` or `None` (1).
type DescalesArg = (Option<SinksArg>, Option<SinksArg>, Option<SinksArg>);

/// `descales` as the Rust API takes them (none: every one 1).
///
/// # Safety
/// As [`alibi_slopes`], for each vector given.
unsafe fn descales(descales: Option<DescalesArg>) -> Fp8Descales<'static> {
    let (q, k, v) = descales.unwrap_or((None, None, None));
    // SAFETY: this function's contract.
    let vec = |d: Option<SinksArg>| d.map(|(ptr, len)| unsafe { DeviceVec::from_raw(ptr, len) });
    Fp8Descales { q: vec(q), k: vec(k), v: vec(v) }
}

/// `sinks` as the Rust API takes them.
///
/// # Safety
/// As [`alibi_slopes`].
unsafe fn learnable_sink(sinks: Option<SinksArg>) -> Option<LearnableSinks<'static>> {
    // SAFETY: this function's contract.
    sinks.map(|(ptr, len)| unsafe { LearnableSinks::from_raw(ptr, len) })
}

/// `alibi` as the Rust API takes it.
///
/// # Safety
/// The vector is f32 CUDA memory of the call's device of this length, alive across the call.
unsafe fn alibi_slopes(alibi: Option<AlibiArg>) -> Option<AlibiSlopes<'static>> {
    // SAFETY: this function's contract.
    alibi.map(|(ptr, len)| unsafe { AlibiSlopes::from_raw(ptr, len) })
}

/// `varlen` as the Rust API takes it.
///
/// # Safety
/// The vectors are int32 CUDA memory of the call's device of these lengths, alive across
/// the call (the Python side's contract).
unsafe fn varlen_batch((cu_q, cu_k, used, max_seqlen_q, max_seqlen_k): VarlenArg) -> VarlenBatch<'static> {
    // SAFETY: this function's contract.
    let seqlens = |(ptr, len): (u64, usize)| unsafe { SeqLensView::from_raw(ptr, len) };
    VarlenBatch { cu_seqlens_q: seqlens(cu_q), cu_seqlens_k: seqlens(cu_k), seqused_k: used.map(seqlens), max_seqlen_q, max_seqlen_k }
}

/// The keys of a forward call: dense, or `varlen`'s packed batch, or `paged`'s cache.
///
/// # Safety
/// As [`varlen_batch`], for every address either names, `k_new` and `v_new` with the
/// layouts they describe.
unsafe fn keys(device: usize, varlen: Option<VarlenArg>, paged: Option<PagedArg>) -> PyResult<KvLayout<'static>> {
    Ok(match (varlen, paged) {
        (None, None) => KvLayout::Dense,
        // SAFETY: this function's contract.
        (Some(batch), None) => KvLayout::Varlen(unsafe { varlen_batch(batch) }),
        (None, Some((k_new, v_new, cache_seqlens, block_table, queries))) => {
            let new = |t: Option<TensorArg>, name| -> PyResult<Option<TensorView<'static>>> {
                // SAFETY: this function's contract.
                t.map(|t| Ok(unsafe { TensorView::from_raw(t.0, layout(&t, name)?, device) })).transpose()
            };
            // SAFETY: this function's contract.
            KvLayout::Paged(unsafe {
                PagedKv {
                    block_table: block_table.map(|(ptr, [b, pages], stride)| BlockTableView::from_raw(ptr, b, pages, stride)),
                    cache_seqlens: cache_seqlens.map(|(ptr, len)| SeqLensView::from_raw(ptr, len)),
                    k_new: new(k_new, "k")?,
                    v_new: new(v_new, "v")?,
                    queries: queries
                        .map(|((ptr, len), max_seqlen_q)| PackedQueries { cu_seqlens_q: SeqLensView::from_raw(ptr, len), max_seqlen_q }),
                }
            })
        }
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err("a call is over a packed batch (`varlen`) or a KV cache (`paged`), not both"))
        }
    })
}

/// Attention forward on `call`'s stream ([`CallArg`]): `o = softmax(scale · q kᵀ [+ mask]) v`
/// into `outputs`' `o` and, when given, its `lse` ([`FwdOutputsArg`]), under `options`
/// ([`OptionsArg`]).
///
/// The keys: dense (`q`, `o` `[B, Sq, Hq, D]`, `k`, `v` `[B, Sk, Hkv, D]`, `lse [B, Hq, Sq]`);
/// with `varlen` ([`VarlenArg`]) a packed batch (`q`, `o` `[1, total_q, Hq, D]`, `k`, `v`
/// `[1, total_k, Hkv, D]`: the Python side's 3-D tensors with a leading 1; `lse [Hq,
/// total_q]`); with `paged` ([`PagedArg`]) a KV cache (`k`, `v` the caches: pools
/// `[num_pages, page_size, Hkv, D]` with a block table). `call`'s `check` checks the batch's
/// or the cache's device values first. With `alibi` ([`AlibiArg`]), ALiBi's slopes; with
/// `dropout` ([`DropoutArg`]), attention dropout, and `probs` the tensor `[B, Hq, rows, cols]`
/// its probabilities go to (`flashcore::FwdOutputs::probs`); with `sinks` ([`SinksArg`]),
/// learnable sinks; with `qv`, FlashAttention-3's `qv` (`flashcore::FwdInputs::with_qv`:
/// shaped like `o`); with `descales` ([`DescalesArg`]), FlashAttention-3's FP8 descales of e4m3
/// `q`, `k`, `v` (`flashcore::Fp8Descales`; `o` then bf16).
#[pyfunction]
#[pyo3(signature = (call, inputs, outputs, options, varlen=None, paged=None, alibi=None, dropout=None, probs=None, sinks=None, qv=None, descales=None))]
#[allow(clippy::too_many_arguments)] // the Python signature: one tuple per concern
fn attention_forward(
    py: Python<'_>,
    call: CallArg,
    inputs: FwdInputsArg,
    outputs: FwdOutputsArg,
    options: OptionsArg,
    varlen: Option<VarlenArg>,
    paged: Option<PagedArg>,
    alibi: Option<AlibiArg>,
    dropout: Option<DropoutArg>,
    probs: Option<TensorArg>,
    sinks: Option<SinksArg>,
    qv: Option<TensorArg>,
    descales: Option<DescalesArg>,
) -> PyResult<()> {
    let CallArg(device, stream, scratch, check) = call;
    let FwdInputsArg(q, k, v) = inputs;
    let FwdOutputsArg(o, lse) = outputs;
    let (k_name, v_name) = if paged.is_some() { ("k_cache", "v_cache") } else { ("k", "v") };
    let layouts = [layout(&q, "q")?, layout(&k, k_name)?, layout(&v, v_name)?, layout(&o, "o")?];
    let probs = probs.map(|t| Ok::<_, PyErr>((layout(&t, "probs")?, t))).transpose()?.map(|(l, t)| (t, l));
    let qv = qv.map(|t| Ok::<_, PyErr>((t.0, layout(&t, "qv")?))).transpose()?;
    // SAFETY: the Python side passes live CUDA tensors and int32 vectors of `device` with
    // these layouts and extents, keeps them alive across this call, and orders their reuse on
    // `stream` through PyTorch's caching allocator; `stream` is PyTorch's current stream of
    // `device`.
    let keys = unsafe { keys(device, varlen, paged)? };
    // SAFETY: as for `keys`.
    let alibi_slopes = unsafe { alibi_slopes(alibi) };
    // SAFETY: as for `keys`.
    let dropout_state = unsafe { dropout_state(dropout) };
    // SAFETY: as for `keys`.
    let learnable_sink = unsafe { learnable_sink(sinks) };
    // SAFETY: as for `keys`.
    let descales = unsafe { self::descales(descales) };
    let ctx = context(device)?;
    let params = params_with(options, dropout);
    let mut scratch_error: Option<PyErr> = None;
    let tensors = [(q.0, layouts[0]), (k.0, layouts[1]), (v.0, layouts[2]), (o.0, layouts[3])];
    let probs = probs.map(|(t, l)| (t.0, l));
    // Detached from the interpreter: the first call of a variant compiles it (seconds).
    let result = py.detach(|| {
        let mut scratch = scratch_fn(&scratch, &mut scratch_error);
        let caller = CallerStream { stream: ExternalStream::from_raw(stream), scratch: &mut scratch };
        // SAFETY: as for `keys` above.
        unsafe {
            let scores = (alibi_slopes, dropout_state, learnable_sink);
            forward_on(&ctx, device, caller, (tensors, qv, descales), lse, keys, scores, probs, &params, check)
        }
    });
    finish(result, scratch_error, to_py)
}

/// `q`, `k`, `v`, `o` of a forward: address and layout each.
type FwdTensors = [(u64, Layout); 4];

/// A forward on `caller`'s stream (PyTorch's current stream of `device`), the layer under
/// [`attention_forward`] and the native autograd path's (`native::native_forward`): `tensors`
/// are `q`, `k`, `v`, `o` (address and layout), FlashAttention-3's `qv` or `None` and its FP8
/// descales, `lse` the
/// f32 log-sum-exp `(address, elements)` or `None`, `scores` ALiBi's slopes, dropout's state
/// and learnable sinks, `probs` dropout's probabilities; `check` checks a
/// packed batch's or a cache's device values first.
///
/// # Safety
/// Every address is live CUDA memory of `device` with the layout or extent given, alive
/// across the call, its reuse ordered on `caller.stream` (PyTorch's current stream of the
/// device) by the caller's allocator; `keys` and `scores` hold the same.
#[allow(clippy::too_many_arguments)] // the Rust API's inputs, outputs and options, spelled out
pub(crate) unsafe fn forward_on(
    ctx: &Context,
    device: usize,
    caller: CallerStream,
    (tensors, qv, descales): (FwdTensors, Option<(u64, Layout)>, Fp8Descales<'static>),
    lse: Option<(u64, usize)>,
    keys: KvLayout,
    scores: ScoreTensorsArg,
    probs: Option<(u64, Layout)>,
    params: &AttnParams,
    check: bool,
) -> flashcore::Result<()> {
    let (alibi_slopes, dropout_state, learnable_sink) = scores;
    // SAFETY: this function's contract.
    unsafe {
        let view = |(ptr, layout): (u64, Layout)| TensorView::from_raw(ptr, layout, device);
        let inputs = FwdInputs {
            q: view(tensors[0]),
            k: view(tensors[1]),
            v: view(tensors[2]),
            kv: keys,
            alibi_slopes,
            dropout_state,
            learnable_sink,
            qv: qv.map(view),
            descales,
        };
        if check {
            ctx.check_values(&inputs)?;
        }
        let (o, o_layout) = tensors[3];
        let out = FwdOutputs {
            o: TensorViewMut::from_raw(o, o_layout, device),
            lse: lse.map(|(ptr, len)| LseViewMut::from_raw(ptr, len)),
            probs: probs.map(|(ptr, layout)| TensorViewMut::from_raw(ptr, layout, device)),
        };
        ctx.attention_on_stream(caller, &inputs, out, params)
    }
}

/// The backward pass on `call`'s stream ([`CallArg`]): `grads` ([`GradsArg`], written) from
/// `inputs` ([`BwdInputsArg`]: the forward's inputs, `o` and `lse`, and `dout`) under the
/// forward's `options` ([`OptionsArg`]). With `varlen`, a packed batch (all tensors with a
/// leading 1 as in `attention_forward`, `lse [Hq, total_q]`; `check` as there); `alibi` the
/// forward's slopes, `dropout` its dropout ([`DropoutArg`]); `sinks` the forward's learnable
/// sinks and `dsink` where their gradient goes (both [`SinksArg`], together or not at all).
#[pyfunction]
#[pyo3(signature = (call, inputs, grads, options, varlen=None, alibi=None, dropout=None, sinks=None, dsink=None))]
#[allow(clippy::too_many_arguments)] // the Python signature: one tuple per concern
fn attention_backward(
    py: Python<'_>,
    call: CallArg,
    inputs: BwdInputsArg,
    grads: GradsArg,
    options: OptionsArg,
    varlen: Option<VarlenArg>,
    alibi: Option<AlibiArg>,
    dropout: Option<DropoutArg>,
    sinks: Option<SinksArg>,
    dsink: Option<SinksArg>,
) -> PyResult<()> {
    let CallArg(device, stream, scratch, check) = call;
    let BwdInputsArg(q, k, v, o, lse, dout) = inputs;
    let GradsArg(dq, dk, dv) = grads;
    let names = ["q", "k", "v", "o", "dout"];
    let mut layouts = Vec::with_capacity(8);
    let mut addresses = Vec::with_capacity(8);
    for (t, name) in [&q, &k, &v, &o, &dout].into_iter().zip(names) {
        layouts.push(layout(t, name)?);
        addresses.push(t.0);
    }
    for (grad, (input, name)) in [dq, dk, dv].into_iter().zip([(0, "dq"), (1, "dk"), (2, "dv")]) {
        let (address, grad_layout) = match grad {
            GradArg::LikeInput(address) => (address, layouts[input]),
            GradArg::Tensor(t) => (t.0, layout(&t, name)?),
        };
        layouts.push(grad_layout);
        addresses.push(address);
    }
    let ctx = context(device)?;
    let params = params_with(options, dropout);
    // SAFETY: as in `attention_forward`.
    let batch = varlen.map(|b| unsafe { varlen_batch(b) });
    // SAFETY: as in `attention_forward`.
    let alibi_slopes = unsafe { alibi_slopes(alibi) };
    // SAFETY: as in `attention_forward`.
    let dropout_state = unsafe { dropout_state(dropout) };
    // SAFETY: as in `attention_forward`; `dsink` is written.
    let (learnable_sink, dsink) = unsafe { (learnable_sink(sinks), dsink.map(|(ptr, len)| SinkGradMut::from_raw(ptr, len))) };
    let mut scratch_error: Option<PyErr> = None;
    let tensors: [(u64, Layout); 8] = std::array::from_fn(|i| (addresses[i], layouts[i]));
    let result = py.detach(|| {
        let mut scratch = scratch_fn(&scratch, &mut scratch_error);
        let caller = CallerStream { stream: ExternalStream::from_raw(stream), scratch: &mut scratch };
        // SAFETY: as in `attention_forward`: live CUDA tensors of `device` with these layouts,
        // kept alive by the Python side across the call, on PyTorch's current stream.
        unsafe {
            backward_on(&ctx, device, caller, tensors, lse, batch, (alibi_slopes, dropout_state, learnable_sink), dsink, &params, check)
        }
    });
    finish(result, scratch_error, to_py)
}

/// A backward on `caller`'s stream, the layer under [`attention_backward`] and the native
/// autograd path's (`native::native_backward`): `tensors` are `q`, `k`, `v`, `o`, `dout`, then the
/// gradients `dq`, `dk`, `dv` (written), `lse` the forward's `(address, elements)`; `batch`
/// a packed batch, whose device values `check` checks first; `scores` as the forward's, and
/// `dsink` where the sinks' gradient goes (written).
///
/// # Safety
/// As [`forward_on`].
#[allow(clippy::too_many_arguments)] // the Rust API's inputs, gradients and options, spelled out
pub(crate) unsafe fn backward_on(
    ctx: &Context,
    device: usize,
    caller: CallerStream,
    tensors: [(u64, Layout); 8],
    lse: (u64, usize),
    batch: Option<VarlenBatch>,
    scores: ScoreTensorsArg,
    dsink: Option<SinkGradMut>,
    params: &AttnParams,
    check: bool,
) -> flashcore::Result<()> {
    let (alibi_slopes, dropout_state, learnable_sink) = scores;
    // SAFETY: this function's contract.
    unsafe {
        let view = |i: usize| TensorView::from_raw(tensors[i].0, tensors[i].1, device);
        let grad = |i: usize| TensorViewMut::from_raw(tensors[i].0, tensors[i].1, device);
        let kv = batch.map_or(KvLayout::Dense, KvLayout::Varlen);
        if let (Some(batch), true) = (batch, check) {
            ctx.check_values(&FwdInputs::varlen(view(0), view(1), view(2), batch))?;
        }
        let lse = LseView::from_raw(lse.0, lse.1);
        let inputs = BwdInputs {
            q: view(0),
            k: view(1),
            v: view(2),
            o: view(3),
            lse,
            dout: view(4),
            kv,
            alibi_slopes,
            dropout_state,
            learnable_sink,
        };
        let grads = GradsMut { dsink, ..GradsMut::new(grad(5), grad(6), grad(7)) };
        ctx.attention_backward_on_stream(caller, &inputs, grads, params)
    }
}

/// A call's result as Python sees it: the Python exception the scratch allocator raised, if
/// that is what failed the call, else the FlashCore error converted by `convert`.
fn finish(result: flashcore::Result<()>, scratch_error: Option<PyErr>, convert: fn(Error) -> PyErr) -> PyResult<()> {
    match (result, scratch_error) {
        (Err(_), Some(e)) => Err(e),
        (result, _) => result.map_err(convert),
    }
}

/// The scratch allocator as the Rust API takes it: calls the Python `scratch(nbytes)`; a
/// Python exception there is kept in `error` (and re-raised by the caller) as it is.
fn scratch_fn<'a>(scratch: &'a Py<PyAny>, error: &'a mut Option<PyErr>) -> impl FnMut(usize) -> flashcore::Result<u64> + 'a {
    move |bytes: usize| {
        Python::attach(|py| scratch.call1(py, (bytes,)).and_then(|r| r.extract::<u64>(py))).map_err(|e| {
            *error = Some(e);
            Error::Param { arg: "scratch", msg: format!("allocating {bytes} bytes of scratch memory failed") }
        })
    }
}

/// What would run for this problem on `device` under `options` ([`OptionsArg`]): the kernel
/// variant, its tile and grid (the dispatcher's own description). A window or softcap selects
/// other variants; `dropout` (p) the dropout forms; `probs` a call that writes dropout's
/// probabilities (`return_attn_probs`).
#[pyfunction]
#[pyo3(signature = (device, q_shape, k_shape, dtype_name, options, dropout=0.0, probs=false))]
fn plan(
    device: usize,
    q_shape: [usize; 4],
    k_shape: [usize; 4],
    dtype_name: &str,
    options: OptionsArg,
    dropout: f32,
    probs: bool,
) -> PyResult<String> {
    let [batch, seqlen_q, heads_q, head_dim] = q_shape;
    let [_, seqlen_k, heads_kv, _] = k_shape;
    let shape = ProblemShape { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v: head_dim };
    let params = params_with(options, (dropout > 0.0).then_some((dropout, 0)));
    let params = if probs { flashcore::dispatch::probs_params(&params).map_err(to_py)? } else { params };
    params.check_window_and_softcap().map_err(to_py)?;
    let ctx = context(device)?;
    let plan = ctx.plan(&shape, dtype(dtype_name, "q")?, &params).map_err(to_py)?;
    Ok(plan.describe())
}

/// The GPU `device` as FlashCore sees it and the NVRTC it compiles with: `gpu` (name, arch,
/// SMs), `nvrtc` (the library's path) and `nvrtc_version`, each `None` where there is none,
/// with the error's text in `gpu_error` / `nvrtc_error`. No GPU is an answer here, not an
/// exception, and NVRTC is looked for without one.
#[pyfunction]
fn device_info(py: Python<'_>, device: usize) -> HashMap<&'static str, Option<String>> {
    let ctx = context(device).map_err(|e| e.value(py).to_string());
    let nvrtc = match &ctx {
        Ok(ctx) => ctx.jit().nvrtc(),
        Err(_) => flashcore::jit::Nvrtc::load().map(Arc::new),
    };
    let gpu = ctx.map(|ctx| {
        let info = ctx.info();
        format!("{} ({}, {} SMs)", info.name, info.arch, info.sm_count)
    });
    HashMap::from([
        ("nvrtc", nvrtc.as_ref().ok().map(|n| n.path().display().to_string())),
        ("nvrtc_version", nvrtc.as_ref().ok().map(|n| format!("{}.{}", n.version().0, n.version().1))),
        ("nvrtc_error", nvrtc.err().map(|e| e.to_string())),
        ("gpu", gpu.as_ref().ok().cloned()),
        ("gpu_error", gpu.err()),
    ])
}

/// The kernels' disk cache directory (`flashcore::jit::DiskCache::default_dir`:
/// `$FLASHCORE_CACHE_DIR`, else the platform's cache directory's `flashcore`), where the
/// native path keeps its compiled library too.
#[pyfunction]
fn cache_dir() -> String {
    flashcore::jit::DiskCache::default_dir().to_string_lossy().into_owned()
}

/// The cache directory's folder `name`, created where missing (mode 0700), the cache and it
/// checked against the caches' trust rule (`flashcore::jit::trust`: the current user's alone):
/// where the native path keeps its library. `PermissionError` naming the directory, its owner
/// and mode where another user could write there.
#[pyfunction]
fn private_cache_dir(name: &str) -> PyResult<String> {
    let root = flashcore::jit::DiskCache::default_dir();
    let dir = root.join(name);
    for d in [&root, &dir] {
        flashcore::jit::trust::private_dir(d).map_err(to_py)?;
    }
    Ok(dir.to_string_lossy().into_owned())
}

/// Checks a file of the cache against the trust rule before it is loaded (the native
/// library): `PermissionError` naming it where it is not the current user's alone.
#[pyfunction]
fn check_cache_file(path: &str) -> PyResult<()> {
    flashcore::jit::trust::check_private(std::path::Path::new(path)).map_err(to_py)
}

/// The head dim a call of `head_dim` runs at on `device` (`flashcore::dispatch::run_head_dim`):
/// the size the Python side zero-pads q, k and v to, so that it restates no rule of the core's.
/// `call`: `"attention"`, `"dropout"` or `"paged_queries"` (`flashcore::dispatch::HeadDimUse`).
#[pyfunction]
fn run_head_dim(device: usize, head_dim: usize, call: &str) -> PyResult<usize> {
    let call = match call {
        "attention" => HeadDimUse::Attention,
        "dropout" => HeadDimUse::Dropout,
        "paged_queries" => HeadDimUse::PackedPagedQueries,
        other => return Err(PyValueError::new_err(format!("unknown call {other:?}: attention, dropout or paged_queries"))),
    };
    Ok(flashcore::dispatch::run_head_dim(context(device)?.info().arch, head_dim, call))
}

/// Whether the backward of a call with V's own head dim (dense or packed; with `dropout` or
/// not) runs with V, O and dO zero-padded to q's head dim on `device`
/// (`flashcore::dispatch::backward_pads_value_dim`): where the kernels have no backward form
/// of the pair.
#[pyfunction]
fn backward_pads_value_dim(device: usize, head_dim: usize, head_dim_v: usize, dropout: bool) -> PyResult<bool> {
    Ok(flashcore::dispatch::backward_pads_value_dim(context(device)?.info().arch, head_dim, head_dim_v, dropout))
}

/// The head dims [`run_head_dim`] returns as they are on every GPU
/// (`flashcore::dispatch::head_dims_run_as_they_are`): the Python side's fast path.
#[pyfunction]
fn head_dims_run_as_they_are() -> Vec<usize> {
    flashcore::dispatch::head_dims_run_as_they_are().to_vec()
}

/// `(abi_version, forward, backward)`: the addresses of the native autograd path's C entry
/// points (`native.rs`), which `flashcore/_native.py` hands to the operator library it
/// compiles.
#[pyfunction]
fn native_entry_points() -> (u64, u64, u64) {
    native::entry_points()
}

#[pymodule]
#[pyo3(name = "_flashcore")]
fn extension_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(attention_forward, m)?)?;
    m.add_function(wrap_pyfunction!(attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(native_entry_points, m)?)?;
    m.add_function(wrap_pyfunction!(cache_dir, m)?)?;
    m.add_function(wrap_pyfunction!(private_cache_dir, m)?)?;
    m.add_function(wrap_pyfunction!(check_cache_file, m)?)?;
    m.add_function(wrap_pyfunction!(run_head_dim, m)?)?;
    m.add_function(wrap_pyfunction!(head_dims_run_as_they_are, m)?)?;
    m.add_function(wrap_pyfunction!(backward_pads_value_dim, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
