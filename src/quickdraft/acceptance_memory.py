"""What earlier requests measured, as the prior of the next one of their kind: decayed counts of
accepted drafted tokens and of rejections per kind of request (auto γ's per drafter; prompt lookup's
in front of a model drafter)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quickdraft.engine import GammaController

# A new request's acceptance estimate starts from what earlier requests of its kind measured, worth
# this many observations; the memory forgets slowly.
PRIOR_WEIGHT = 3.0
MEMORY_DECAY = 0.99


class AcceptanceMemory:
    """What earlier requests of a kind (greedy, coupled or rejection-rule sampling) measured with one
    drafter: decayed counts of accepted drafted tokens and of rejections, and the last draft-step cost
    ratios c and f. A new request's controller starts from them, the acceptance worth PRIOR_WEIGHT
    observations, instead of the fixed prior (α = 2/3) and the drafter's cost hint, which were most of
    a short request's life (32-token requests in a batch: goodput planned with the prior for most of
    their steps, and chose plain decoding for a third of them). Only speed follows: every γ gives the
    same output where outputs are promised (greedy in exact mode, coupled sampling)."""

    def __init__(self) -> None:
        self.counts: dict[Hashable, list[float]] = {}  # kind -> decayed [accepted tokens, rejections]
        self.costs: dict[Hashable, float] = {}  # kind -> the last controller's c
        self.fixed_costs: dict[Hashable, float] = {}  # kind -> its f (a draft call's cost beyond its steps)

    def count(self, kind: Hashable, accepted: int, rejected: bool) -> None:
        counts = self.counts.setdefault(kind, [0.0, 0.0])
        counts[0] = MEMORY_DECAY * counts[0] + accepted
        counts[1] = MEMORY_DECAY * counts[1] + rejected

    def prior(self, kind: Hashable) -> tuple[float, float] | None:
        """(accepted, rejections) pseudo-counts worth PRIOR_WEIGHT observations at the kind's remembered
        acceptance, or None before anything of the kind was counted."""
        counts = self.counts.get(kind)
        if counts is None or sum(counts) == 0:
            return None
        alpha = counts[0] / sum(counts)
        return PRIOR_WEIGHT * alpha, PRIOR_WEIGHT * (1 - alpha)

    def seed(self, controller: GammaController) -> None:
        prior = self.prior(controller.kind)
        if prior is not None:
            controller.accepts, controller.rejects = prior
        if controller.kind in self.costs:
            controller.cost = self.costs[controller.kind]
            controller.fixed_cost = self.fixed_costs.get(controller.kind, 0.0)
