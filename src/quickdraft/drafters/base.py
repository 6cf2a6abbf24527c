"""The drafter protocol.

The engine calls ``begin`` once per request, then per step ``propose(tokens, k, ...)`` with every
committed token so far, then ``accept(n)`` with how many of the proposed tokens the target kept.
A drafter returns the exact distribution q each token was drawn from, or ``q=None`` when it drew
from a point mass (argmax drafts, prompt lookup).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from quickdraft.model.kv_cache import KVCache
from quickdraft.model.transformer import Transformer
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams, greedy_tokens, probabilities, top_probability
from quickdraft.tree import TokenTree

if TYPE_CHECKING:
    from quickdraft.logit_adjust import LogitAdjuster
    from quickdraft.drafters.trees import TreeShape


@dataclass
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), vocab], or None for point masses
    forward_calls: int = 0  # drafter forward passes spent on this proposal
    # of the proposal's time, what went to feeding tokens the drafter fell behind on (the prompt, or
    # the tokens of plain steps between drafts): a cost of its own, not of the draft's steps
    catch_up_seconds: float = 0.0
    # each drafted token's step time, when the drafter times its steps apart (one native call): the
    # first step's time also holds what the call costs whatever its length, which auto γ plans apart
    step_seconds: list[float] | None = None


@dataclass
class DraftContext:
    """What a drafter may use from the request: the target (early exit shares its cache)."""

    target: Transformer
    target_cache: KVCache
    capacity: int
    vocab_limit: int
    tree_width: int | None = None  # nodes expanded per depth when the request speculates with trees
    # the request's penalties and logit bias (the engine's own adjuster, counting its committed tokens):
    # a model drafter's chains adjust their logits the same way
    adjuster: LogitAdjuster | None = None


class Drafter(ABC):
    name: str = "drafter"

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        """Start a new request."""

    @abstractmethod
    def propose(
        self,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        sampler: TokenSampler,
        confidence_stop: float | None = None,
    ) -> Draft:
        """Up to k tokens to follow ``tokens`` (all committed tokens, prompt included).

        A sampled draft token for sequence position ``len(tokens) + i`` is drawn by
        ``sampler.draw(q, len(tokens) + i)`` (the coupled rule needs the position).
        ``confidence_stop``: stop early when the drafter's top probability falls below it.
        """

    def accept(self, n_accepted: int) -> None:
        """The target kept the first ``n_accepted`` proposed tokens; forget the rest."""

    def propose_tree(self, tokens: list[int], shape: TreeShape, sampling: SamplingParams,
                     sampler: TokenSampler) -> TokenTree:
        """A tree of at most ``shape.budget`` nodes to follow ``tokens`` (``propose``'s contract per
        node: a sampled child is drawn for its sequence position). A drafter without trees of its
        own proposes the chain of ``propose``, ``shape.depth`` tokens long."""
        draft = self.propose(tokens, min(shape.depth, shape.budget), sampling, sampler)
        return TokenTree.chain(draft.tokens, draft.q, draft.forward_calls)

    def accept_path(self, path: list[int]) -> None:
        """The target kept the tree nodes ``path`` (the root's child first); forget the rest."""
        self.accept(len(path))

    @property
    def relative_cost_hint(self) -> float:
        """A prior for c = drafter step time / target step time, refined by measurement."""
        return 0.1


def draft_autoregressively(
    logits: torch.Tensor,
    step: Callable[[int], torch.Tensor],
    k: int,
    sampling: SamplingParams,
    sampler: TokenSampler,
    first_position: int,
    confidence_stop: float | None,
    adjust: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
) -> Draft:
    """Draw up to k tokens from a model: ``logits`` [vocab] predict the first, at sequence position
    ``first_position``; ``step(token)`` feeds a drawn token and returns the logits for the next. Each token is drawn from exactly the
    q it is returned with (the argmax, a point mass, when greedy); the coupled rule's tokens are its
    race's, returned without q. ``adjust(logits, drafted so far)``: the request's penalties and logit
    bias (``LogitAdjuster.row``), applied before each draw. ``forward_calls`` counts the
    calls of ``step`` plus one for the caller's first forward."""
    drafted: list[int] = []
    qs: list[torch.Tensor] = []
    calls = 1
    for i in range(k):
        if adjust is not None:
            logits = adjust(logits, drafted)
        if i > 0 and confidence_stop is not None and top_probability(logits) < confidence_stop:
            break
        if sampling.greedy:
            token = int(greedy_tokens(logits))
        elif sampler.coupled:
            # The coupled rule verifies without q: the draft races its untruncated softmax over the
            # position's noise, as the native and batched drafts do (one Gumbel-max, no truncation:
            # 137 against ~40 us a position on a 12-token model; a token outside the target's
            # nucleus is only ever rejected).
            gumbel = sampler.gumbel(first_position + i, 1, logits.shape[-1])[0]  # type: ignore[attr-defined]
            token = int((logits.float() / sampling.temperature + gumbel.to(logits.device)).argmax())
        else:
            q = probabilities(logits, sampling)
            token = sampler.draw(q, first_position + i)
            qs.append(q)
        drafted.append(token)
        if i < k - 1:
            logits = step(token)
            calls += 1
    return Draft(drafted, torch.stack(qs) if qs else None, calls)
