"""FlashAttention-3's FP8 forward through `flashcore.compat`'s FA3 namespace (GPU, Hopper):
e4m3 q, k, v with per-(sequence, KV head) descales against float64 attention on the
dequantized values, bounded as `flashcore check --fp8` bounds the kernel (an emulation that
rounds only P to e4m3, docs/features.md#fp8-e4m3-forward), and the refusals by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
from helpers import reference, rel_l2, visible  # noqa: E402
from test_flash_attn_3 import fa3  # noqa: E402, F401  (the fixture: FA3's namespace on FlashCore)

E4M3 = torch.float8_e4m3fn


def e4m3(*shape, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).mul_(scale).to(E4M3)


def descales(b, hkv, seed):
    """One descale a (sequence, KV head), from [0.25, 4]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.pow(2.0, torch.randint(-2, 3, (b, hkv), device="cuda", generator=g).float())


def dequantized(x, d, group=1):
    """e4m3 x [B, S, H, D] times its descale [B, Hkv] (query heads share their KV head's)."""
    x = x.float().double()  # (float8 widens through float32)
    return x if d is None else x * d.double().repeat_interleave(group, dim=1)[:, None, :, None]


def emulated(q, k, v, scale, causal, window):
    """float64 attention with only P rounded to e4m3 (at the row's exact max; the sums
    unrounded), the output rounded to bf16: what an exact e4m3 kernel would give."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    group = qt.shape[1] // kt.shape[1]
    kt, vt = (t.repeat_interleave(group, dim=1) for t in (kt, vt))
    _, lse = reference(q, k, v, scale, causal, window=window)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(qt.shape[2], kt.shape[2], causal, False, window, q.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m).nan_to_num(0.0)
    o = torch.matmul(p.float().to(E4M3).float().double(), vt) / p.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    return o.transpose(1, 2).to(torch.bfloat16), lse


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (100, 20))])
def test_fp8_forward_against_float64_on_the_dequantized_inputs(fa3, d, causal, window):  # noqa: F811
    b, sq, sk, hq, hkv = 2, 300, 700, 8, 2
    q, k, v = e4m3(b, sq, hq, d, seed=1), e4m3(b, sk, hkv, d, seed=2), e4m3(b, sk, hkv, d, seed=3)
    qd, kd, vd = descales(b, hkv, 4), descales(b, hkv, 5), descales(b, hkv, 6)
    with torch.no_grad():
        out, lse = fa3.flash_attn_func(
            q, k, v, causal=causal, window_size=window, q_descale=qd, k_descale=kd, v_descale=vd, return_attn_probs=True
        )
        again = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, q_descale=qd, k_descale=kd, v_descale=vd)
    group = hq // hkv
    rq, rk, rv = dequantized(q, qd, group), dequantized(k, kd), dequantized(v, vd)
    scale = d**-0.5
    ref_o, ref_lse = reference(rq, rk, rv, scale, causal, window=window)
    emul_o, _ = emulated(rq, rk, rv, scale, causal, window)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    assert torch.equal(out, again), "bitwise repeatable"
    bound = 1.1 * rel_l2(emul_o, ref_o) + 2**-12 * ref_lse[ref_lse.isfinite()].abs().max().item()
    assert rel_l2(out, ref_o) <= bound, (rel_l2(out, ref_o), bound)
    # Each row's LSE within 2e-3 plus 2^-12 of its scores' reach, scale·|q|·max|k| (the FP8
    # tensor cores' accumulation; see the check's bound).
    reach = scale * rq.norm(dim=-1).transpose(1, 2) * rk.norm(dim=-1).amax(dim=1).repeat_interleave(group, dim=1)[..., None]
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert ((lse.double() - ref_lse)[finite].abs() <= 2e-3 + 2**-12 * reach[finite]).all()


def test_fp8_without_descales_and_the_refusals_name_the_argument(fa3):  # noqa: F811
    b, s, h, d = 1, 256, 4, 128
    q, k, v = e4m3(b, s, h, d, seed=7), e4m3(b, s, h, d, seed=8), e4m3(b, s, h, d, seed=9)
    with torch.no_grad():
        out = fa3.flash_attn_func(q, k, v, causal=True)
    ref_o, _ = reference(*(t.float() for t in (q, k, v)), d**-0.5, True)
    assert rel_l2(out, ref_o) < 5e-2
    bf16 = q.to(torch.bfloat16)
    with pytest.raises(TypeError, match="`q`.*float8_e4m3fn"):
        fa3.flash_attn_func(bf16, k, v, q_descale=torch.ones(b, h, device="cuda"))
    with pytest.raises(TypeError, match="`k`.*float8_e4m3fn"):
        fa3.flash_attn_func(q, bf16, v)
    with pytest.raises(ValueError, match="`k_descale`.*\\[1, 4\\]"):
        fa3.flash_attn_func(q, k, v, k_descale=torch.ones(h, device="cuda"))
    with pytest.raises(NotImplementedError, match="`qv`"):
        fa3.flash_attn_func(q, k, v, qv=bf16)
    with pytest.raises(ValueError, match="`softcap`"):
        fa3.flash_attn_func(q, k, v, softcap=30.0)
    with pytest.raises(NotImplementedError, match="`q_descale`"):
        cu = torch.tensor([0, s], device="cuda", dtype=torch.int32)
        fa3.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, s, s, q_descale=torch.ones(1, h, device="cuda"))
