"""`device_info`: what FlashCore finds on this machine (the GPU, NVRTC), reported without
raising when there is no GPU. torch is imported only to find the current device, so
`device_info(0)` runs where torch has no CUDA (and in the wheel's tests, which have no torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Union

from . import _flashcore

if TYPE_CHECKING:
    import torch


def device_info(device: Union[int, torch.device, None] = None) -> Dict[str, Optional[str]]:
    """The GPU as FlashCore sees it and the NVRTC it compiles with, as a dict:

    - `gpu`: name, arch and SM count (`"NVIDIA H100 80GB HBM3 (sm_90a, 132 SMs)"`), or
      None with the reason in `gpu_error` (`"no usable GPU: ..."`);
    - `nvrtc`: the path of the libnvrtc in use, with `nvrtc_version` (`"13.0"`), or None
      with the reason in `nvrtc_error`: every place searched and how to install it.

    `device` is a CUDA device index or `torch.device`; default: the current CUDA device, or
    0 where torch sees none. A missing GPU or NVRTC is reported, never raised.
    """
    info = _flashcore.device_info(_index(device))
    return {key: info[key] for key in ("gpu", "gpu_error", "nvrtc", "nvrtc_version", "nvrtc_error")}


def _index(device: Union[int, torch.device, None]) -> int:
    if isinstance(device, int):
        return device
    if device is not None and device.index is not None:
        return device.index
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else 0
