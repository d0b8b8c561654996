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

from ._nvrtc import use_torch_nvrtc as _use_torch_nvrtc

_use_torch_nvrtc()

from . import integrations  # noqa: E402
from ._device import device_info  # noqa: E402
from ._flashcore import __version__  # noqa: E402
from .interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, kernel_plan, scaled_dot_product_attention  # noqa: E402
from .paging import block_table_from_indptr  # noqa: E402

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "block_table_from_indptr",
    "scaled_dot_product_attention",
    "kernel_plan",
    "device_info",
    "integrations",
    "__version__",
]
