"""The GPU suite needs PyTorch with a CUDA GPU. Without them each GPU test is reported as
skipped with the reason (`pytest -rs` lists them), never passed quietly. `test_wheel.py`
needs neither and runs in CI (`pytest --noconftest python/tests/test_wheel.py`)."""

from __future__ import annotations

import pytest


def _why_no_gpu():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def pytest_collection_modifyitems(config, items):
    why = _why_no_gpu()
    if why is None:
        return
    for item in items:
        if item.fspath.basename != "test_wheel.py":
            item.add_marker(pytest.mark.skip(reason=f"GPU test not run: {why}"))
