"""The native autograd path (`flashcore/_native.py`, `native/attention.cpp`): built on this
machine, the path dense and packed eager calls take, and bitwise the Python path's results (outputs,
lse, gradients in deterministic mode), so the f64 checks of the other files, which run
through whichever path is in use, hold for both. Also: PyTorch's current stream, errors as
the Python path raises them, CUDA-graph capture, inference mode, no keys, and
`FLASHCORE_NATIVE`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from flashcore import _native  # noqa: E402
from helpers import randn  # noqa: E402

HAS_COMPILER = _native._compiler() is not None


@pytest.fixture(scope="module")
def native():
    if not HAS_COMPILER:
        pytest.skip("no C++ compiler on this machine: the native path cannot be built (the Python path runs)")
    op = _native.attention()
    assert op is not None, _native.status()
    return op


# (B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, alibi): odd lengths, GQA and MQA, each score mod.
CASES = [
    (2, 257, 257, 8, 2, 128, True, (-1, -1), 0.0, False),
    (1, 100, 333, 4, 4, 64, False, (32, 7), 0.0, False),
    (1, 200, 200, 6, 3, 96, True, (-1, -1), 30.0, False),
    (2, 64, 129, 4, 1, 256, False, (-1, -1), 0.0, True),
    (1, 1, 77, 8, 8, 64, True, (16, 0), 0.0, False),
]


def assert_both_paths_agree(call, inputs, args):
    """`call(*inputs, **args)` with `return_attn_probs` on the native path and on the Python
    path, and the gradients of each for one `dout`: asserts outputs, lse and gradients bitwise
    equal and free of NaN. Returns both outputs."""
    mine = [t.clone().requires_grad_() for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    o, lse, _ = call(*mine, return_attn_probs=True, **args)
    with _native.python_path():
        o_py, lse_py, _ = call(*theirs, return_attn_probs=True, **args)
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)
    assert not o.isnan().any()
    do = randn(*o.shape, seed=4)
    for name, g, g_py in zip("qkv", torch.autograd.grad(o, mine, do), torch.autograd.grad(o_py, theirs, do)):
        assert torch.equal(g, g_py), f"d{name} differs from the Python path's"
        assert not g.isnan().any(), f"d{name} has NaN"
    return o, o_py, lse


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_Sq{}_Sk{}_H{}-{}_D{}_causal{}_w{}_cap{}_alibi{}".format(*c))
def test_native_equals_the_python_path_bitwise(native, case):
    b, sq, sk, hq, hkv, d, causal, window, softcap, alibi = case
    q, k, v = randn(b, sq, hq, d, seed=1), randn(b, sk, hkv, d, seed=2), randn(b, sk, hkv, d, seed=3)
    slopes = torch.rand(hq, device="cuda") if alibi else None
    args = dict(softmax_scale=d**-0.5, causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes, deterministic=True)
    o, o_py, _ = assert_both_paths_agree(flashcore.flash_attn_func, (q, k, v), args)
    assert type(o.grad_fn).__name__ != type(o_py.grad_fn).__name__, (o.grad_fn, o_py.grad_fn)  # two paths, not one twice
    assert torch.equal(flashcore.flash_attn_func(q, k, v, **args), o)  # without grad too


# Packed batches: (query lengths, key lengths, Hq, Hkv, D, causal, window, softcap, alibi, seqused_k):
# odd lengths, a sequence without keys, GQA, every score mod, keys past seqused_k.
PACKED = [
    ((129, 1, 77), (129, 300, 77), 8, 2, 128, True, (-1, -1), 0.0, False, False),
    ((50, 33), (0, 65), 4, 4, 64, False, (16, 3), 0.0, True, False),
    ((17, 200), (40, 200), 6, 3, 96, True, (-1, -1), 20.0, False, True),
    ((64, 64), (64, 64), 4, 1, 36, False, (-1, -1), 0.0, False, False),  # a head dim the kernels lack: padded
]


def cu_seqlens(lengths) -> "torch.Tensor":
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("case", PACKED, ids=lambda c: "q{}_k{}_H{}-{}_D{}_causal{}_w{}_cap{}_alibi{}_used{}".format(*c))
def test_native_packed_batches_equal_the_python_path_bitwise(native, case):
    lens_q, lens_k, hq, hkv, d, causal, window, softcap, alibi, used = case
    assert _native.varlen_attention() is not None
    room = 5 if used else 0  # keys past each sequence's seqused_k: never read, zero gradients
    q = randn(sum(lens_q), hq, d, seed=1)
    k, v = randn(sum(lens_k) + room * len(lens_k), hkv, d, seed=2), randn(sum(lens_k) + room * len(lens_k), hkv, d, seed=3)
    batch = dict(
        cu_seqlens_q=cu_seqlens(lens_q), cu_seqlens_k=cu_seqlens([n + room for n in lens_k]),
        max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k) + room,
        seqused_k=torch.tensor(lens_k, dtype=torch.int32, device="cuda") if used else None,
    )  # fmt: skip
    slopes = torch.rand(len(lens_q), hq, device="cuda") if alibi else None
    args = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes, deterministic=True, **batch)
    o, o_py, lse = assert_both_paths_agree(flashcore.flash_attn_varlen_func, (q, k, v), args)
    assert o.shape == q.shape and lse.shape == (hq, q.shape[0])
    if d % 8 == 0:  # a padded call's node is the pad's; unpadded, the two paths' nodes differ
        assert type(o.grad_fn).__name__ != type(o_py.grad_fn).__name__, (o.grad_fn, o_py.grad_fn)
    assert torch.equal(flashcore.flash_attn_varlen_func(q, k, v, **args), o)  # without grad too
    with torch.inference_mode():
        assert torch.equal(flashcore.flash_attn_varlen_func(q, k, v, **args), o)


def test_native_packed_errors_are_the_python_paths(native):
    q, k = randn(32, 4, 64), randn(32, 4, 64)
    cu = cu_seqlens([16, 16])
    with pytest.raises(ValueError, match=r"parameter `window`: \(-5, 0\): each side must be -1"):
        flashcore.flash_attn_varlen_func(q, k, k, cu, cu, 16, 16, window_size=(-5, 0))
    short = torch.tensor([0, 16], dtype=torch.int32, device="cuda")
    empty = torch.zeros(0, dtype=torch.int32, device="cuda")  # its address may be 0: still a packed call
    for vectors in ((short, cu), (empty, empty)):
        with _native.python_path(), pytest.raises(ValueError) as python_error:
            flashcore.flash_attn_varlen_func(q, k, k, *vectors, 16, 16)
        with pytest.raises(ValueError) as native_error:
            flashcore.flash_attn_varlen_func(q, k, k, *vectors, 16, 16)
        assert str(native_error.value) == str(python_error.value) and "cu_seqlens" in str(native_error.value)


def test_native_packed_batch_checks_its_vectors_with_flashcore_check_varlen(native, monkeypatch):
    q, k = randn(32, 4, 64), randn(32, 4, 64)
    falling = torch.tensor([0, 20, 16], dtype=torch.int32, device="cuda")
    monkeypatch.setenv("FLASHCORE_CHECK_VARLEN", "1")
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flashcore.flash_attn_varlen_func(q, k, k, falling, cu_seqlens([16, 16]), 20, 16)


def test_native_launches_on_the_current_stream(native):
    q = randn(1, 8, 2, 64)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.ops.flashcore_native.stream_of(q) == side.cuda_stream
    assert torch.ops.flashcore_native.stream_of(q) == torch.cuda.current_stream().cuda_stream


def test_native_errors_are_the_python_paths(native):
    q, k = randn(1, 16, 4, 64), randn(1, 16, 4, 64)
    with pytest.raises(ValueError, match=r"parameter `window`: \(-5, 0\): each side must be -1"):
        flashcore.flash_attn_func(q, k, k, window_size=(-5, 0))
    with pytest.raises(ValueError, match=r"shape of `k`: head dim 32 differs from q's head dim 64"):
        flashcore.flash_attn_func(q, k[..., :32].contiguous(), k)
    with pytest.raises(ValueError, match="`softcap`"):
        flashcore.flash_attn_func(q, k, k, softcap=float("nan"))


def test_native_in_inference_mode_with_lse_and_without_keys(native):
    q, k, v = randn(1, 33, 4, 64, seed=1), randn(1, 33, 4, 64, seed=2), randn(1, 33, 4, 64, seed=3)
    expected = flashcore.flash_attn_func(q, k, v, causal=True)
    with torch.inference_mode():
        assert torch.equal(flashcore.flash_attn_func(q, k, v, causal=True), expected)
    qg = q.clone().requires_grad_()
    out, lse, _ = flashcore.flash_attn_func(qg, k, v, causal=True, return_attn_probs=True)
    assert not lse.requires_grad  # lse has no gradient
    (g,) = torch.autograd.grad(out.sum(), (qg,))
    assert g.shape == q.shape and not g.isnan().any()
    empty = flashcore.flash_attn_func(q, k[:, :0], v[:, :0])
    assert torch.equal(empty, torch.zeros_like(q))


def test_native_forward_and_backward_capture_in_a_cuda_graph(native):
    q, k, v = (randn(2, 100, 4, 64, seed=s).requires_grad_() for s in (1, 2, 3))
    do = randn(2, 100, 4, 64, seed=4)
    o = flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True)
    eager = [o.detach(), *torch.autograd.grad(o, (q, k, v), do)]
    del o  # a graph kept alive from outside the capture would make it wait on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as PyTorch's graph docs do
        for _ in range(2):
            torch.autograd.grad(flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), do)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip((o, *grads), eager):
        assert torch.equal(got, want)


def run_with(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def test_flashcore_native_0_takes_the_python_path():
    done = run_with({"FLASHCORE_NATIVE": "0"}, "import flashcore._native as n; print(n.status())")
    assert done.returncode == 0, done.stderr
    assert "'path': 'python'" in done.stdout and "FLASHCORE_NATIVE=0" in done.stdout, done.stdout


def test_flashcore_native_1_without_a_compiler_is_an_error_naming_why(tmp_path):
    code = "import torch, flashcore; q = torch.randn(1, 8, 2, 64, device='cuda', dtype=torch.bfloat16); flashcore.flash_attn_func(q, q, q)"
    env = {"FLASHCORE_NATIVE": "1", "FLASHCORE_CACHE_DIR": str(tmp_path), "CXX": "", "PATH": "/nonexistent"}
    done = run_with(env, code)
    assert done.returncode != 0
    assert "FLASHCORE_NATIVE=1 but the native autograd path is unavailable" in done.stderr and "no C++ compiler" in done.stderr, done.stderr[-800:]


@pytest.mark.parametrize("shared", ["directory", "library"])
def test_a_library_other_users_could_write_is_refused_and_not_loaded(tmp_path, shared):
    """A library planted where the native path looks for its own, in a cache directory every
    user can write or as a file every user can write: refused by name (the core's trust rule),
    never loaded; calls take the Python path."""
    cache = tmp_path / "cache"
    loosen = "os.environ['FLASHCORE_CACHE_DIR']" if shared == "directory" else "target"
    code = (
        "import os, flashcore._native as n\n"
        "target = n.library_path()\n"  # the folder is created private here
        "target.write_bytes(b'not a library')\n"
        f"os.chmod({loosen}, 0o777)\n"
        "print(n.status())\n"
    )
    done = run_with({"FLASHCORE_CACHE_DIR": str(cache)}, code)
    assert done.returncode == 0, done.stderr[-800:]
    assert "'path': 'python'" in done.stdout and "PermissionError: refusing the cache" in done.stdout, done.stdout
    assert "mode 0777, writable by every user" in done.stdout, done.stdout


def test_a_bad_flashcore_native_value_is_refused():
    done = run_with({"FLASHCORE_NATIVE": "yes"}, "import flashcore._native as n; n.attention()")
    assert done.returncode != 0 and "FLASHCORE_NATIVE must be 0, 1 or unset" in done.stderr, done.stderr[-500:]


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler on this machine")
def test_the_library_is_cached_and_a_new_process_loads_it(native):
    path = _native.status()["library"]
    assert path and os.path.exists(path)
    done = run_with({}, "import flashcore._native as n; print(n.status()['path'], n.status()['library'])")
    assert done.returncode == 0 and done.stdout.split() == ["native", path], (done.stdout, done.stderr[-500:])


def test_compiler_lookup_honours_cxx(monkeypatch):
    monkeypatch.setenv("CXX", "/opt/my-c++")
    assert _native._compiler() == "/opt/my-c++"
    monkeypatch.setenv("CXX", "")
    assert _native._compiler() in (shutil.which("c++"), shutil.which("g++"), shutil.which("clang++"))
