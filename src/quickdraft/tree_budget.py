"""``tree="auto"``: how many nodes to verify per step, chosen by measurement.

A tree's worth depends on two things a model cannot predict well here: how many more tokens its
extra nodes get accepted (the drafter's calibration on this text) and what the extra rows cost
(a GPU verifies 30 rows for the price of one; a CPU's compiled 1-row step streams the weights
and every extra row is compute). So the controller measures them: each arm (a chain, whose γ the
``GammaController`` picks, or a tree of one of the budgets) keeps decayed sums of the tokens its
steps committed and the seconds they took, and the arm with the most tokens per second runs.
Every arm is tried first; afterwards the least recently tried one gets a step now and then, so a
change in the text (or in the machine's load) is noticed.
"""

from __future__ import annotations

from quickdraft.drafters.trees import TreeShape

CHAIN = 0  # the arm that drafts a chain


class TreeBudgetController:
    def __init__(self, budgets: tuple[int, ...], *, first_tries: int = 2, explore_every: int = 32,
                 decay: float = 0.9) -> None:
        self.arms = (CHAIN, *budgets)
        self.first_tries, self.explore_every, self.decay = first_tries, explore_every, decay
        self.tokens = {arm: 0.0 for arm in self.arms}
        self.seconds = {arm: 0.0 for arm in self.arms}
        self.tries = {arm: 0 for arm in self.arms}
        self.last_tried = {arm: -1 for arm in self.arms}
        self.steps = 0

    def choose(self) -> int:
        """The arm for the next step: CHAIN, or a tree's node budget."""
        untried = [arm for arm in self.arms if self.tries[arm] < self.first_tries]
        if untried:
            return untried[0]
        if self.steps % self.explore_every == self.explore_every - 1:
            return min(self.arms, key=lambda arm: self.last_tried[arm])
        return max(self.arms, key=self.rate)

    def rate(self, arm: int) -> float:
        """Tokens per second of ``arm``'s recent steps."""
        return self.tokens[arm] / self.seconds[arm] if self.seconds[arm] > 0 else 0.0

    def observe(self, arm: int, tokens: int, seconds: float) -> None:
        self.tokens[arm] = self.decay * self.tokens[arm] + tokens
        self.seconds[arm] = self.decay * self.seconds[arm] + seconds
        self.tries[arm] += 1
        self.last_tried[arm] = self.steps
        self.steps += 1


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
