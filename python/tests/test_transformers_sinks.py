"""Learnable sinks in a real model: a random-initialised gpt-oss-like model (sliding-window and
full layers alternating, GQA, a sink logit a query head in every layer, handed to the attention
function as `s_aux`), no download, with FlashCore's registered implementation and with
transformers' "eager" attention, which concatenates the sinks to the scores in PyTorch: the
reference.

Tolerance as in test_transformers.py: the float32 model with eager attention is the reference,
and FlashCore's bf16 logits (and one training step's gradients, the sinks' included) must be
within 1.5x the error of eager's own bf16 ones against it, plus 1e-3. The sinks are drawn in
[-1, 3] (the default init leaves them near 0) and first shown to change the logits by more than
five times that, so a run that ignored them could not pass. Every token takes both experts: with
top-2 of 4, bf16 rounding flips the router's choices, and eager's own bf16 error (0.10 on an
H200) would hide the attention behind the routing.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
transformers = pytest.importorskip("transformers", reason="needs transformers")
import flashcore  # noqa: E402
from helpers import check_training_step, model_logits as logits, model_rel_l2 as rel_l2, token_ids as ids_of  # noqa: E402

FLASHCORE = flashcore.integrations.transformers.register()
VOCAB = 32000
CONFIG = dict(
    vocab_size=VOCAB, num_hidden_layers=4, hidden_size=512, intermediate_size=512, head_dim=64, num_attention_heads=8,
    num_key_value_heads=2, sliding_window=64, num_local_experts=2, num_experts_per_tok=2, max_position_embeddings=4096,
)  # fmt: skip


def make_model(dtype, sinks=True):
    """The model in `dtype`, the same weights every call; its sinks drawn in [-1, 3], or zeroed
    and frozen out of the softmax's way (-30) with `sinks=False`."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(**CONFIG), attn_implementation="eager", dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            heads = layer.self_attn.sinks.shape[0]
            layer.self_attn.sinks.copy_(torch.rand(heads, generator=g) * 4 - 1 if sinks else torch.full((heads,), -30.0))
    return model.to(dtype).cuda().eval()


@pytest.fixture(scope="module")
def models():
    fp32, bf16 = make_model(torch.float32), make_model(torch.bfloat16)
    yield fp32, bf16
    del fp32, bf16
    torch.cuda.empty_cache()


def test_the_sinks_matter_in_this_model(models):
    fp32, bf16 = models
    ids = ids_of(2, 300, 1)
    ref = logits(fp32, ids, "eager")
    bf16_err = rel_l2(logits(bf16, ids, "eager"), ref)
    diff = rel_l2(logits(make_model(torch.float32, sinks=False), ids, "eager"), ref)
    print(f"without sinks the fp32 logits move by {diff:.3e} (eager bf16 error {bf16_err:.3e})")
    assert diff > 5 * (1.5 * bf16_err + 1e-3), "the sinks barely change the logits: the comparisons below would not see them ignored"


@pytest.mark.parametrize("length", [1, 17, 300, 1000])
def test_logits_agree_with_eager(models, length):
    fp32, bf16 = models
    ids = ids_of(2, length, length)
    ref = logits(fp32, ids, "eager")
    err_eager, err_ours = rel_l2(logits(bf16, ids, "eager"), ref), rel_l2(logits(bf16, ids, FLASHCORE), ref)
    print(f"gpt-oss S={length}: rel L2 vs fp32 eager: flashcore {err_ours:.3e}, eager bf16 {err_eager:.3e}")
    assert err_ours <= 1.5 * err_eager + 1e-3


def test_a_training_step_agrees_with_eager(models):
    # Every parameter's gradient, the sinks' included (FlashCore's dsink), in eval mode as the
    # other models' tests (no dropout either way).
    # The routers' gradients, with both experts taken by every token, are [g, -g]-shaped
    # differences of the two experts' outputs: H200, bf16, eager 1.9e-3 and FlashCore 5.5e-3
    # against fp32 for layer 0's bias: a cancellation, not attention.
    fp32, bf16 = models
    ids = ids_of(1, 512, 11)
    check_training_step("gpt-oss", fp32, bf16, FLASHCORE, "eager", cancelling=(".mlp.router.",), input_ids=ids, labels=ids)
