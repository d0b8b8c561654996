"""flashcore.compat: the flash_attn namespace (enabling it, refusing to shadow a real
flash-attn), the packed forms against the unpacked calls, bert_padding's round trip and
rotary embeddings against the textbook rotation."""

from __future__ import annotations

import importlib.machinery
import math
import sys

import pytest
import torch

import flashcore
import flashcore.compat
from helpers import randn

NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding", "flash_attn.layers", "flash_attn.layers.rotary")


@pytest.fixture
def flash_attn(monkeypatch):
    """flash_attn's names registered for one test, sys.modules restored afterwards."""
    for name in NAMES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    find_spec = importlib.util.find_spec  # a real flash-attn on this machine would be refused
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "flash_attn" else find_spec(name, *a, **k))
    flashcore.compat.use_as_flash_attn()
    import flash_attn

    yield flash_attn
    for name in NAMES:
        sys.modules.pop(name, None)



def test_the_namespace_is_flashcores_under_flash_attns_names(flash_attn):
    from flash_attn.bert_padding import pad_input
    from flash_attn.flash_attn_interface import USE_TRITON_ROCM, _flash_attn_forward, _get_block_size_n
    from flash_attn.layers.rotary import apply_rotary_emb

    from flashcore.compat.flash_attn import bert_padding, layers

    assert flash_attn.flash_attn_func is flashcore.flash_attn_func
    assert _flash_attn_forward is flashcore.flash_attn_interface._flash_attn_forward
    assert pad_input is bert_padding.pad_input and apply_rotary_emb is layers.rotary.apply_rotary_emb
    assert flash_attn.__version__ == "2.8.3" and USE_TRITON_ROCM is False
    if torch.cuda.get_device_capability() == (9, 0):
        assert _get_block_size_n("cuda", 64, True, False) == 64, "fwd_sm80's dropout tile on Hopper"
    flashcore.compat.use_as_flash_attn()  # again: harmless


def test_a_real_flash_attn_is_not_shadowed(monkeypatch):
    for name in NAMES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.machinery.ModuleSpec("flash_attn", None, origin="/site-packages/flash_attn/__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(RuntimeError, match="a flash_attn package is installed"):
        flashcore.compat.use_as_flash_attn()
    assert "flash_attn" not in sys.modules


def test_packed_forms_equal_the_unpacked_calls_and_their_gradients(flash_attn):
    qkv = randn(2, 113, 3, 4, 64, seed=1).requires_grad_()
    out = flash_attn.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref = flashcore.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, ref)
    dout = randn(*out.shape, seed=2)
    out.backward(dout)
    ref.backward(dout)
    assert torch.equal(qkv.grad, torch.stack((q.grad, k.grad, v.grad), dim=2))
    kv = torch.stack((k, v), dim=2).detach()
    assert torch.equal(flash_attn.flash_attn_kvpacked_func(q.detach(), kv, causal=True), ref)
    lens = torch.tensor([0, 50, 163], dtype=torch.int32, device="cuda")
    packed = qkv.detach().reshape(-1, 3, 4, 64)[:163]
    out = flash_attn.flash_attn_varlen_qkvpacked_func(packed, lens, 113)
    ref = flashcore.flash_attn_varlen_func(*packed.unbind(1), lens, lens, 113, 113)
    assert torch.equal(out, ref)
    out = flash_attn.flash_attn_varlen_kvpacked_func(packed[:, 0], packed[:, 1:], lens, lens, 113, 113)
    assert torch.equal(out, ref)


def test_bad_arguments_are_named_and_dropout_runs(flash_attn):
    q = randn(1, 8, 2, 64)
    lens = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    table = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="`k` must have 4 dims"):  # with a block table, k and v are page pools
        flash_attn.flash_attn_varlen_func(q[0], q[0], q[0], lens, lens, 8, 8, block_table=table)
    out = flash_attn.flash_attn_qkvpacked_func(torch.stack((q, q, q), dim=2), dropout_p=0.1)  # eager dropout runs
    assert out.shape == q.shape and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="`qkv` must be"):
        flash_attn.flash_attn_qkvpacked_func(q)


def test_unpad_and_pad_round_trip():
    from flashcore.compat.flash_attn.bert_padding import pad_input, unpad_input

    x = randn(3, 10, 4, 16)
    mask = torch.zeros(3, 10, dtype=torch.bool, device="cuda")
    mask[0, :7] = True
    mask[2, 2:10] = True  # left padding
    tokens, indices, cu, max_len, used = unpad_input(x, mask)
    assert tokens.shape == (15, 4, 16) and max_len == 8
    assert cu.tolist() == [0, 7, 7, 15] and cu.dtype == torch.int32 and used.tolist() == [7, 0, 8]
    assert torch.equal(tokens[:7], x[0, :7]) and torch.equal(tokens[7:], x[2, 2:])
    back = pad_input(tokens, indices, 3, 10)
    assert torch.equal(back, x * mask[..., None, None])
    unused = torch.zeros_like(mask)
    unused[1, :2] = True
    tokens, _, cu, _, used = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 7, 9, 17] and used.tolist() == [7, 0, 8]


def _rotated(x, pos, theta, rot, interleaved):
    """The textbook rotation, float64: column pairs (i, i + rot/2) or (2i, 2i + 1) by pos·θ_i."""
    out = x.double().clone()
    for i in range(rot // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rot // 2)
        angle = pos.double() * theta[i]
        xa, xb = x[..., a].double(), x[..., b].double()
        out[..., a] = xa * torch.cos(angle) - xb * torch.sin(angle)
        out[..., b] = xa * torch.sin(angle) + xb * torch.cos(angle)
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_is_the_textbook_rotation(interleaved):
    from flashcore.compat.flash_attn.layers.rotary import apply_rotary_emb

    b, s, h, d, rot, table = 2, 20, 3, 64, 32, 24
    theta = [10000 ** (-2 * i / rot) for i in range(rot // 2)]
    angles = torch.arange(table, device="cuda", dtype=torch.float64)[:, None] * torch.tensor(theta, device="cuda", dtype=torch.float64)
    cos, sin = angles.cos().float(), angles.sin().float()
    x = randn(b, s, h, d, dtype=torch.float32, seed=3)
    offsets = torch.tensor([0, 7], device="cuda")
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    pos = torch.arange(s, device="cuda")[None, :] + offsets[:, None]  # [B, S], up to 26 > table
    ref = _rotated(x, pos[..., None].expand(b, s, h).clamp(max=table - 1), theta, rot, interleaved)
    seen = (pos < table)[..., None, None]
    ref = torch.where(seen, ref, x.double())  # past the table: as it was
    assert torch.allclose(out.double(), ref, atol=1e-5), (out.double() - ref).abs().max()
    # Packed: positions restart at each sequence (and its offset).
    lens = torch.tensor([0, 20, 40], dtype=torch.int32, device="cuda")
    packed = apply_rotary_emb(x.reshape(-1, h, d), cos, sin, interleaved=interleaved, seqlen_offsets=offsets, cu_seqlens=lens, max_seqlen=20)
    assert torch.equal(packed, out.reshape(-1, h, d))
    y = x.clone().requires_grad_()
    apply_rotary_emb(y, cos, sin, interleaved=interleaved).sum().backward()
    assert y.grad is not None and torch.isfinite(y.grad).all() and not math.isnan(y.grad.sum().item())
