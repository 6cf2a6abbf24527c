"""Prompt lookup: copy what followed the most recent earlier occurrence of the context's last
n-gram (longest n first). No model at all; drafts are point masses."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Draft, DraftContext, Drafter
from quickdraft.errors import QuickdraftError
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise QuickdraftError(f"prompt lookup needs 1 <= min n-gram ({min_ngram}) <= max n-gram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._reset()

    def _reset(self) -> None:
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed = 0  # n-grams starting before this position are in the index

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self._reset()

    def _update_index(self, tokens: list[int]) -> None:
        # An n-gram enters the index once a token follows it, so the context's own suffix is never
        # matched with itself; later occurrences overwrite earlier ones (most recent wins).
        for start in range(self._indexed, len(tokens)):
            for n, table in self._index.items():
                if start + n < len(tokens):
                    table[tuple(tokens[start : start + n])] = start
        self._indexed = max(self._indexed, len(tokens) - self.max_ngram)

    def propose(
        self,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        sampler: TokenSampler,
        confidence_stop: float | None = None,
    ) -> Draft:
        source = self.find_source(tokens)
        return Draft([] if source is None else _copy_forward(tokens, source, k), None)

    def find_source(self, tokens: list[int]) -> int | None:
        """Where the copy starts: the position after the most recent earlier occurrence of the
        context's longest matching suffix n-gram, or None when nothing matches."""
        self._update_index(tokens)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = self._index[n].get(tuple(tokens[-n:]))
            if start is not None:
                return start + n
        return None

    @property
    def relative_cost_hint(self) -> float:
        return 0.0


def _copy_forward(tokens: list[int], source: int, k: int) -> list[int]:
    """k tokens copied from ``source`` on. A copy that reaches the end of the context continues
    from its own output: a match just before the suffix means a repeating pattern, so repeat it."""
    out: list[int] = []
    for i in range(k):
        j = source + i
        out.append(tokens[j] if j < len(tokens) else out[j - len(tokens)])
    return out
