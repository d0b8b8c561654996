"""FlashCore: fused attention kernels for NVIDIA GPUs, compiled on first use by NVRTC.

    import flashcore
    out = flashcore.flash_attn_func(q, k, v, causal=True)        # flash_attn 2.x semantics
    out = flashcore.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # packed
    out = flashcore.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table)  # serving
    table, lens = flashcore.block_table_from_indptr(kv_indptr, kv_indices, kv_last_page_len, page_size)  # FlashInfer's pages
    out = flashcore.scaled_dot_product_attention(q, k, v, is_causal=True)   # SDPA's
    attn = flashcore.integrations.transformers.register()         # attn_implementation=attn
    from flashcore.flash_attn_interface import _flash_attn_forward   # flash_attn's low-level API
    import flashcore.compat; flashcore.compat.use_as_flash_attn()    # `import flash_attn` gives FlashCore's

Eager calls go to the extension directly (through a `torch.autograd.Function` when autograd
records); under torch.compile the functions are `torch.library` ops
(`torch.ops.flashcore.fwd`) with fake implementations, so `torch.compile(fullgraph=True)`
traces them. CUDA graphs capture either path. Kernels run on PyTorch's current stream; the first call of each kernel variant
compiles it (seconds), later calls and later processes load it from the disk cache
(`$FLASHCORE_CACHE_DIR`, else `~/.cache/flashcore`).
"""

import importlib.util as _importlib_util

from ._nvrtc import use_torch_nvrtc as _use_torch_nvrtc

_use_torch_nvrtc()

from ._device import device_info  # noqa: E402
from ._flashcore import __version__  # noqa: E402

# What works without PyTorch: `device_info()` and `__version__` (what a user checks first on
# a new machine). Everything else takes torch tensors; without torch, `import flashcore`
# still succeeds and each such name raises one ImportError that says so.
_NEEDS_TORCH = (
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "block_table_from_indptr",
    "scaled_dot_product_attention",
    "kernel_plan",
    "explain",
    "integrations",
)

if _importlib_util.find_spec("torch") is not None:
    from . import integrations  # noqa: E402
    from .interface import explain, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, kernel_plan, scaled_dot_product_attention  # noqa: E402
    from .paging import block_table_from_indptr  # noqa: E402
else:

    def __getattr__(name: str) -> object:
        if name in _NEEDS_TORCH:
            raise ImportError(f"flashcore.{name} needs PyTorch, which is not installed (pip install 'torch>=2.4'); without it only flashcore.device_info() and __version__ work")
        raise AttributeError(f"module 'flashcore' has no attribute {name!r}")


__all__ = [*_NEEDS_TORCH, "device_info", "__version__"]
