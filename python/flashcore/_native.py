"""The native autograd path: `native/attention.cpp`, a PyTorch operator whose autograd rule is
a C++ node over the extension's C entry points, compiled here on first use with the host's
C++ compiler against the installed torch and cached beside the kernels.

Why: eager calls through a Python `torch.autograd.Function` cost ~10 µs of host time more
than the same call's C++ node, and crossing into the extension through Python objects a
few more (docs/python.md#speed). torch's C++ ABI changes between versions, so no wheel can
carry a built library: it is built for the torch it runs with (~15-20 s, once per torch
version and source; later processes load it in milliseconds).

`FLASHCORE_NATIVE`: `0` never (the Python path), `1` always (an error where it cannot be
built), unset: where it can be built. Eager calls without dropout over dense and packed
batches take it (`flashcore_native::attention`, `::varlen_attention`); KV caches, dropout,
torch.compile and functorch transforms keep the Python path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from . import _flashcore

SOURCE = Path(__file__).with_name("native") / "attention.cpp"
_lock = threading.Lock()
_attention: Optional[Callable] = None
_varlen_attention: Optional[Callable] = None
_library: Optional[Path] = None
_reason: Optional[str] = None  # why the native path is not in use, once tried
_tried = False


def _mode() -> str:
    value = os.environ.get("FLASHCORE_NATIVE", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"FLASHCORE_NATIVE must be 0, 1 or unset, got {value!r}")
    return value


def _cache_dir() -> Path:
    """The `native` folder of the kernels' disk cache, created private where missing; the
    cache and it must be the current user's alone (the core's trust rule: PermissionError
    naming the directory where another user could write there, and nothing is loaded)."""
    return Path(_flashcore.private_cache_dir("native"))


def _compiler() -> Optional[str]:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def library_path() -> Path:
    """Where the library for this torch and this source lives: its name is a digest of both
    (and of the C++ ABI torch was built with), so a new torch or a new FlashCore builds anew."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(f"{torch.__version__}|{torch._C._GLIBCXX_USE_CXX11_ABI}|{platform.machine()}".encode())
    return _cache_dir() / f"attention-{key.hexdigest()[:20]}.so"


def _build(target: Path, compiler: str) -> None:
    """Compiles SOURCE into `target` (a temporary file renamed into place: processes that
    build at once each finish with a whole library)."""
    torch_dir = Path(torch.__file__).parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".partial")
    os.close(fd)
    command = [
        compiler, "-O2", "-std=c++20", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", str(SOURCE), "-o", partial,
        f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _load() -> Tuple[Callable, Callable]:
    compiler = _compiler()
    target = library_path()
    if not target.exists():
        if compiler is None:
            raise RuntimeError("no C++ compiler found ($CXX, c++, g++ or clang++) to build it")
        _build(target, compiler)
    _flashcore.check_cache_file(str(target))  # a library another user could have written is not loaded
    torch.ops.load_library(str(target))
    torch.ops.flashcore_native.connect(*_flashcore.native_entry_points())
    global _library
    _library = target
    # The C++ callables themselves: an overload's Python wrapper frame costs ~0.5 µs a call.
    dense, packed = torch.ops.flashcore_native.attention.default, torch.ops.flashcore_native.varlen_attention.default
    return getattr(dense, "_op", dense), getattr(packed, "_op", packed)


def attention() -> Optional[Callable]:
    """The operator `flashcore_native::attention` (dense batches) as a callable, built and
    loaded on the first call; None where the native path is off or cannot be built (`status()`
    says why)."""
    if _tried:
        return _attention
    return _first_use()


def varlen_attention() -> Optional[Callable]:
    """The operator `flashcore_native::varlen_attention` (packed batches), as `attention()`:
    the two are built, loaded and switched off together."""
    if not _tried:
        _first_use()
    return _varlen_attention


def _first_use() -> Optional[Callable]:
    global _attention, _varlen_attention, _reason, _tried
    with _lock:
        if _tried:
            return _attention
        mode = _mode()
        if mode == "0":
            _reason = "FLASHCORE_NATIVE=0"
        else:
            try:
                _attention, _varlen_attention = _load()
            except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, with its reason
                _reason = f"{type(e).__name__}: {e}"
                if mode == "1":  # an error on every call, not once and then the Python path
                    raise RuntimeError(f"flashcore: FLASHCORE_NATIVE=1 but the native autograd path is unavailable: {_reason}") from e
                if _compiler() is not None:  # a compiler that failed is worth a word; none at all is the quiet default
                    warnings.warn(f"flashcore: the native autograd path could not be built, calls take the Python path: {_reason}", stacklevel=3)
        _tried = True
        return _attention


def status() -> Dict[str, Optional[str]]:
    """Which path eager calls without dropout take: `{"path": "native" or "python", "library": the
    built library or None, "reason": why not native, or None}`. Builds the library first if
    no call has yet."""
    attention()
    return {"path": "native" if _attention is not None else "python", "library": str(_library) if _library else None, "reason": _reason}


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Calls made in the block take the Python path (`bench/python_overhead.py` and the tests
    compare the two paths in one process). Not thread-safe: it swaps a module global."""
    global _attention, _varlen_attention
    saved = attention(), varlen_attention()
    _attention = _varlen_attention = None
    try:
        yield
    finally:
        _attention, _varlen_attention = saved
