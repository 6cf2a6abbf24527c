"""``tree="auto"``: how many nodes to verify per step, chosen by measurement.

A tree's worth depends on two things a model cannot predict well here: how many more tokens its
extra nodes get accepted (the drafter's calibration on this text) and what the extra rows cost
(a GPU verifies 30 rows for the price of one; a CPU's compiled 1-row step streams the weights
and every extra row is compute). So the controller measures them (``measured_arms``): an arm is a
chain, whose γ the ``GammaController`` picks, or a tree of one of the budgets.
"""

from __future__ import annotations

from quickdraft.drafters.trees import TreeShape
from quickdraft.measured_arms import MeasuredArms

CHAIN = 0  # the arm that drafts a chain


class TreeBudgetController(MeasuredArms):
    """The chain (``CHAIN``) and a tree of each budget, measured (``MeasuredArms``)."""

    def __init__(self, budgets: tuple[int, ...], *, first_tries: int = 2, explore_every: int = 32,
                 decay: float = 0.9) -> None:
        super().__init__((CHAIN, *budgets), first_tries=first_tries, explore_every=explore_every, decay=decay)


class TreePlan:
    """What a request speculates with, step by step: ``next_shape()`` (None: a chain), then
    ``observe(tokens, seconds)`` with what the step committed and cost."""

    def __init__(self, shapes: dict[int, TreeShape], auto: bool) -> None:
        self.shapes = shapes
        self.controller = TreeBudgetController(tuple(sorted(shapes))) if auto else None
        self._arm = max(shapes)

    def next_shape(self) -> TreeShape | None:
        if self.controller is not None:
            self._arm = self.controller.choose()
        return self.shapes.get(self._arm)

    def observe(self, tokens: int, seconds: float) -> None:
        if self.controller is not None:
            self.controller.observe(self._arm, tokens, seconds)

    @property
    def largest(self) -> TreeShape:
        return self.shapes[max(self.shapes)]
