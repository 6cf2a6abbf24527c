"""Copy-augmented training windows: teach the target to continue text it has already seen.

A model trained briefly on natural text does not copy its context (the embedded target, before
this existed: 30% top-1 on a span of code and 33% on the same span repeated verbatim right after
it). Editing, refactoring and retrieval-grounded answers repeat long spans of their input, and
that is where prompt lookup drafts well — if the target copies. Each augmented window is

    [natural text ending with span A] ([gap: 0..max_gap tokens from elsewhere] [A, lightly edited]) × 1..3
    [the text that followed A in the corpus]

so the cheapest way to predict its second half is to find the earlier occurrence of the current
context and continue from there (an induction head), also after an edit has broken the match.
The last part is what followed A originally: after the copy ends the model is rewarded for
continuing as the source did. Every window is a pure function of (seed, step, row).
"""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.train.common import batch_at, device_of

MIN_SPAN = 16
MAX_SPAN = 128


def edit_span(span: np.ndarray, tokens: np.ndarray, rng: np.random.Generator, edits_per_token: float) -> np.ndarray:
    """``span`` with a few runs of 1-3 tokens replaced by 0-4 tokens from elsewhere in ``tokens``."""
    n_edits = int(rng.poisson(edits_per_token * span.size))
    out = span.copy()
    for _ in range(n_edits):
        at = int(rng.integers(0, out.size))
        removed = int(rng.integers(1, 4))
        source = int(rng.integers(0, tokens.size - 4))
        inserted = np.asarray(tokens[source:source + int(rng.integers(0, 5))])
        out = np.concatenate([out[:at], inserted, out[at + removed:]])
    return out


def copy_window(tokens: np.ndarray, length: int, rng: np.random.Generator, *, max_gap: int = 16,
                edits_per_token: float = 1 / 40, max_repeats: int = 3) -> np.ndarray:
    """One window of ``length`` tokens in which a span of natural text recurs 1..max_repeats times."""
    repeats = int(rng.integers(1, max_repeats + 1))
    span_len = int(rng.integers(MIN_SPAN, max(MIN_SPAN, min(MAX_SPAN, (length - repeats * max_gap) // (repeats + 1))) + 1))
    lead = int(rng.integers(0, max(0, length - (repeats + 1) * span_len - repeats * max_gap) + 1))
    start = int(rng.integers(0, tokens.size - length - lead - span_len))
    before = np.asarray(tokens[start:start + lead + span_len])  # natural text ending with the span
    span = before[lead:]
    parts = [before]
    for _ in range(repeats):
        gap_start = int(rng.integers(0, tokens.size - max_gap))
        parts.append(np.asarray(tokens[gap_start:gap_start + int(rng.integers(0, max_gap + 1))]))
        parts.append(edit_span(span, tokens, rng, edits_per_token))
    parts.append(np.asarray(tokens[start + lead + span_len:start + lead + span_len + length]))  # what followed the span
    return np.concatenate(parts)[:length]


class CopyAugmentedBatches:
    """Each step: corpus windows, a ``copy_fraction`` of them replaced by copy windows."""

    def __init__(self, tokens: np.ndarray, copy_fraction: float, seed: int) -> None:
        if not 0.0 <= copy_fraction <= 1.0:
            raise ValueError(f"copy fraction {copy_fraction} must be in [0, 1]")
        if copy_fraction > 0 and tokens.size < 4 * (MAX_SPAN + 1024):
            raise ValueError(f"corpus of {tokens.size} tokens is too small for copy augmentation")
        self.tokens, self.copy_fraction, self.seed = tokens, copy_fraction, seed

    def __call__(self, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
        if seq_len < 2 * MIN_SPAN + 32:
            raise ValueError(f"seq_len {seq_len} is too short for copy windows (needs >= {2 * MIN_SPAN + 32})")
        n_copy = int(round(batch_size * self.copy_fraction))
        corpus = batch_at(self.tokens, step, batch_size - n_copy, seq_len, self.seed)
        if n_copy == 0:
            return corpus
        rng = np.random.default_rng([self.seed, step, 2])
        copies = np.stack([copy_window(self.tokens, seq_len + 1, rng) for _ in range(n_copy)]).astype(np.int64)
        return torch.cat([corpus, torch.from_numpy(copies)])


def repeat_eval_windows(tokens: np.ndarray, n_windows: int, span_len: int) -> torch.Tensor:
    """[n_windows, 2 * span_len] evenly spaced spans, each followed by itself verbatim."""
    starts = np.linspace(0, tokens.size - span_len - 1, n_windows).astype(np.int64)
    spans = np.stack([tokens[s:s + span_len] for s in starts]).astype(np.int64)
    return torch.from_numpy(np.concatenate([spans, spans], axis=1))


@torch.no_grad()
def repeat_top1(model: torch.nn.Module, windows: torch.Tensor) -> dict[str, float]:
    """Top-1 accuracy on a span's first occurrence and on its verbatim repeat (a copier scores near 1)."""
    span_len = windows.shape[1] // 2
    windows = windows.to(device_of(model))
    logits = model(windows[:, :-1])  # [n, 2 * span_len - 1, vocab]
    correct = (logits.argmax(-1) == windows[:, 1:]).float()
    return {"first_top1": float(correct[:, :span_len - 1].mean()), "repeat_top1": float(correct[:, span_len:].mean())}
