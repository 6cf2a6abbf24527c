"""Our decoder against transformers as the oracle, on random tiny checkpoints of every architecture."""

from __future__ import annotations

import pytest
import torch

from hf_factory import ARCHITECTURES, make_hf_checkpoint
from quickdraft.model.loader import load_model

transformers = pytest.importorskip("transformers")
RTOL = 1e-4


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max())


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request, tmp_path_factory):
    path = make_hf_checkpoint(request.param, tmp_path_factory.mktemp(request.param), seed=7)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, reference, load_model(path).model


@torch.inference_mode()
def test_prefill_logits_match_transformers(pair):
    _, reference, ours = pair
    tokens = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(0))
    assert relative_error(ours(tokens), reference(tokens).logits) <= RTOL
    cache = ours.new_cache(64, batch=2)
    assert relative_error(ours(tokens, 0, cache), reference(tokens).logits) <= RTOL


@torch.inference_mode()
def test_cached_token_by_token_decode_matches_transformers(pair):
    _, reference, ours = pair
    tokens = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(1))
    expected = reference(tokens).logits[0]
    cache = ours.new_cache(32)
    ours(tokens[:, :10], 0, cache)
    for i in range(10, 30):
        step = ours(tokens[:, i : i + 1], i, cache)[0, 0]
        assert relative_error(step, expected[i]) <= RTOL, f"position {i}"


@torch.inference_mode()
def test_greedy_64_tokens_identical_to_transformers_generate(pair):
    arch, reference, ours = pair
    prompt = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    hf_ids = reference.generate(
        prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0, eos_token_id=None
    )[0, 12:].tolist()
    cache = ours.new_cache(80)
    logits = ours(prompt, 0, cache)[0, -1]
    generated = []
    for i in range(64):
        token = int(logits.argmax())
        generated.append(token)
        logits = ours(torch.tensor([[token]]), 12 + i, cache)[0, 0]
    assert generated == hf_ids, arch
