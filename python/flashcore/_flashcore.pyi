"""The extension module: the Rust API as the Python layer calls it (see src/lib.rs)."""

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

# (data pointer, shape [4], strides in elements [4], dtype name "f16" | "bf16" | "e4m3" (an FP8 forward's inputs))
TensorArg = Tuple[int, Sequence[int], Sequence[int], str]

# (address, elements) of an int32 device vector
Vector = Tuple[int, int]
# A packed batch: cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k
VarlenArg = Tuple[Vector, Vector, Optional[Vector], int, int]
# A KV cache: k_new, v_new [B, S_new, Hkv, D] (appended first: the caches are written),
# cache_seqlens [B], block_table (address, (B, max_pages), row stride) of int32 (None:
# contiguous caches [B, S_cache, Hkv, D])
PagedArg = Tuple[Optional[TensorArg], Optional[TensorArg], Optional[Vector], Optional[Tuple[int, Tuple[int, int], int]]]
# ALiBi's slopes: (address, elements) of an f32 device vector, [Hq] (every sequence's) or
# [B, Hq] (one row a sequence; packed, B is the sequences), contiguous
AlibiArg = Tuple[int, int]
# Attention dropout: (p in (0, 1), address of its generator state on the device: the int64
# pair (seed, offset) the kernels read there; flashcore::DropoutState)
DropoutArg = Tuple[float, int]

# Where a call runs: device, stream (PyTorch's current stream of device, raw handle),
# scratch(nbytes) -> device address of at least nbytes that stays allocated until the call
# returns, check (first check a packed batch's or a KV cache's device values; synchronises)
CallArg = Tuple[int, int, Callable[[int], int], bool]
# The forward's inputs: q, k, v
FwdInputsArg = Tuple[TensorArg, TensorArg, TensorArg]
# The forward's outputs (written): o, lse (f32; None: not wanted)
FwdOutputsArg = Tuple[TensorArg, Optional[Vector]]
# The backward's inputs: q, k, v, the forward's o and lse (f32), dout
BwdInputsArg = Tuple[TensorArg, TensorArg, TensorArg, TensorArg, Vector, TensorArg]
# The backward's outputs (written): dq, dk, dv, each a TensorArg or, when laid out like its
# input (same shape and strides), its address alone
GradArg = Union[int, TensorArg]
GradsArg = Tuple[GradArg, GradArg, GradArg]
# Every call's options: softmax_scale (None: 1/sqrt(D)), causal, window_left, window_right
# (flash_attn's window_size, -1 unbounded), softcap (0: none), num_splits (None: FlashCore's
# choice), deterministic (the backward's), attention_chunk (0: none): `flashcore._ops.Options.arg()`
OptionsArg = Tuple[Optional[float], bool, int, int, float, Optional[int], bool, int]

def attention_forward(
    call: CallArg,
    inputs: FwdInputsArg,
    outputs: FwdOutputsArg,
    options: OptionsArg,
    varlen: Optional[VarlenArg] = None,
    paged: Optional[PagedArg] = None,
    alibi: Optional[AlibiArg] = None,
    dropout: Optional[DropoutArg] = None,
    probs: Optional[TensorArg] = None,
    sinks: Optional[Tuple[int, int]] = None,
    qv: Optional[TensorArg] = None,
    descales: Optional[Tuple[Optional[Tuple[int, int]], Optional[Tuple[int, int]], Optional[Tuple[int, int]]]] = None,
) -> None:
    """Attention forward on the call's stream into `outputs`' o and lse ((address, elements),
    f32 [B, Hq, Sq]). With `varlen`, a packed batch: q, o [1, total_q, Hq, D], k, v [1,
    total_k, Hkv, D], lse [Hq, total_q]. With `paged`, a KV cache (flashcore::PagedKv): k, v
    are the caches, pools [num_pages, page_size, Hkv, D] with a block table. With `alibi`,
    ALiBi's slopes (flashcore::AlibiSlopes; a count that is neither Hq nor B·Hq raises
    ValueError naming `alibi_slopes`). With `dropout`, attention dropout, and `probs` where
    its probabilities go, negated where dropped ([B, Hq, rows, cols], q's dtype; None: not
    stored). With `qv`, FlashAttention-3's qv (shaped like o, q's dtype; dense keys, the pairs
    fwd_sm90 has qv forms for). With e4m3 q, k, v ("e4m3"), o is bf16 and `descales` may give
    FlashAttention-3's q, k, v descales, each (address, elements) of an f32 [B, Hkv] vector or
    None (1) (flashcore::Fp8Descales; dense keys, fwd_sm90). The call's `check` first checks the
    batch's or the cache's device values (synchronises). Raises ValueError / TypeError / NotImplementedError
    / RuntimeError with the Rust error's text."""

def attention_backward(
    call: CallArg,
    inputs: BwdInputsArg,
    grads: GradsArg,
    options: OptionsArg,
    varlen: Optional[VarlenArg] = None,
    alibi: Optional[AlibiArg] = None,
    dropout: Optional[DropoutArg] = None,
    sinks: Optional[Tuple[int, int]] = None,
    dsink: Optional[Tuple[int, int]] = None,
) -> None:
    """Gradients dq, dk, dv (written) of attention under the forward's options, from its
    inputs, o and lse (f32 [B, Hq, Sq]) given dout. With `varlen`, a packed batch (tensors with
    a leading 1 and lse [Hq, total_q], as in attention_forward; the call's `check` as there);
    `alibi` the forward's slopes, `dropout` the forward's dropout (the same state); `sinks` the
    forward's learnable sinks and `dsink` where their gradient goes ((address, elements) of
    f32 [Hq] each)."""

def plan(device: int, q_shape: Sequence[int], k_shape: Sequence[int], dtype_name: str, options: OptionsArg, dropout: float = 0.0, probs: bool = False) -> str:
    """The kernel variant, tile and grid FlashCore would run for this problem under `options`
    (with `dropout` p, its dropout forms; with `probs`, for a call writing dropout's
    probabilities)."""

def device_info(device: int) -> Dict[str, Optional[str]]:
    """`gpu` (name, arch, SMs), `nvrtc` (path), `nvrtc_version`, each None where there is
    none, with the reason in `gpu_error` / `nvrtc_error`. Never raises for a missing GPU."""

def native_entry_points() -> Tuple[int, int, int]:
    """`(abi_version, forward, backward)`: the addresses of the native autograd path's C entry
    points, which `flashcore._native` hands to the operator library it compiles."""

def run_head_dim(device: int, head_dim: int, call: str) -> int:
    """The head dim a call of `head_dim` runs at on `device` (its own, or the size q, k, v
    are zero-padded to); `call` is "attention", "dropout" or "paged_queries" (else ValueError)."""

def head_dims_run_as_they_are() -> List[int]:
    """The head dims `run_head_dim` returns unchanged for every call on every GPU."""

def backward_pads_value_dim(device: int, head_dim: int, head_dim_v: int, dropout: bool) -> bool:
    """Whether the backward of a call with V's own head dim (dense or packed; with `dropout` or
    not) runs with V, O and dO zero-padded to q's head dim on `device` (no kernel has a
    backward form of the pair)."""

def cache_dir() -> str:
    """The kernels' disk cache directory: `$FLASHCORE_CACHE_DIR`, else the platform's cache
    directory's `flashcore` (`~/.cache/flashcore` on Linux); the native path's library lives
    in its `native` folder."""

def private_cache_dir(name: str) -> str:
    """The cache directory's folder `name`, created where missing (mode 0700); the cache and
    it must be the current user's alone, else PermissionError naming the directory."""

def check_cache_file(path: str) -> None:
    """PermissionError naming `path` unless the current user owns it and no one else can write it."""
