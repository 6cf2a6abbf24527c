"""Copy-augmented training windows (train/copy_augment.py): layout, determinism, and the repeat metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quickdraft.train.copy_augment import (
    MIN_SPAN,
    CopyAugmentedBatches,
    copy_window,
    edit_span,
    repeat_eval_windows,
    repeat_top1,
)

# Every token distinct and each the successor of the one before: a repeat in a window can only come
# from the copy, and "what followed the span" is visible as value + 1.
CORPUS = np.arange(30_000, dtype=np.uint16)


def longest_repeat(window: np.ndarray) -> tuple[int, int, int]:
    """(length, first start, second start) of the longest span that occurs twice in ``window``."""
    best = (0, 0, 0)
    positions: dict[int, list[int]] = {}
    for i, token in enumerate(window.tolist()):
        positions.setdefault(token, []).append(i)
    for occurrences in positions.values():
        for a, b in zip(occurrences, occurrences[1:]):
            length = 0
            while b + length < window.size and window[a + length] == window[b + length] and a + length < b:
                length += 1
            best = max(best, (length, a, b))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_unedited_window_repeats_a_span_then_continues_as_the_source_did(seed: int) -> None:
    window = copy_window(CORPUS, 257, np.random.default_rng(seed), edits_per_token=0.0)
    assert window.shape == (257,)
    length, first, second = longest_repeat(window)
    assert length >= MIN_SPAN
    end = second + length
    if end < window.size:  # after the copy: the corpus text that followed the span (its successor)
        assert int(window[end]) == int(window[first + length - 1]) + 1


def test_edits_change_a_few_tokens_and_keep_most_of_the_span() -> None:
    span = CORPUS[1000:1100]
    rng = np.random.default_rng(0)
    assert np.array_equal(edit_span(span, CORPUS, rng, 0.0), span)
    edited = [edit_span(span, CORPUS, np.random.default_rng(seed), 1 / 40) for seed in range(50)]
    assert any(not np.array_equal(e, span) for e in edited)
    for e in edited:
        kept = np.intersect1d(e, span).size
        assert kept >= span.size - 3 * 12  # Poisson(2.5) edits of at most 3 tokens each, with a wide margin


def test_batches_are_deterministic_and_hold_the_asked_share_of_copies() -> None:
    sampler = CopyAugmentedBatches(CORPUS, 0.5, seed=3)
    batch = sampler(7, 8, 128)
    assert batch.shape == (8, 129) and batch.dtype == torch.int64
    assert torch.equal(batch, CopyAugmentedBatches(CORPUS, 0.5, seed=3)(7, 8, 128))
    assert not torch.equal(batch, sampler(8, 8, 128))
    repeats = [longest_repeat(row.numpy())[0] >= MIN_SPAN for row in batch]
    assert repeats == [False] * 4 + [True] * 4  # corpus windows first, copy windows last
    assert torch.equal(CopyAugmentedBatches(CORPUS, 0.0, seed=3)(7, 8, 128)[:, 0],
                       CopyAugmentedBatches(CORPUS, 0.0, seed=3)(7, 8, 128)[:, 0])


def test_bad_settings_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="copy fraction"):
        CopyAugmentedBatches(CORPUS, 1.5, seed=0)
    with pytest.raises(ValueError, match="too small"):
        CopyAugmentedBatches(CORPUS[:1000], 0.5, seed=0)
    with pytest.raises(ValueError, match="too short"):
        CopyAugmentedBatches(CORPUS, 0.5, seed=0)(0, 2, 40)


class _Copier(torch.nn.Module):
    """Predicts, at every position, the token that followed the same position one span earlier."""

    def __init__(self, windows: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.windows, self.vocab = windows, vocab

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        span = self.windows.shape[1] // 2
        guess = torch.zeros_like(inputs)
        guess[:, span - 1:] = self.windows[:, : inputs.shape[1] - span + 1]
        return torch.nn.functional.one_hot(guess, self.vocab).float()


def test_repeat_metric_scores_a_perfect_copier_one_on_the_repeat_only() -> None:
    windows = repeat_eval_windows(CORPUS, 4, 32)
    assert windows.shape == (4, 64) and torch.equal(windows[:, :32], windows[:, 32:])
    scores = repeat_top1(_Copier(windows, int(CORPUS.max()) + 1), windows)
    assert scores["repeat_top1"] == 1.0
    assert scores["first_top1"] == 0.0


def test_a_span_recurs_up_to_three_times() -> None:
    counts = set()
    for seed in range(30):
        window = copy_window(CORPUS, 257, np.random.default_rng(seed), edits_per_token=0.0)
        length, first, _ = longest_repeat(window)
        head = window[first:first + MIN_SPAN]
        counts.add(sum(np.array_equal(window[i:i + MIN_SPAN], head) for i in range(window.size - MIN_SPAN + 1)))
    assert counts <= {2, 3, 4} and {2, 4} <= counts
