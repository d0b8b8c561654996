"""The extension module: the Rust API as the Python layer calls it (see src/lib.rs)."""

from typing import Callable, Optional, Sequence, Tuple

__version__: str

# (data pointer, shape [4], strides in elements [4], dtype name "f16" | "bf16")
TensorArg = Tuple[int, Sequence[int], Sequence[int], str]

def attention_forward(
    device: int,
    stream: int,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    o: TensorArg,
    lse: Optional[Tuple[int, int]],
    scratch: Callable[[int], int],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
) -> None:
    """Attention forward on `stream` of `device` into `o` and `lse` ((address, elements), f32
    [B, Hq, Sq]). `scratch(nbytes)` returns a device address of at least nbytes that stays
    allocated until the call returns. `window_left`, `window_right`: flash_attn's window_size
    (-1 unbounded); `softcap`: 0 for none. Raises ValueError / TypeError /
    NotImplementedError / RuntimeError with the Rust error's text."""

def attention_varlen_forward(
    device: int,
    stream: int,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    o: TensorArg,
    lse: Optional[Tuple[int, int]],
    scratch: Callable[[int], int],
    cu_seqlens_q: Tuple[int, int],
    cu_seqlens_k: Tuple[int, int],
    seqused_k: Optional[Tuple[int, int]],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    check: bool = False,
) -> None:
    """Attention forward over a packed batch: q, o [1, total_q, Hq, D], k, v [1, total_k, Hkv, D],
    the int32 vectors as (address, elements), lse [Hq, total_q]. `check` first checks the
    vectors' device values (synchronises). Otherwise as attention_forward."""

def attention_kvcache_forward(
    device: int,
    stream: int,
    q: TensorArg,
    k_cache: TensorArg,
    v_cache: TensorArg,
    o: TensorArg,
    lse: Optional[Tuple[int, int]],
    scratch: Callable[[int], int],
    k_new: Optional[TensorArg],
    v_new: Optional[TensorArg],
    cache_seqlens: Optional[Tuple[int, int]],
    block_table: Optional[Tuple[int, Tuple[int, int], int]],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
    check: bool = False,
) -> None:
    """Attention forward over a KV cache (flashcore::PagedKv): q, o [B, Sq, Hq, D]; k_cache,
    v_cache pools [num_pages, page_size, Hkv, D] with block_table (address, (B, max_pages),
    row stride) of int32, else contiguous [B, S_cache, Hkv, D]; cache_seqlens (address, B)
    int32; k_new, v_new [B, S_new, Hkv, D] appended to the caches first (written in place).
    `check` first checks the table and lengths' device values (synchronises)."""

def attention_backward(
    device: int,
    stream: int,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    o: TensorArg,
    lse: Tuple[int, int],
    dout: TensorArg,
    dq: TensorArg,
    dk: TensorArg,
    dv: TensorArg,
    scratch: Callable[[int], int],
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> str:
    """Gradients dq, dk, dv (written) of attention with the forward's o and lse (f32
    [B, Hq, Sq]) given dout; scratch as for attention_forward. Returns the kernel variant
    that ran (bwd_sm90_... on Hopper for head dims 64, 96, 128 and 256, else bwd_sm80_...).
    A window or softcap raises NotImplementedError (the backward does not have them yet)."""

def attention_varlen_backward(
    device: int,
    stream: int,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    o: TensorArg,
    lse: Tuple[int, int],
    dout: TensorArg,
    dq: TensorArg,
    dk: TensorArg,
    dv: TensorArg,
    scratch: Callable[[int], int],
    cu_seqlens_q: Tuple[int, int],
    cu_seqlens_k: Tuple[int, int],
    seqused_k: Optional[Tuple[int, int]],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    check: bool = False,
) -> None:
    """Gradients dq, dk, dv (written) of attention over a packed batch, with the forward's o
    and lse (f32 [Hq, total_q]) given dout: tensors with a leading 1 and the batch's vectors
    and maxima as in attention_varlen_forward; scratch and check likewise."""

def plan(
    device: int,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    dtype_name: str,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    num_splits: Optional[int] = None,
) -> str:
    """The kernel variant, tile and grid FlashCore would run for this problem."""

def device_info(device: int) -> str:
    """Device name, arch, SM count and the NVRTC library in use."""
