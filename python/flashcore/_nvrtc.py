"""Points FlashCore at the NVRTC that PyTorch's CUDA wheels bring (nvidia-cuda-nvrtc),
so that `pip install flashcore-attn` next to torch needs nothing else. An explicit
`FLASHCORE_NVRTC` wins; without the wheels, the Rust library searches the CUDA toolkit
and the loader path itself (`flashcore info` lists where)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

# Newest first: the CUDA 13 wheels keep every library in nvidia/cu13/lib.
_CANDIDATES = ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cu12/lib/libnvrtc.so.12")


def torch_nvrtc() -> Optional[Path]:
    """The libnvrtc of the nvidia-* wheels on `sys.path`, if any."""
    for entry in sys.path:
        for rel in _CANDIDATES:
            path = Path(entry) / rel
            if path.is_file():
                return path
    return None


def use_torch_nvrtc() -> None:
    if "FLASHCORE_NVRTC" in os.environ:
        return
    path = torch_nvrtc()
    if path is not None:
        os.environ["FLASHCORE_NVRTC"] = str(path)
