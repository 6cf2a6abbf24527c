"""The nucleus (top-p) cut from each row's largest tokens gives the full sort's probabilities, bit
for bit, ties included (broken by token id): in Python and in the native kernel alike."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from quickdraft import kernels, sampling
from quickdraft.sampling import SamplingParams, coupled_race, nucleus_kept, probabilities, tempered_probabilities


@pytest.fixture(params=["python", "native"])
def nucleus_path(request, monkeypatch):
    """Each equality test runs on the Python cut and on the native one (where the kernels build)."""
    if request.param == "python":
        monkeypatch.setattr(kernels, "available", lambda: False)
    elif not kernels.available():
        pytest.skip("quickdraft's CPU kernels are not available here")
    return request.param


@pytest.fixture
def python_path(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)


def full_sort_reference(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """probabilities() by one stable full sort of every row."""
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
    drop[..., 0] = False
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs / probs.sum(-1, keepdim=True)


def rows_of_every_kind(vocab: int = 8192) -> torch.Tensor:
    """Peaked rows (a nucleus of a few tokens), middling and flat ones (most of the vocabulary),
    and the same rows rounded to bf16, whose many tied values straddle the cut."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.randn(4, vocab, generator=generator) * scale for scale in (12.0, 3.0, 1.0, 0.05)])
    return torch.cat([rows, rows.bfloat16().float()])


PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.3, top_k=50, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.999),
    SamplingParams(temperature=1.0, top_p=0.99999),  # top_p + margin above any float sum of 1
    SamplingParams(temperature=1.0, top_p=1e-30),
]


@pytest.mark.parametrize("vocab", [8192, 12])  # a small vocabulary is sorted whole
@pytest.mark.parametrize("params", PARAMS)
def test_the_nucleus_from_the_largest_tokens_equals_the_full_sort(params, vocab, nucleus_path):
    logits = rows_of_every_kind(vocab)
    assert torch.equal(probabilities(logits, params), full_sort_reference(logits, params))
    assert torch.equal(probabilities(logits[3:9].reshape(2, 3, -1), params),
                       full_sort_reference(logits[3:9], params).reshape(2, 3, -1))


@pytest.mark.parametrize("params", PARAMS[:3])
def test_a_row_whose_candidates_fall_short_is_sorted_whole(monkeypatch, params, python_path):
    """The fallback gives the same bits: here every row takes it (no candidate at all)."""
    monkeypatch.setattr(sampling, "_smallest_with_exponent", lambda exponent: float("inf"))
    logits = rows_of_every_kind()
    assert torch.equal(probabilities(logits, params), full_sort_reference(logits, params))


def test_a_peaked_row_sorts_a_few_tokens_not_the_vocabulary(monkeypatch, python_path):
    sorted_sizes = []
    real_sort = torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **k: sorted_sizes.append(self.numel()) or
                        real_sort(self, *a, **k))
    logits = rows_of_every_kind()
    probabilities(logits[:4], SamplingParams(temperature=1.0, top_p=0.95))
    assert len(sorted_sizes) == 4 and max(sorted_sizes) < 64
    sorted_sizes.clear()
    probabilities(logits[12:16], SamplingParams(temperature=1.0, top_p=0.95))  # flat: most of the row
    assert min(sorted_sizes) > 4096


@pytest.mark.parametrize("vocab", [8192, 12])
@pytest.mark.parametrize("params", PARAMS + [SamplingParams(temperature=0.9)])
def test_the_coupled_race_is_the_race_over_the_nucleus(params, vocab):
    """coupled_race (native where the kernels build: the whole row's winner checked against the
    nucleus) gives the token of the plain definition, the first maximum of nucleus_kept(p) / E, on
    rows of every kind, ties straddling the cut included, for many noise draws."""
    logits = rows_of_every_kind(vocab)
    tempered = tempered_probabilities(logits, params)
    generator = torch.Generator().manual_seed(1)
    for _ in range(25):
        noise = torch.empty_like(tempered).exponential_(generator=generator)
        kept = tempered if params.top_p >= 1.0 else nucleus_kept(tempered, params.top_p)
        assert torch.equal(coupled_race(tempered, noise, params.top_p), (kept / noise).argmax(-1))


def test_the_coupled_race_draws_from_the_renormalised_nucleus():
    """Chi-square: the race's tokens over many noise draws follow probabilities() (temperature, top-k
    and top-p, renormalised), and no token past the nucleus is ever drawn."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -9.0]])
    for params in (SamplingParams(temperature=0.8, top_p=0.8), SamplingParams(temperature=1.2, top_k=5, top_p=0.9)):
        p = probabilities(logits, params)[0]
        n = 20_000
        noise = torch.empty(n, 8).exponential_(generator=torch.Generator().manual_seed(3))
        tokens = coupled_race(tempered_probabilities(logits, params).expand(n, -1).contiguous(), noise, params.top_p)
        counts = torch.bincount(tokens, minlength=8).double()
        support = p > 0
        assert counts[~support].sum() == 0
        expected = p[support].double() / p[support].double().sum() * n
        assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 0.001
