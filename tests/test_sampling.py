"""The nucleus (top-p) cut from a few candidates gives the full sort's probabilities, bit for bit."""

from __future__ import annotations

import pytest
import torch

from quickdraft import sampling
from quickdraft.sampling import SamplingParams, probabilities


def full_sort_reference(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """probabilities() as it was before the candidates: one full sort of every row."""
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
    drop[..., 0] = False
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs / probs.sum(-1, keepdim=True)


def rows_of_every_kind(vocab: int = 8192) -> torch.Tensor:
    """Peaked rows (nucleus in 128 candidates), middling ones (in 1,024) and flat ones (full sort)."""
    generator = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(6, vocab, generator=generator) * scale for scale in (12.0, 3.0, 0.05)])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.3, top_k=50, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.999),
    SamplingParams(temperature=1.0, top_p=1e-30),
])
def test_the_nucleus_from_candidates_equals_the_full_sort(params):
    logits = rows_of_every_kind()
    assert torch.equal(probabilities(logits, params), full_sort_reference(logits, params))
    assert torch.equal(probabilities(logits[3:9].reshape(2, 3, -1), params),
                       full_sort_reference(logits[3:9], params).reshape(2, 3, -1))


def test_every_stage_decides_some_rows(monkeypatch):
    """The rows above really reach each stage: the full sort runs for the flat ones only."""
    sorted_rows = []
    real_sort = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **k: sorted_rows.append(self.shape[0]) or real_sort(self, *a, **k))
    topk_sizes = []
    real_topk = torch.topk
    monkeypatch.setattr(sampling.torch, "topk", lambda x, k, **kw: topk_sizes.append((x.shape[0], k)) or real_topk(x, k, **kw))
    probabilities(rows_of_every_kind(), SamplingParams(temperature=1.0, top_p=0.95))
    assert topk_sizes == [(18, 128), (12, 1024)]
    assert sorted_rows == [6]
