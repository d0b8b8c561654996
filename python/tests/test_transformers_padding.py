"""Padded and packed batches in real models: random-initialised Llama (GQA), Qwen2, Mistral
(a sliding window on every layer) and Gemma 2 (windowed and full layers, softcapped logits)
models, no download, run with FlashCore's registered implementation (padding unpadded into
the packed kernels, packed rows split at their `position_ids`) and with transformers' "eager"
attention (its 4-D mask, softcap in PyTorch).

Tolerance as in test_transformers.py: the float32 model with "eager" is the reference, and
FlashCore's bf16 results must be within 1.5x the error of eager's own bf16 results against
it, plus 1e-3, on the real positions. "eager", not "sdpa": SDPA has no softcap (Gemma 2), and
its gradients are NaN where a padded query row sees no key (left padding; a window over right
padding), where eager's masked softmax stays finite. Greedy tokens of a left-padded batch must
equal each prompt generated alone with "sdpa"; where they diverge, the step must be a bf16 tie
(SDPA's own top two logits closer than the largest logit difference between the runs there).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch")
transformers = pytest.importorskip("transformers", reason="needs transformers")
import flashcore  # noqa: E402
from flashcore.integrations.transformers import attention_forward  # noqa: E402
from helpers import check_training_step, model_rel_l2 as rel_l2  # noqa: E402

FLASHCORE = flashcore.integrations.transformers.register()
VOCAB = 4096
WINDOW = 32

COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, intermediate_size=2048, max_position_embeddings=1024, hidden_size=1024)
CONFIGS = {
    "llama-gqa": ("LlamaConfig", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=128)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=8, num_key_value_heads=2)),
    "mistral-window": ("MistralConfig", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=128, sliding_window=WINDOW)),
    "gemma2-softcap": (
        "Gemma2Config",
        dict(
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=128,
            query_pre_attn_scalar=128,
            sliding_window=WINDOW,
            attn_logit_softcapping=10.0,
            final_logit_softcapping=30.0,
            initializer_range=0.1,
        ),
    ),
}
GENERATE = ["llama-gqa", "qwen2", "mistral-window"]  # Gemma 2 generates through a static (compileable) cache
BASELINE = "eager"


def make_model(name, dtype):
    cls, kw = CONFIGS[name]
    cfg = getattr(transformers, cls)(**COMMON, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model.to(dtype).cuda().eval()


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request):
    fp32 = make_model(request.param, torch.float32)
    bf16 = make_model(request.param, torch.bfloat16)
    yield request.param, fp32, bf16
    del fp32, bf16
    torch.cuda.empty_cache()


def ids_of(batch, length, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), device="cuda", generator=g)


def padding_mask(lengths, width, left):
    cols = torch.arange(width, device="cuda")[None, :]
    n = torch.tensor(lengths, device="cuda")[:, None]
    return (cols >= width - n) if left else (cols < n)


def run_logits(model, impl, **inputs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs).logits.float()


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_padded_logits_match_sdpa_on_real_positions(models, left):
    name, fp32, bf16 = models
    lengths = [77, 128, 9, 100]
    ids = ids_of(4, 128, 1)
    real = padding_mask(lengths, 128, left)
    inputs = dict(input_ids=ids, attention_mask=real.long(), use_cache=False)
    ref = run_logits(fp32, BASELINE, **inputs)[real]
    theirs = rel_l2(run_logits(bf16, BASELINE, **inputs)[real], ref)
    ours = rel_l2(run_logits(bf16, FLASHCORE, **inputs)[real], ref)
    side = "left" if left else "right"
    print(f"{name} {side}-padded logits against fp32: flashcore {ours:.3e}, {BASELINE} {theirs:.3e}")
    assert ours <= 1.5 * theirs + 1e-3
    if left:
        # The padding must matter: without the mask the real rows see the padding keys
        # before them and are far off, so a run that ignored the mask could not pass.
        ignored = rel_l2(run_logits(bf16, FLASHCORE, input_ids=ids, use_cache=False)[real], ref)
        assert ignored > 5 * (1.5 * theirs + 1e-3)


@pytest.mark.parametrize("name", GENERATE)
def test_left_padded_greedy_generate_matches_each_prompt_alone(name):
    model = make_model(name, torch.bfloat16)
    lengths = [5, 17, 30, 12]
    prompts = [ids_of(1, n, 10 + i)[0] for i, n in enumerate(lengths)]
    width, new = max(lengths), 8
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device="cuda")
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[0] :] = p
    mask = padding_mask(lengths, width, left=True).long()
    gen = dict(max_new_tokens=new, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    model.set_attn_implementation(FLASHCORE)
    with torch.no_grad():
        batched = model.generate(input_ids=ids, attention_mask=mask, **gen)
    for i, p in enumerate(prompts):
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            alone = model.generate(input_ids=p[None], attention_mask=torch.ones_like(p[None]), **gen)
        ours, theirs = batched.sequences[i, width:], alone.sequences[0, p.shape[0] :]
        diverged = (ours != theirs).nonzero()
        if diverged.numel() == 0:
            continue
        t = diverged[0].item()
        sdpa_scores, our_scores = alone.scores[t][0].float(), batched.scores[t][i].float()
        top2 = sdpa_scores.topk(2).values
        margin, spread = (top2[0] - top2[1]).item(), (our_scores - sdpa_scores).abs().max().item()
        assert margin <= spread, f"{name} prompt {i} diverges at step {t}: SDPA's margin {margin:.3e} > the runs' difference {spread:.3e}"


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_training_step_with_padding(models, left):
    name, fp32, bf16 = models
    lengths = [64, 23, 50]
    ids = ids_of(3, 64, 2)
    mask = padding_mask(lengths, 64, left)
    labels = ids.masked_fill(~mask, -100)
    if left:
        # The loss's shift has the last padding row predict the first real token: that row
        # sees no key and its output is a convention (eager: the mean of every value;
        # FlashCore: 0), so its prediction is left out, as a collator leaves it out.
        labels[torch.arange(len(lengths)), 64 - torch.tensor(lengths)] = -100
    side = "left" if left else "right"
    check_training_step(f"{name} {side}-padded", fp32, bf16, FLASHCORE, BASELINE, input_ids=ids, attention_mask=mask.long(), labels=labels, use_cache=False)


def packed_inputs(lengths, seed):
    ids = ids_of(1, sum(lengths), seed)
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    labels = ids.clone()
    starts = torch.tensor([0] + lengths[:-1], device="cuda").cumsum(0)
    labels[0, starts] = -100  # as DataCollatorWithFlattening: no label across a boundary
    return ids, position_ids, labels


def test_training_step_with_packed_sequences(models):
    name, fp32, bf16 = models
    ids, position_ids, labels = packed_inputs([40, 70, 18], 3)
    check_training_step(f"{name} packed", fp32, bf16, FLASHCORE, BASELINE, input_ids=ids, position_ids=position_ids, labels=labels, use_cache=False)


def test_packed_logits_follow_the_sequences(models):
    name, fp32, bf16 = models
    lengths = [40, 70, 18]
    ids, position_ids, _ = packed_inputs(lengths, 4)
    inputs = dict(input_ids=ids, position_ids=position_ids, use_cache=False)
    ref = run_logits(fp32, BASELINE, **inputs)
    theirs = rel_l2(run_logits(bf16, BASELINE, **inputs), ref)
    ours_logits = run_logits(bf16, FLASHCORE, **inputs)
    ours = rel_l2(ours_logits, ref)
    print(f"{name} packed logits against fp32: flashcore {ours:.3e}, {BASELINE} {theirs:.3e}")
    assert ours <= 1.5 * theirs + 1e-3
    # The second sequence alone gives the same logits (its rows see nothing of the first).
    alone = run_logits(bf16, FLASHCORE, input_ids=ids[:, 40:110], use_cache=False)
    assert rel_l2(ours_logits[:, 40:110], alone) <= 1.5 * theirs + 1e-3 + 1e-2


def test_masks_flashcore_cannot_express_are_refused_by_name():
    q = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="attention_mask"):
        attention_forward(module, q, q, q, torch.ones(2, 1, 16, 16, dtype=torch.bool, device="cuda"))
    with pytest.raises(NotImplementedError, match="attention_mask"):
        attention_forward(module, q, q, q, torch.ones(2, 20, dtype=torch.bool, device="cuda"))  # not [B, Sk]
    with pytest.raises(ValueError, match="position_ids"):
        attention_forward(module, q[:1], q[:1], q[:1], None, position_ids=torch.arange(17, device="cuda")[None])
    with pytest.raises(ValueError, match="max_length_q"):
        cu = torch.tensor([0, 16], dtype=torch.int32, device="cuda")
        attention_forward(module, q[:1], q[:1], q[:1], None, cu_seq_lens_q=cu)


def test_padded_rows_give_zeros_and_real_rows_match_the_sequence_alone():
    """attention_forward on a padded batch (left and right padding) against each sequence
    alone through flash_attn_func, GQA and a window; padding rows are zero."""
    b, h, hkv, s, d = 3, 8, 2, 40, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(b, h, s, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    module = torch.nn.Module()
    for left in (False, True):
        lengths = [40, 7, 25]
        mask = padding_mask(lengths, s, left)
        out, _ = attention_forward(module, q, k, v, mask, is_causal=True, sliding_window=9)
        for i, n in enumerate(lengths):
            rows = slice(s - n, s) if left else slice(0, n)
            alone = flashcore.flash_attn_func(*(t[i : i + 1, :, rows].transpose(1, 2) for t in (q, k, v)), causal=True, window_size=(8, 0))
            assert rel_l2(out[i : i + 1, rows], alone) < 1e-2
            pad = slice(0, s - n) if left else slice(n, s)
            assert (out[i, pad] == 0).all()
