"""The induction bootstrap (train/induction.py): its windows, its metric, and its refusal of no work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quickdraft.train.induction import (
    MAX_PERIOD,
    MIN_PERIOD,
    induction_bootstrap,
    random_repeat_batch,
    random_repeat_window,
    repeat_accuracy,
)

CORPUS = np.arange(1000, 5000, dtype=np.uint16)


def period_of(window: np.ndarray) -> int:
    return next(p for p in range(1, window.size) if np.array_equal(window[p:], window[:-p]))


@pytest.mark.parametrize("seed", range(10))
def test_window_is_one_random_span_of_corpus_tokens_repeated(seed: int) -> None:
    window = random_repeat_window(CORPUS, 129, np.random.default_rng(seed))
    assert window.shape == (129,) and window.dtype == np.int64
    period = period_of(window)
    assert MIN_PERIOD <= period <= MAX_PERIOD
    assert set(window.tolist()) <= set(CORPUS.tolist())
    assert len(set(window[:period].tolist())) > period // 2  # drawn at random, not a corpus run


def test_batches_are_a_pure_function_of_seed_and_step() -> None:
    a = random_repeat_batch(CORPUS, 4, 65, seed=1, step=7)
    assert torch.equal(a, random_repeat_batch(CORPUS, 4, 65, seed=1, step=7))
    assert not torch.equal(a, random_repeat_batch(CORPUS, 4, 65, seed=1, step=8))


class _Copier(torch.nn.Module):
    """Predicts the token one period back (a perfect induction head), or a constant token."""

    def __init__(self, copy: bool) -> None:
        super().__init__()
        self.copy = copy

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, 5000)
        for row, window in enumerate(tokens):
            period = period_of(window.numpy())
            for t in range(tokens.shape[1]):
                guess = int(window[t + 1 - period]) if self.copy and t + 1 >= period else 0
                logits[row, t, guess] = 1.0
        return logits


def test_repeat_accuracy_scores_a_copier_one_and_a_constant_zero() -> None:
    windows = random_repeat_batch(CORPUS, 3, 129, seed=0, step=0)
    assert repeat_accuracy(_Copier(copy=True), windows) == 1.0  # type: ignore[arg-type]
    assert repeat_accuracy(_Copier(copy=False), windows) == 0.0  # type: ignore[arg-type]


def test_bootstrap_refuses_zero_steps() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        induction_bootstrap(_Copier(copy=True), CORPUS, 0, lr=1e-3, seed=0)  # type: ignore[arg-type]
