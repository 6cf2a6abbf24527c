"""Prompt lookup where the context has a match, a model drafter everywhere else.

Lookup's drafts cost nothing but are only as good as the text copies its context (input-grounded
work: edits, summaries, code rewritten); a model drafter pays a forward per drafted token but needs
no match. Each step, a sequence whose last LOOKUP_MIN_NGRAM or more tokens occurred earlier in its
context drafts with lookup when lookup's expected committed tokens per unit of step cost beat the
model's,

    E(α_lookup, k) / v  >=  E(α_model, k) / (v + k c),     E(α, k) = (1 − α^(k+1)) / (1 − α)

with α each drafter's per-token acceptance in this request so far (from a prior: for lookup, what it
measured in earlier requests with the same sampling settings, when there were any), c the model
drafter's step cost over the target's and v a verifying forward's over a 1-row step's (VERIFY_COST). Lookup's estimate
also learns on the model's steps, for free: where the context matched, what lookup would have
proposed is scored against the tokens the step committed (a shadow draft). Those tokens are the target's own output, greedy or sampled from p, so
lookup's token matches one exactly when the target would have accepted it (with probability p(token),
a point mass's acceptance under both sampling rules). A lookup that fails (sampled requests at a high
temperature) thus hands over to the model without spending target calls to find out, and one whose
copies start to fit (text that begins to repeat) takes over at once; round 30's retries of lookup
every 8 model steps had cost the embedded pair a tenth of its speedup at T = 0.8. The target verifies
whichever drafter proposed: lossless either way.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from quickdraft.acceptance_memory import AcceptanceMemory
from quickdraft.drafters.base import Draft, DraftContext, Drafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams

LOOKUP_MIN_NGRAM = 2  # a single repeated token is too weak a match to skip the model for
# Priors, as (accepted, rejections) pseudo-counts: α 2/3 for lookup, 3/4 for a model drafter.
LOOKUP_PRIOR = (2.0, 1.0)
MODEL_PRIOR = (3.0, 1.0)
# A verifying forward's cost in 1-row target steps, which both drafters' steps pay: 1.29-1.55 at γ 3-4
# on the bench's CPUs (round 30). Counted as 1, a self-draft (c ≈ 0.3) behind lookup handed 9% of its
# T = 0.8 steps to failing lookups. The engine's own v(γ) (``Engine._verify_cost``) was tried in round 31
# and not kept: timed on an empty cache before the first request (1.02-1.29 at γ 1-4), it is lower than
# decoding meets, and the rule using it was 4-8% slower at T = 0.8 in three paired runs.
VERIFY_COST = 1.4


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a k-token draft commits in expectation (the target's own included) at per-token acceptance α."""
    alpha = min(alpha, 0.999)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class AcceptanceEstimate:
    accepted: float
    rejections: float

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    def observe(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.rejections += accepted < drafted


def sampling_kind(sampling: SamplingParams) -> Hashable:
    """Requests on which lookup's point-mass drafts are accepted alike."""
    return None if sampling.greedy else (sampling.temperature, sampling.top_k, sampling.top_p)


class LookupOrModel:
    """One sequence's choice between prompt lookup and the model drafter, from how each has done."""

    def __init__(self, memory: AcceptanceMemory | None = None, kind: Hashable = None) -> None:
        self.memory, self.kind = memory, kind  # lookup's acceptance in earlier requests, per sampling kind
        remembered = memory.prior(kind) if memory is not None else None
        self.lookup = AcceptanceEstimate(*(remembered or LOOKUP_PRIOR))
        self.model = AcceptanceEstimate(*MODEL_PRIOR)
        self._shadow: tuple[int, list[int]] | None = None  # (position, lookup's tokens) of a model step

    def prefers_lookup(self, k: int, model_cost: float, verify_cost: float = VERIFY_COST) -> bool:
        """Whether lookup should draft the next k tokens (``score_shadow`` first, with the tokens
        committed since the last proposal)."""
        lookup_rate = expected_tokens(self.lookup.alpha, k) / verify_cost
        return lookup_rate >= expected_tokens(self.model.alpha, k) / (verify_cost + k * model_cost)

    def observe(self, by_lookup: bool, drafted: int, accepted: int) -> None:
        if by_lookup:
            self._observe_lookup(drafted, accepted)
        else:
            self.model.observe(drafted, accepted)

    def shadow(self, position: int, proposed: list[int]) -> None:
        """What lookup would have drafted at ``position`` on a step the model drafted."""
        self._shadow = (position, proposed) if proposed else None

    def score_shadow(self, tokens: list[int]) -> None:
        """Score the last model step's shadow draft, if any, against ``tokens`` (every committed token)."""
        if self._shadow is None:
            return
        position, proposed = self._shadow
        self._shadow = None
        committed = tokens[position : position + len(proposed)]
        matched = next((i for i, (a, b) in enumerate(zip(proposed, committed)) if a != b), len(committed))
        # Past the committed tokens nothing is known: a shadow that matched them all was not rejected.
        self._observe_lookup(len(committed), matched)

    def _observe_lookup(self, drafted: int, accepted: int) -> None:
        self.lookup.observe(drafted, accepted)
        if self.memory is not None:
            self.memory.count(self.kind, accepted, accepted < drafted)


class LookupThenModelDrafter(Drafter):
    def __init__(self, model: Drafter, max_ngram: int = 3) -> None:
        self.lookup = PromptLookupDrafter(max_ngram=max(max_ngram, LOOKUP_MIN_NGRAM), min_ngram=LOOKUP_MIN_NGRAM)
        self.model = model
        self.name = f"prompt-lookup+{model.name}"
        self.memory = AcceptanceMemory()
        self.choice: LookupOrModel | None = None  # the request's, made at its first proposal
        self._last: tuple[bool, int] | None = None  # (by lookup, tokens drafted) of the last proposal

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self.lookup.begin(prompt_ids, context)
        self.model.begin(prompt_ids, context)
        self.choice = None
        self._last = None

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, sampler: TokenSampler,
                confidence_stop: float | None = None) -> Draft:
        if self.choice is None:
            self.choice = LookupOrModel(self.memory, sampling_kind(sampling))
        self.choice.score_shadow(tokens)
        use_lookup = self.choice.prefers_lookup(k, self.model.relative_cost_hint)
        looked_up = self.lookup.propose(tokens, k, sampling, sampler)
        if use_lookup and looked_up.tokens:
            self._last = (True, len(looked_up.tokens))
            return looked_up
        draft = self.model.propose(tokens, k, sampling, sampler, confidence_stop)
        self.choice.shadow(len(tokens), looked_up.tokens)
        self._last = (False, len(draft.tokens))
        return draft

    def accept(self, n_accepted: int) -> None:
        assert self._last is not None and self.choice is not None, "propose() first"
        by_lookup, drafted = self._last
        self.choice.observe(by_lookup, drafted, n_accepted)
        (self.lookup if by_lookup else self.model).accept(n_accepted)

    @property
    def relative_cost_hint(self) -> float:
        return self.model.relative_cost_hint
