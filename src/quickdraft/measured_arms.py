"""A choice among a few ways of decoding, made by measuring them as decoding goes.

Each arm keeps decayed sums of the tokens its steps committed and the seconds they took; the arm
with the most tokens per second runs. Every arm is tried first; afterwards the least recently tried
one gets a step now and then, so a change in the text, the batch or the machine's load is noticed.
With ``max_explore_every`` above ``explore_every``, each such step that leaves the leader as it was
doubles the wait for the next (up to ``max_explore_every``), and a change of leader resets it: where
an exploring step costs more than its own step (the batch scheduler's drafting after plain steps pays
the draft's catch-up), a settled choice stops paying it every ``explore_every`` steps.
Used where a cost model alone can be wrong in ways only the clock shows: token trees against chains
(``tree_budget``) and the batch scheduler's speculation against plain batched decoding.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class MeasuredArms:
    def __init__(self, arms: Sequence[Hashable], *, first_tries: int = 2, explore_every: int = 32,
                 max_explore_every: int | None = None, decay: float = 0.9) -> None:
        self.arms = tuple(arms)
        self.first_tries, self.explore_every, self.decay = first_tries, explore_every, decay
        self.max_explore_every = max(explore_every, max_explore_every or explore_every)
        self.explore_wait = explore_every
        self.next_explore = explore_every - 1  # the step at which an arm other than the leader runs
        self._leader_before_exploring: Hashable | None = None
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
        leader = max(self.arms, key=lambda arm: self.rate(arm) * (weights[arm] if weights else 1.0))
        if self._leader_before_exploring is not None:  # the exploring step has been observed
            settled = leader == self._leader_before_exploring
            self.explore_wait = min(2 * self.explore_wait, self.max_explore_every) if settled else self.explore_every
            self.next_explore = self.steps + self.explore_wait - 1
            self._leader_before_exploring = None
        if self.steps >= self.next_explore:  # the next choose() sets the next one, from what this step showed
            self._leader_before_exploring = leader
            return min(self.arms, key=lambda arm: self.last_tried[arm])
        return leader

    @property
    def exploring(self) -> bool:
        """Whether the last ``choose()`` ran an arm to check the leader (until the next ``choose()``)."""
        return self._leader_before_exploring is not None

    def rate(self, arm: Hashable) -> float:
        """Tokens per second of ``arm``'s recent steps."""
        return self.tokens[arm] / self.seconds[arm] if self.seconds[arm] > 0 else 0.0

    def observe(self, arm: Hashable, tokens: int, seconds: float) -> None:
        self.tokens[arm] = self.decay * self.tokens[arm] + tokens
        self.seconds[arm] = self.decay * self.seconds[arm] + seconds
        self.tries[arm] += 1
        self.last_tried[arm] = self.steps
        self.steps += 1
