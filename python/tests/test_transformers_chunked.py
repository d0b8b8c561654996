"""Chunked attention in a real model: a random-initialised Llama 4 text model (no download; three
chunked layers of 64 keys and one full layer, GQA, head dim 128, no MoE), run with FlashCore's
registered implementation and with transformers' "eager" attention, which builds the chunks
into its 4-D mask: the reference.

Tolerance as in test_transformers.py: the float32 model with eager attention is the reference,
and FlashCore's bf16 logits must be within 1.5x the error of eager's own bf16 logits against it,
plus 1e-3. The chunk is first shown to change the logits by more than five times that, so a run
that ignored it could not pass.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
transformers = pytest.importorskip("transformers", reason="needs transformers")
if not hasattr(transformers, "Llama4TextConfig"):
    pytest.fail(f"transformers {transformers.__version__} has no Llama 4: the suite needs one that has", pytrace=False)
import flashcore  # noqa: E402
from helpers import check_training_step, model_rel_l2 as rel_l2  # noqa: E402

FLASHCORE = flashcore.integrations.transformers.register()
VOCAB = 32000
CHUNK = 64
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=2816, intermediate_size_mlp=2816, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=2, head_dim=128, max_position_embeddings=4096, moe_layers=[], attention_chunk_size=CHUNK, pad_token_id=0,
)  # fmt: skip


def make_model(dtype, **overrides):
    cfg = transformers.Llama4TextConfig(**{**CONFIG, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    return model.to(dtype).cuda().eval()


def logits(model, impl, **inputs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits.float()


def ids_of(batch, length, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), device="cuda", generator=g)


@pytest.fixture(scope="module")
def models():
    fp32, bf16 = make_model(torch.float32), make_model(torch.bfloat16)
    assert fp32.config.layer_types.count("chunked_attention") == 3, fp32.config.layer_types
    yield fp32, bf16
    del fp32, bf16
    torch.cuda.empty_cache()


def test_the_chunk_matters_in_this_model(models):
    fp32, bf16 = models
    ids = ids_of(2, 300, 1)
    ref = logits(fp32, "eager", input_ids=ids)
    bf16_err = rel_l2(logits(bf16, "eager", input_ids=ids), ref)
    unchunked = make_model(torch.float32, attention_chunk_size=4096)
    diff = rel_l2(logits(unchunked, "eager", input_ids=ids), ref)
    print(f"llama4: without chunks the fp32 logits move by {diff:.3e} (eager bf16 error {bf16_err:.3e})")
    assert diff > 5 * (1.5 * bf16_err + 1e-3), "the chunk barely changes the logits: the comparisons below would not see it ignored"


@pytest.mark.parametrize("length", [1, 17, 64, 300])
def test_logits_agree_with_eager(models, length):
    fp32, bf16 = models
    ids = ids_of(2, length, length)
    ref = logits(fp32, "eager", input_ids=ids)
    err_eager, err_ours = rel_l2(logits(bf16, "eager", input_ids=ids), ref), rel_l2(logits(bf16, FLASHCORE, input_ids=ids), ref)
    print(f"llama4 S={length}: rel L2 vs fp32 eager: flashcore {err_ours:.3e}, eager bf16 {err_eager:.3e}")
    assert err_ours <= 1.5 * err_eager + 1e-3


def test_left_padded_batch_counts_chunks_from_the_first_token(models):
    """transformers counts a padded row's chunks from its first real token; FlashCore's unpadded
    sequence starts there. Compared on the real rows."""
    fp32, bf16 = models
    ids = ids_of(2, 200, 5)
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    ids[1, :37] = 0
    inputs = dict(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    ref = logits(fp32, "eager", **inputs)[real]
    err_eager, err_ours = rel_l2(logits(bf16, "eager", **inputs)[real], ref), rel_l2(logits(bf16, FLASHCORE, **inputs)[real], ref)
    print(f"llama4 left-padded: flashcore {err_ours:.3e}, eager bf16 {err_eager:.3e}")
    assert err_ours <= 1.5 * err_eager + 1e-3


def generate(model, impl, n, **inputs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[:, inputs["input_ids"].shape[1] :], torch.stack(out.logits, dim=1).float()


@pytest.mark.parametrize("padded", [False, True], ids=["one", "left-padded"])
def test_greedy_generation_past_the_chunk_matches_eager(models, padded):
    """A 100-token prompt and 100 new tokens: the cache of a chunked layer keeps its last 63
    keys, so every decode step's keys start inside a chunk (the mask builder cuts them at the
    query's chunk), and the steps cross chunk boundaries (128, 192)."""
    _, bf16 = models
    ids = ids_of(2 if padded else 1, 100, 7)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :21], ids[1, :21] = 0, 0
    tok_eager, log_eager = generate(bf16, "eager", 100, input_ids=ids, attention_mask=mask)
    tok_ours, log_ours = generate(bf16, FLASHCORE, 100, input_ids=ids, attention_mask=mask)
    for row in range(ids.shape[0]):
        same = tok_eager[row] == tok_ours[row]
        if same.all():
            continue
        t = int((~same).nonzero()[0])
        a, b = int(tok_eager[row, t]), int(tok_ours[row, t])
        margin = (log_eager[row, t, a] - log_eager[row, t, b]).item()
        noise = (log_eager[row, t] - log_ours[row, t]).abs().max().item()
        print(f"llama4 row {row}: first divergence at new token {t}: eager {a}, flashcore {b}; margin {margin:.4f}, logit difference {noise:.4f}")
        assert margin <= noise, "diverged where the logits were not a tie"


def test_training_through_chunks_matches_eager(models):
    # Every parameter's gradient of one loss.backward() against the float32 model's with eager
    # attention, within 1.5x eager bf16's own error plus 1e-3.
    fp32, bf16 = models
    ids = ids_of(1, 300, 11)
    check_training_step("llama4 chunked", fp32, bf16, FLASHCORE, "eager", input_ids=ids, labels=ids)
