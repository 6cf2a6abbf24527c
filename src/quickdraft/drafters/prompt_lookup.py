"""Prompt lookup: copy what followed the most recent earlier occurrence of the context's last
n-gram (longest n first). No model at all; drafts are point masses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.drafters.base import Draft, DraftContext, Drafter
from quickdraft.errors import QuickdraftError
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams
from quickdraft.tree import ROOT, TokenTree

if TYPE_CHECKING:
    from quickdraft.drafters.trees import TreeShape

# Occurrences kept per n-gram: the sources of a tree's branches.
MATCHES_KEPT = 4


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise QuickdraftError(f"prompt lookup needs 1 <= min n-gram ({min_ngram}) <= max n-gram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._reset()

    def _reset(self) -> None:
        # n -> n-gram -> its most recent starts (the last one latest): a tree copies from several.
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(self.min_ngram, self.max_ngram + 1)
        }
        self._indexed = 0  # n-grams starting before this position are in the index

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self._reset()

    def _update_index(self, tokens: list[int]) -> None:
        # An n-gram enters the index once a token follows it, so the context's own suffix is never
        # matched with itself; later occurrences overwrite earlier ones (most recent wins).
        for start in range(self._indexed, len(tokens)):
            for n, table in self._index.items():
                if start + n < len(tokens):
                    starts = table.setdefault(tuple(tokens[start : start + n]), [])
                    if start not in starts:
                        starts.append(start)
                        del starts[:-MATCHES_KEPT]
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
        return next(iter(self.find_sources(tokens)), None)

    def find_sources(self, tokens: list[int]) -> list[int]:
        """Every copy start the index knows, best first: longer matching n-grams first, then the
        more recent occurrence."""
        self._update_index(tokens)
        sources: list[int] = []
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            for start in reversed(self._index[n].get(tuple(tokens[-n:]), [])):
                if start + n not in sources:
                    sources.append(start + n)
        return sources

    def propose_tree(self, tokens: list[int], shape: TreeShape, sampling: SamplingParams,
                     sampler: TokenSampler) -> TokenTree:
        """The trie of the copies from every known source, best first, ``shape.depth`` tokens each,
        until the budget is spent (siblings are distinct tokens: point masses to verify)."""
        tree = TokenTree()
        child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for source in self.find_sources(tokens):
            parent = ROOT
            for token in _copy_forward(tokens, source, shape.depth):
                node = child.get((parent, token))
                if node is None:
                    if len(tree) == shape.budget:
                        return tree
                    node = child[(parent, token)] = tree.add(token, parent)
                parent = node
        return tree

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
