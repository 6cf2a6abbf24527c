"""A choice among a few ways of decoding, made by measuring them as decoding goes.

Each arm keeps decayed sums of the tokens its steps committed and the seconds they took; the arm
with the most tokens per second runs. Every arm is tried first; afterwards the least recently tried
one gets a step now and then, so a change in the text, the batch or the machine's load is noticed.
Used where a cost model alone can be wrong in ways only the clock shows: token trees against chains
(``tree_budget``) and the batch scheduler's speculation against plain batched decoding.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class MeasuredArms:
    def __init__(self, arms: Sequence[Hashable], *, first_tries: int = 2, explore_every: int = 32,
                 decay: float = 0.9) -> None:
        self.arms = tuple(arms)
        self.first_tries, self.explore_every, self.decay = first_tries, explore_every, decay
        self.tokens = {arm: 0.0 for arm in self.arms}
        self.seconds = {arm: 0.0 for arm in self.arms}
        self.tries = {arm: 0 for arm in self.arms}
        self.last_tried = {arm: -1 for arm in self.arms}
        self.steps = 0

    def choose(self, weights: dict[Hashable, float] | None = None) -> Hashable:
        """The arm for the next step: the best ``rate`` x ``weights[arm]`` (a caller whose arms
        report their efficiency against a model weighs each by the model's prediction)."""
        untried = [arm for arm in self.arms if self.tries[arm] < self.first_tries]
        if untried:
            return untried[0]
        if self.steps % self.explore_every == self.explore_every - 1:
            return min(self.arms, key=lambda arm: self.last_tried[arm])
        return max(self.arms, key=lambda arm: self.rate(arm) * (weights[arm] if weights else 1.0))

    def rate(self, arm: Hashable) -> float:
        """Tokens per second of ``arm``'s recent steps."""
        return self.tokens[arm] / self.seconds[arm] if self.seconds[arm] > 0 else 0.0

    def observe(self, arm: Hashable, tokens: int, seconds: float) -> None:
        self.tokens[arm] = self.decay * self.tokens[arm] + tokens
        self.seconds[arm] = self.decay * self.seconds[arm] + seconds
        self.tries[arm] += 1
        self.last_tried[arm] = self.steps
        self.steps += 1
