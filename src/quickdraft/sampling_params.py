"""SamplingParams: what a request asks of sampling, validated. Apart from ``sampling`` (which turns
logits into probabilities with them) so that code that only carries parameters - the server's HTTP
process - does not import torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from quickdraft.errors import SamplingParamsError


MIN_TEMPERATURE = 1e-5
# How sampled drafts are verified (quickdraft/randomness.py has the rules and their proof):
# "coupled": draft and target race the same per-position noise; a seed reproduces its text whatever
#   γ, drafter, batch or timing, identical to seeded plain decoding.
# "rejection": min(1, p/q) acceptance, residual resampling (optimal acceptance; a seed reproduces
#   its text only with the same γ schedule).
# "auto": coupled when a seed is given (the seed's promise), rejection otherwise (measured: 0.716
#   vs 0.756 per-token acceptance on the embedded pair at T = 0.8).
SAMPLING_RULES = ("auto", "coupled", "rejection")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax), not "a very small temperature"
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None
    rule: str = "auto"  # one of SAMPLING_RULES

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingParamsError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise SamplingParamsError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise SamplingParamsError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.rule not in SAMPLING_RULES:
            raise SamplingParamsError(f"rule must be one of {', '.join(SAMPLING_RULES)}, got {self.rule!r}")

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE the distribution is a point mass in fp32 anyway (as in vLLM).
        return self.temperature < MIN_TEMPERATURE

    @property
    def coupled(self) -> bool:
        """Sampled tokens come from noise keyed by (seed, position) (see SAMPLING_RULES)."""
        return self.rule == "coupled" or (self.rule == "auto" and self.seed is not None)


GREEDY = SamplingParams()
