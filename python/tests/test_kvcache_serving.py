"""A serving loop over a paged KV cache: a random-initialised Llama-style model (RMSNorm,
rotary embeddings, GQA, SwiGLU; no download) generates 128 tokens for 8 prompts of different
lengths, prefill one prompt at a time and then batched decode, with pages handed out by a
small allocator from a shuffled pool as sequences grow (non-contiguous, interleaved across
sequences). The tokens and logits must equal the run over contiguous caches of the same
capacity (the same kernels and split counts: bitwise), and the prefill logits must be as close
to float32 attention as PyTorch's bf16 SDPA is."""

from __future__ import annotations

import math

import pytest
import torch

import flashcore

VOCAB, HIDDEN, LAYERS, HQ, HKV, D, MLP = 1024, 512, 2, 8, 2, 64, 1024
PAGE, STEPS = 16, 128
PROMPTS = [1, 7, 16, 17, 100, 250, 33, 64]


class Model:
    def __init__(self):
        g = torch.Generator(device="cuda").manual_seed(0)
        w = lambda *s: (torch.randn(*s, generator=g, device="cuda") / math.sqrt(s[-1])).bfloat16()  # noqa: E731
        self.embed = w(VOCAB, HIDDEN) * 8
        self.layers = [dict(qkv=w((HQ + 2 * HKV) * D, HIDDEN), o=w(HIDDEN, HQ * D), up=w(2 * MLP, HIDDEN), down=w(HIDDEN, MLP)) for _ in range(LAYERS)]
        self.head = w(VOCAB, HIDDEN)
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
        self.freqs = torch.outer(torch.arange(4096, device="cuda").float(), inv)

    def rope(self, x, pos):  # x [B, S, H, D], pos [B, S]
        f = self.freqs[pos][:, :, None]  # [B, S, 1, D/2]
        cos, sin = torch.cat([f.cos()] * 2, -1), torch.cat([f.sin()] * 2, -1)
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    def forward(self, ids, pos, attend):
        """Logits of `ids [B, S]` at positions `pos [B, S]`; `attend(layer, q, k, v)` does the
        attention (and keeps the cache)."""
        x = self.embed[ids]
        norm = lambda t: (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()  # noqa: E731
        b, s = ids.shape
        for i, layer in enumerate(self.layers):
            qkv = norm(x) @ layer["qkv"].T
            q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], -1)
            q, k, v = q.view(b, s, HQ, D), k.view(b, s, HKV, D), v.view(b, s, HKV, D)
            q, k = self.rope(q, pos), self.rope(k, pos)
            x = x + attend(i, q, k, v).reshape(b, s, HQ * D) @ layer["o"].T
            gate, up = (norm(x) @ layer["up"].T).chunk(2, -1)
            x = x + (torch.nn.functional.silu(gate.float()).bfloat16() * up) @ layer["down"].T
        return (norm(x) @ self.head.T).float()


class Caches:
    """Per-layer caches: paged pools with a block table filled by an allocator that takes
    pages from a shuffled free list as sequences grow, or contiguous [B, capacity] caches."""

    def __init__(self, paged, batch, capacity):
        self.paged = paged
        self.max_pages = capacity // PAGE
        num_pages = batch * self.max_pages + 7
        shape = (num_pages, PAGE, HKV, D) if paged else (batch, capacity, HKV, D)
        self.k = [torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.v = [torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.free = torch.randperm(num_pages, generator=torch.Generator().manual_seed(1)).tolist()
        self.table = torch.full((batch, self.max_pages), -1, dtype=torch.int32)
        self.lens = [0] * batch

    def reserve(self, b, new):
        """Pages for sequence b's next `new` keys."""
        for slot in range(-(-self.lens[b] // PAGE), -(-(self.lens[b] + new) // PAGE)):
            self.table[b, slot] = self.free.pop()

    def attend(self, rows, new):
        """The attention of sequences `rows` (a slice) appending `new` keys each."""
        table = self.table[rows].cuda() if self.paged else None
        lens = torch.tensor(self.lens[rows], dtype=torch.int32, device="cuda")

        def attend(layer, q, k, v):
            kc, vc = (self.k[layer], self.v[layer]) if self.paged else (self.k[layer][rows], self.v[layer][rows])
            return flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)

        return attend


def generate(model, prompts, paged):
    batch, capacity = len(prompts), (max(len(p) for p in prompts) + STEPS + PAGE) // PAGE * PAGE
    caches = Caches(paged, batch, capacity)
    first, prefill_logits = [], []
    for b, prompt in enumerate(prompts):  # prefill, one prompt at a time (chunked prefill from 0)
        ids = torch.tensor([prompt], device="cuda")
        caches.reserve(b, len(prompt))
        logits = model.forward(ids, torch.arange(len(prompt), device="cuda")[None], caches.attend(slice(b, b + 1), len(prompt)))
        caches.lens[b] = len(prompt)
        prefill_logits.append(logits[0])
        first.append(int(logits[0, -1].argmax()))
    tokens = [first]
    for _ in range(STEPS - 1):  # batched decode, appending one key a sequence
        for b in range(batch):
            caches.reserve(b, 1)
        ids = torch.tensor(tokens[-1], device="cuda")[:, None]
        pos = torch.tensor(caches.lens, device="cuda")[:, None]
        logits = model.forward(ids, pos, caches.attend(slice(0, batch), 1))
        caches.lens = [n + 1 for n in caches.lens]
        tokens.append(logits[:, -1].argmax(-1).tolist())
    return torch.tensor(tokens).T, prefill_logits, caches


def sdpa(dtype):
    def attend(layer, q, k, v):
        q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).bfloat16()

    return attend


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_paged_serving_loop_equals_the_contiguous_one():
    model = Model()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in PROMPTS]
    paged_tokens, paged_logits, caches = generate(model, prompts, paged=True)
    flat_tokens, flat_logits, _ = generate(model, prompts, paged=False)
    assert paged_tokens.shape == (len(PROMPTS), STEPS)
    assert torch.equal(paged_tokens, flat_tokens), "the paged run generated other tokens"
    assert all(torch.equal(a, b) for a, b in zip(paged_logits, flat_logits))
    # The allocator really interleaved the sequences' pages.
    rows = [caches.table[b, : -(-caches.lens[b] // PAGE)].tolist() for b in range(len(PROMPTS))]
    assert any(r != sorted(r) for r in rows) and any(max(r) - min(r) >= len(r) for r in rows if len(r) > 1)
    # The attention itself: prefill logits as close to float32 SDPA as bf16 SDPA is.
    for prompt, logits in zip(prompts, paged_logits):
        ids, pos = torch.tensor([prompt], device="cuda"), torch.arange(len(prompt), device="cuda")[None]
        ref = model.forward(ids, pos, sdpa(torch.float32))[0].double()
        bf16 = model.forward(ids, pos, sdpa(torch.bfloat16))[0].double()
        err = ((logits.double() - ref).norm() / ref.norm()).item()
        base = ((bf16 - ref).norm() / ref.norm()).item()
        assert err <= 1.5 * base + 1e-3, f"prompt of {len(prompt)}: {err:.3g} vs SDPA bf16 {base:.3g}"
