"""One rank of the context-parallel training check (run by test_distributed.py under torchrun):
a random-initialised transformers Llama (GQA 8/2, head dim 64) trains one step with its
sequence split over the ranks (zigzag shards, `zigzag_ring_flash_attn_func` as the model's
attention), against the same bf16 step on the whole sequence on one GPU (FlashCore's
registered implementation): the loss, this rank's logits, and every parameter's gradient
summed over the ranks. Prints one line per check and exits 1 on any failure (NaN included).

Gradient tolerance as in test_transformers.py: bf16 rounding alone moves this model's
gradients by about 1e-2 (relative L2 against float32; measured with a CPU stand-in for the
ring), the size of a fixed bound's margin, so the yardstick is measured: the float32 model
(SDPA) on the whole sequence is the reference, and each gradient of the split step must be
within 1.5x the one-GPU bf16 step's error against it, plus 1e-3."""
from __future__ import annotations

import copy
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers

import flashcore
from flashcore import distributed as cp

from distributed_checks import Tally, rel_l2

checks = Tally({"loss": 1e-3, "logits": 2e-2})
RING = "fc_zigzag_ring"  # no "flash" in the name: see flashcore.integrations.transformers
LAYERS = 2
ring_calls = 0


def zigzag_ring_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract on this rank's zigzag shard: `query [B, Hq,
    S_local, D]`, `key, value [B, Hkv, S_local, D]` in, `[B, S_local, Hq, D]` and no weights
    out. The name has no mask builder registered, so transformers builds no mask; causality
    across the shards is the ring's."""
    global ring_calls
    if attention_mask is not None:
        raise ValueError(f"`attention_mask` {tuple(attention_mask.shape)}: a mask over the local rows would be the wrong pattern")
    ring_calls += 1
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    return cp.zigzag_ring_flash_attn_func(q, k, v, dropout_p=dropout, softmax_scale=scaling, causal=True), None


def make_model() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=LAYERS, num_attention_heads=8,
                                   num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, attention_dropout=0.0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model = model.to("cuda", torch.bfloat16).train()
    # The same seed gives the same weights on every rank; the broadcast makes that a fact
    # rather than an assumption about the initialisers.
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    return model


def training_step(model: torch.nn.Module, impl: str, ids: torch.Tensor, labels: torch.Tensor, valid: int, **inputs):
    """(loss, logits, gradients by parameter name as float32 copies) of one step on these rows.
    The loss is their token cross-entropies summed over `valid`, the whole sequence's count of
    labels, so the ranks' losses and gradients sum to the whole sequence's mean-loss step."""
    model.set_attn_implementation(impl)
    logits = model(input_ids=ids, use_cache=False, **inputs).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / valid
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), logits.detach(), grads


def check_gradients(split: dict, one_gpu: dict, exact: dict) -> None:
    """Every parameter's gradient of the split step against the float32 step's: within 1.5x
    the one-GPU bf16 step's error, plus 1e-3 (see the module)."""
    rank = dist.get_rank()
    if not exact or split.keys() != exact.keys() or one_gpu.keys() != exact.keys():
        checks.fail(f"gradients of different parameters: {sorted(split.keys() ^ exact.keys())}")
        return
    rows = [(rel_l2(split[n], exact[n]), rel_l2(one_gpu[n], exact[n]), rel_l2(split[n], one_gpu[n]), n) for n in exact]
    bad = [r for r in rows if not r[0] <= 1.5 * r[1] + 1e-3]
    checks.failures += bool(bad)
    shown = bad or ([max(rows, key=lambda r: r[0] - 1.5 * r[1])] if rank == 0 else [])
    for split_err, one_err, apart, name in shown:
        verdict = "FAIL" if bad else f"ok   worst of {len(rows)}:"
        print(f"rank {rank} {verdict} gradient of {name} against fp32: split {split_err:.1e}, one GPU {one_err:.1e}; "
              f"split against one GPU {apart:.1e}", flush=True)


def main() -> None:
    global ring_calls
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    whole = flashcore.integrations.transformers.register()
    transformers.AttentionInterface.register(RING, zigzag_ring_attention)
    model = make_model()

    s = 4 * world * 131  # 2W zigzag chunks of 262 rows: neither they nor S are multiples of the 128-row tiles
    g = torch.Generator(device="cuda").manual_seed(5)
    ids = torch.randint(0, model.config.vocab_size, (1, s), device="cuda", generator=g)
    dist.broadcast(ids, src=0)
    # Shifted on the whole sequence, before sharding: a chunk's last token predicts the next
    # chunk's first, which another rank holds.
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    valid = int((labels != -100).sum())

    _, _, exact = training_step(copy.deepcopy(model).float(), "sdpa", ids, labels, valid)
    one_loss, one_logits, one_grads = training_step(model, whole, ids, labels, valid)

    # position_ids carry the global positions, so RoPE rotates each row as on one GPU although
    # a rank's rows are not contiguous.
    positions = torch.arange(s, device="cuda")[None]
    ring_calls = 0
    loss, logits, grads = training_step(model, RING, cp.shard(ids), cp.shard(labels), valid, position_ids=cp.shard(positions))
    if ring_calls != LAYERS:
        checks.fail(f"the ring ran {ring_calls} times in the forward pass, not once a layer ({LAYERS})")
    for grad in grads.values():
        dist.all_reduce(grad)  # fp32: the sum adds no bf16 rounding of its own
    dist.all_reduce(loss)

    loss_err = abs(loss.item() - one_loss.item()) / abs(one_loss.item()) if torch.isfinite(loss) else float("inf")
    checks.report(f"Llama S{s} over {world} ranks: loss {loss.item():.4f} (one GPU {one_loss.item():.4f}), this rank's logits against one GPU's",
           {"loss": loss_err, "logits": rel_l2(logits, cp.shard(one_logits))})
    check_gradients(grads, one_grads, exact)

    checks.finish()


if __name__ == "__main__":
    main()
