"""SamplingParams: what a request asks of sampling, validated. Apart from ``sampling`` (which turns
logits into probabilities with them) so that code that only carries parameters - the server's HTTP
process - does not import torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
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
# OpenAI's ranges: penalties in [-2, 2], a logit bias in [-100, 100] (±100 bans or forces a token).
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax), not "a very small temperature"
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None
    rule: str = "auto"  # one of SAMPLING_RULES
    # OpenAI's adjustments of the target's logits before everything above (quickdraft/logit_adjust.py):
    # token j's logit - frequency_penalty * c_j - presence_penalty * (c_j > 0) + logit_bias[j], where
    # c_j counts j among the tokens generated so far (not the prompt's).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), sorted; a mapping is accepted

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
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise SamplingParamsError(f"{name} must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value!r}")
        object.__setattr__(self, "logit_bias", _checked_logit_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE the distribution is a point mass in fp32 anyway (as in vLLM).
        return self.temperature < MIN_TEMPERATURE

    def check_vocabulary(self, vocab: int) -> None:
        """Raise when a biased token id is outside a vocabulary of ``vocab`` ids (the engine's, or the
        server's HTTP process before it queues the request)."""
        beyond = [token for token, _ in self.logit_bias if token >= vocab]
        if beyond:
            raise SamplingParamsError(f"logit_bias: token id {beyond[0]} is outside the vocabulary "
                                      f"(ids 0 to {vocab - 1})")

    @property
    def adjusts_logits(self) -> bool:
        """Whether a penalty or a logit bias changes the target's logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def coupled(self) -> bool:
        """Sampled tokens come from noise keyed by (seed, position) (see SAMPLING_RULES)."""
        return self.rule == "coupled" or (self.rule == "auto" and self.seed is not None)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _checked_logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """A logit bias as sorted (token id, bias) pairs, from a mapping or pairs; each id an integer
    >= 0 (the engine checks it against its vocabulary), each bias in [-100, 100]."""
    if isinstance(bias, Mapping):
        pairs = list(bias.items())
    elif isinstance(bias, (tuple, list)):
        pairs = list(bias)
    else:
        raise SamplingParamsError(f"logit_bias must map token ids to numbers, got {bias!r}")
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SamplingParamsError(f"logit_bias must map token ids to numbers, got {bias!r}")
        token, value = pair
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise SamplingParamsError(f"logit_bias: token ids must be integers >= 0, got {token!r}")
        if not _is_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise SamplingParamsError(f"logit_bias[{token}] must be a number in [-{MAX_LOGIT_BIAS:g}, "
                                      f"{MAX_LOGIT_BIAS:g}], got {value!r}")
        if token in out:
            raise SamplingParamsError(f"logit_bias: token {token} is given twice")
        out[token] = float(value)
    return tuple(sorted(out.items()))


GREEDY = SamplingParams()
