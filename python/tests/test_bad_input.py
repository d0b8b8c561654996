"""Bad input: a Python exception naming the argument, never a crash, and no CUDA error left
pending for the next torch call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
import flashcore  # noqa: E402
from helpers import randn  # noqa: E402


def good(b=1, s=64, h=4, d=64, dtype=torch.bfloat16):
    return randn(b, s, h, d, dtype=dtype), randn(b, s, h, d, dtype=dtype, seed=1), randn(b, s, h, d, dtype=dtype, seed=2)


def torch_still_works():
    torch.cuda.synchronize()
    x = torch.ones(64, 64, device="cuda")
    assert (x @ x).sum().item() == 64**3


def raises(exc, match, **overrides):
    q, k, v = good()
    args = dict(q=q, k=k, v=v)
    args.update(overrides)
    with pytest.raises(exc, match=match):
        flashcore.flash_attn_func(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    torch_still_works()


def test_cpu_tensor():
    raises(ValueError, r"`q` is on cpu", q=randn(1, 64, 4, 64).cpu())


def test_tensors_on_different_devices():
    # One GPU here: a CPU tensor beside CUDA ones (two GPUs: test_attention.test_second_device).
    raises(ValueError, r"`k` is on cpu: FlashCore runs on CUDA tensors", k=randn(1, 64, 4, 64).cpu())


def test_float32_is_a_type_error():
    raises(TypeError, r"`q` has dtype torch.float32.*float16 and torch.bfloat16", q=randn(1, 64, 4, 64).float())


def test_mixed_dtypes():
    raises(TypeError, r"`v` has dtype torch.float16", v=randn(1, 64, 4, 64, dtype=torch.float16))


def test_not_a_tensor():
    raises(TypeError, r"`k` must be a torch.Tensor", k=[1.0])


def test_wrong_rank():
    raises(ValueError, r"`q` must have 4 dims", q=randn(64, 4, 64))


def test_last_dim_not_contiguous():
    q = randn(1, 4, 64, 64).transpose(2, 3)  # [1, 4, 64(d), 64(s)] -> last dim strided
    raises(ValueError, r"strides of `q`: last dim must be contiguous", q=q)


def test_misaligned_pointer():
    flat = randn(1 * 64 * 4 * 64 + 1)
    q = flat[1:].view(1, 64, 4, 64)  # 2 bytes past a 16-byte boundary
    raises(ValueError, r"alignment of `q`", q=q)


def test_heads_not_a_multiple():
    k = randn(1, 64, 3, 64)
    raises(ValueError, r"shape of `k`: q heads \(4\) are not a multiple of k/v heads \(3\)", k=k, v=k)


def test_unsupported_head_dims():
    # Past 256 nothing runs it; below, Hopper runs every size (test_backward's padded shapes)
    # and other GPUs their kernels' own sizes.
    q, k, v = good(d=264)
    with pytest.raises(NotImplementedError, match="head dim 264 is not supported"):
        flashcore.flash_attn_func(q, k, v)
    if torch.cuda.get_device_capability() != (9, 0):
        q, k, v = good(d=48)
        with pytest.raises(NotImplementedError, match=r"head dim 48 is not supported \(supported: 32, 64"):
            flashcore.flash_attn_func(q, k, v)
    torch_still_works()


def test_bad_dropout_is_named():
    raises(ValueError, "`dropout_p`", dropout_p=1.0)
    raises(ValueError, "`dropout_p`", dropout_p=-0.1)


def slopes(*shape, **kw):
    """ALiBi slopes of `shape`, all 0.25, on the GPU (float32 unless `dtype`)."""
    return torch.full(shape, 0.25, device="cuda", **kw)


@pytest.mark.parametrize(
    "exc,match,alibi",
    [
        (TypeError, r"`alibi_slopes` has dtype torch.float16: it must be torch.float32", lambda: slopes(4, dtype=torch.float16)),
        (TypeError, r"`alibi_slopes` must be a torch.Tensor, got list", lambda: [0.25] * 4),
        (ValueError, r"`alibi_slopes` is on cpu and `q` on cuda", lambda: slopes(4).cpu()),
        (ValueError, r"`alibi_slopes` must be \[Hq\] or \[B, Hq\] with Hq = 4, q's heads; got shape \(5,\)", lambda: slopes(5)),
        (ValueError, r"`alibi_slopes` must be \[Hq\] or \[B, Hq\].*got shape \(4, 1\)", lambda: slopes(1, 4).t()),
        (ValueError, r"`alibi_slopes` must be \[Hq\] or \[B, Hq\].*got shape \(1, 1, 4\)", lambda: slopes(1, 1, 4)),
        # A row count that is not the batch's (B = 1 here): the Rust library's check, by name.
        (ValueError, r"shape of `alibi_slopes`", lambda: slopes(3, 4)),
    ],
    ids=["float16", "list", "cpu", "heads-5", "transposed", "3-dims", "rows-3"],
)
def test_bad_alibi_slopes_are_named(exc, match, alibi):
    raises(exc, match, alibi_slopes=alibi())


def test_bad_alibi_slopes_are_named_in_every_call():
    # The autograd path, a packed batch (B = its sequences) and a KV cache check them alike.
    q, k, v = (t.requires_grad_() for t in good())
    with pytest.raises(ValueError, match=r"shape of `alibi_slopes`"):
        flashcore.flash_attn_func(q, k, v, alibi_slopes=slopes(2, 4))
    cu = torch.tensor([0, 30, 64], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"shape of `alibi_slopes`"):
        flashcore.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 34, 34, alibi_slopes=slopes(3, 4))
    with pytest.raises(TypeError, match=r"`alibi_slopes` has dtype torch.bfloat16"):
        flashcore.flash_attn_with_kvcache(q.detach(), k.detach(), v.detach(), alibi_slopes=slopes(4, dtype=torch.bfloat16))
    torch_still_works()


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window_size=(-2, 0)), r"parameter `window`: \(-2, 0\): each side must be -1 \(unbounded\) or >= 0"),
        (dict(window_size=(16, -5), causal=True), r"parameter `window`"),
        (dict(softcap=-1.0), r"parameter `softcap`: -1 must be 0 \(off\), or finite and > 0"),
        (dict(softcap=float("nan")), r"parameter `softcap`: NaN"),
        (dict(softcap=float("inf")), r"parameter `softcap`: inf"),
    ],
    ids=["window-2", "window-right-5", "softcap-1", "softcap-nan", "softcap-inf"],
)
def test_bad_window_and_softcap_values_are_value_errors(kw, match):
    raises(ValueError, match, **kw)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window_size=(1.5, 0)), r"`window_size` must be a pair of ints"),
        (dict(window_size=64), r"`window_size` must be a pair of ints"),
        (dict(window_size=(1, 2, 3)), r"`window_size` must be a pair of ints"),
        (dict(softcap="30"), r"`softcap` must be a float, got str"),
        (dict(softcap=None), r"`softcap` must be a float, got NoneType"),
    ],
    ids=["window-float", "window-int", "window-triple", "softcap-str", "softcap-none"],
)
def test_window_and_softcap_of_the_wrong_type_are_type_errors(kw, match):
    raises(TypeError, match, **kw)


def test_bad_window_with_grad_inputs_is_a_value_error_too():
    # Through the registered op (inputs that require grad), the same error.
    q, k, v = (t.requires_grad_() for t in good())
    with pytest.raises(ValueError, match=r"parameter `softcap`"):
        flashcore.flash_attn_func(q, k, v, softcap=-3.0)
    torch_still_works()


def test_negative_scale():
    raises(ValueError, r"parameter `softmax_scale`", softmax_scale=-1.0)


def test_sdpa_mask_and_dropout_are_refused():
    q = randn(1, 4, 64, 64)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        flashcore.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(64, 64, dtype=torch.bool, device="cuda"))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashcore.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
