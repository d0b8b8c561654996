"""V's own head dim in a real model: a random-initialised DeepSeek-V3-like model (multi-head
latent attention: Q and K 192 = 128 + 64 rotary, V 128), no download, with FlashCore's
registered implementation and with transformers' "eager" attention, the reference.

Tolerance as in test_transformers.py: the float32 model with eager attention is the reference,
and FlashCore's bf16 logits (and one training step's gradients) must be within 1.5x the error
of eager's own bf16 ones against it, plus 1e-3. The attention function is wrapped to record
the head dims it is handed, so the test shows V arriving at 128 (transformers pads V to Q's dim
for its own FlashAttention builds alone). Every token takes every routed expert, as in the
gpt-oss test: bf16 rounding would otherwise flip the router's choices and hide the attention
behind the routing.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
transformers = pytest.importorskip("transformers", reason="needs transformers")
from flashcore.integrations import transformers as integration  # noqa: E402
from transformers import masking_utils  # noqa: E402
from helpers import check_training_step, model_logits as logits, model_rel_l2 as rel_l2, token_ids as ids_of  # noqa: E402

HEAD_DIMS_SEEN = set()


def recording_attention(module, query, key, value, *args, **kwargs):
    """FlashCore's registered attention, recording the (Q, V) head dims it is handed."""
    HEAD_DIMS_SEEN.add((query.shape[-1], value.shape[-1]))
    return integration.attention_forward(module, query, key, value, *args, **kwargs)


RECORDING = "fc-recording"
transformers.AttentionInterface.register(RECORDING, recording_attention)
masking_utils.AttentionMaskInterface.register(RECORDING, integration._mask)

VOCAB = 32000
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=512, intermediate_size=512, moe_intermediate_size=256, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=2, num_experts_per_tok=2,
    n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=128, q_lora_rank=256, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=4096,
)  # fmt: skip


def make_model(dtype):
    """The model in `dtype`, the same weights every call."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV3Config(**CONFIG), attn_implementation="eager", dtype=torch.float32)
    return model.to(dtype).cuda().eval()


@pytest.fixture(scope="module")
def models():
    fp32, bf16 = make_model(torch.float32), make_model(torch.bfloat16)
    yield fp32, bf16
    del fp32, bf16
    torch.cuda.empty_cache()


@pytest.mark.parametrize("length", [1, 17, 300, 1000])
def test_logits_agree_with_eager(models, length):
    fp32, bf16 = models
    ids = ids_of(2, length, length)
    ref = logits(fp32, ids, "eager")
    HEAD_DIMS_SEEN.clear()
    err_eager, err_ours = rel_l2(logits(bf16, ids, "eager"), ref), rel_l2(logits(bf16, ids, RECORDING), ref)
    print(f"DeepSeek-V3 S={length}: rel L2 vs fp32 eager: flashcore {err_ours:.3e}, eager bf16 {err_eager:.3e}")
    assert HEAD_DIMS_SEEN == {(192, 128)}, f"the attention saw head dims {HEAD_DIMS_SEEN}"
    assert err_ours <= 1.5 * err_eager + 1e-3


def test_a_training_step_agrees_with_eager(models):
    fp32, bf16 = models
    ids = ids_of(1, 512, 11)
    HEAD_DIMS_SEEN.clear()
    check_training_step("DeepSeek-V3", fp32, bf16, RECORDING, "eager", cancelling=(".mlp.gate.",), input_ids=ids, labels=ids)
    assert HEAD_DIMS_SEEN == {(192, 128)}


def test_a_right_padded_batch_agrees_with_eager_on_real_positions(models):
    """Padding unpads into a packed batch: the packed forms of (192, 128), forward and backward
    (the logits on the real positions, then one training step with the padding unlabelled)."""
    fp32, bf16 = models
    lengths = [77, 128, 9]
    ids = ids_of(3, 128, 21)
    real = torch.arange(128, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    inputs = dict(input_ids=ids, attention_mask=real.long(), use_cache=False)

    def padded_logits(model, impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model(**inputs).logits.float()[real]

    ref = padded_logits(fp32, "eager")
    HEAD_DIMS_SEEN.clear()
    err_eager, err_ours = rel_l2(padded_logits(bf16, "eager"), ref), rel_l2(padded_logits(bf16, RECORDING), ref)
    print(f"DeepSeek-V3 right-padded: rel L2 vs fp32 eager: flashcore {err_ours:.3e}, eager bf16 {err_eager:.3e}")
    assert HEAD_DIMS_SEEN == {(192, 128)} and err_ours <= 1.5 * err_eager + 1e-3
    labels = ids.masked_fill(~real, -100)
    check_training_step("DeepSeek-V3 right-padded", fp32, bf16, RECORDING, "eager", cancelling=(".mlp.gate.",), **inputs, labels=labels)
