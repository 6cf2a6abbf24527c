"""Where sampled tokens get their randomness: per request, or keyed by (seed, position).

Two token samplers implement one interface, ``draw(probs, position) -> token``:

- ``MultinomialSampler``: one ``torch.Generator`` per request, consumed in call order. The random
  numbers a step uses depend on how the step was cut (its draft length), so a seed reproduces
  its text only with the same γ schedule. Rejection sampling (``verify.verify_sampling``) needs it.
- ``CoupledSampler``: the coupled rule. Every position ``i`` of the sequence has its own noise
  vector ``E_i`` of independent Exp(1) variables, one per vocabulary entry, a pure function of
  (seed, i). A token is drawn by the exponential race ``argmax_v probs(v) / E_i(v)``.

Why the coupled rule is exact and reproducible
----------------------------------------------
1. Exponential race: for independent ``E(v) ~ Exp(1)``, ``E(v) / p(v) ~ Exp(p(v))``, and the
   smallest of independent exponentials is the one with rate ``p(v)`` with probability
   ``p(v) / Σ p = p(v)``. So ``argmax p(v) / E(v)`` is a sample from ``p`` (Gumbel-max in another
   form: ``-log E`` is Gumbel). Tokens with ``p(v) = 0`` (cut by top-k / top-p) never win.
2. The drafter draws its token at position ``i`` as ``d_i = argmax q_i / E_i`` and the target's token
   is ``t_i = argmax p_i / E_i`` with the *same* ``E_i``. Verification keeps the longest prefix with
   ``d_i = t_i`` and then emits ``t_n`` (the greedy rule applied to the target's sampled tokens).
   Every emitted token is therefore ``t_i``: the token that plain decoding with the same seed
   emits at position ``i`` given the same prefix. By induction over positions the whole output
   equals seeded plain decoding, whatever the drafter, γ, the step boundaries, a batch or the
   timing: those only change how many ``t_i`` one target call confirms.
3. ``E_i`` is independent of ``E_j`` for ``j < i`` and the prefix is a function of those, so
   ``t_i`` given the prefix follows ``p_i`` exactly (point 1): the output is a sample of the
   target's distribution.
The drafts agree with the target less often than under rejection sampling, whose acceptance
``Σ min(p, q)`` is the optimum; the Gumbel coupling reaches at least ``(1 − TV) / (1 + TV)``. On the
embedded pair at T = 0.8 (teacher-forced, 14 bench prompts × 64 tokens) the optimum is 0.756 and the
coupled rule 0.716 (BENCHMARKS.md has the bench's figures).

Bits: the noise is a counter-based function of (seed, position, token): a SplitMix64 hash gives a
uniform on a 2^-24 grid and a logarithm of single IEEE fp32 steps turns it into Exp(1), computed
by quickdraft's kernels or, with the same bits, by torch's elementwise ops; it is the same on every
machine and device. Output is reproduced bit for bit where the target's probabilities are (exact
mode); outside it, a ratio tied to the last bits may break differently. Before version 0.2.0 the
noise came from torch's generator: seeded texts of 0.1.x differ.
"""

from __future__ import annotations

import functools
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from quickdraft import kernels
from quickdraft.sampling import SamplingParams, coupled_race, inverse_cdf, sample

_MASK64 = (1 << 64) - 1
# SplitMix64: the state's step (the golden gamma) and the output mix's two multipliers.
_GOLDEN_GAMMA, _MIX_1, _MIX_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(x: int) -> int:
    x = (x + _GOLDEN_GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX_1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX_2) & _MASK64
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed for one (request seed, sequence position)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 1


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """E_position: ``vocab`` independent Exp(1) draws [vocab] (fp32, CPU), a pure function of its
    arguments: entry v is -ln(u) with u = (2k + 1) / 2^24, k the top 23 bits of SplitMix64's output
    for counter v + 1 from the key ``position_seed(seed, position)``. One native call where
    quickdraft's kernels run (~24 µs for 8,192 entries on an AVX2 CPU; torch's generator took ~45),
    else the same bits from torch's elementwise ops (``_noise_by_torch``)."""
    key = position_seed(seed, position)
    if kernels.available():
        return kernels.exponential_noise(torch.tensor([key]), vocab)[0]
    return _noise_by_torch(key, vocab)


def noise_rows(samplers: Sequence[CoupledSampler], positions: Sequence[int], vocab: int) -> torch.Tensor:
    """``torch.stack([s.noise(p, vocab) for s, p in zip(samplers, positions)])``, the rows no sampler
    holds yet drawn in one native call (32 rows of 8,192: 0.73 against 1.19 ms one call each),
    then kept by their samplers as ``noise`` keeps them."""
    missing = [i for i, (s, p) in enumerate(zip(samplers, positions)) if not s.holds(p, vocab)]
    if len(missing) > 1 and kernels.available():
        keys = torch.tensor([position_seed(samplers[i].seed, positions[i]) for i in missing])
        for i, row in zip(missing, kernels.exponential_noise(keys, vocab)):
            samplers[i].keep(positions[i], row)
    return torch.stack([s.noise(p, vocab) for s, p in zip(samplers, positions)])


def gumbel_rows(samplers: Sequence[CoupledSampler], positions: Sequence[int], vocab: int) -> torch.Tensor:
    """-log E of ``noise_rows``: the same races as ``draw``, as Gumbel-max noise (argmax of log q + g)
    for drafts that race logits instead of probabilities."""
    return noise_rows(samplers, positions, vocab).log_().neg_()


def _signed(x: int) -> int:
    """A 64-bit pattern as torch's int64 holds it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shifted_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """z >> bits as unsigned 64-bit arithmetic (torch's >> on int64 keeps the sign)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


# Cephes' logf: the polynomial's coefficients, highest power first, and ln 2 in two parts.
_LOG_POLYNOMIAL = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                   -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4


def _noise_by_torch(key: int, vocab: int) -> torch.Tensor:
    """``kernels.exponential_noise``'s row for ``key``, op for op (every step one fp32 multiply or add,
    no fused multiply-add), so both give the same bits."""
    z = torch.arange(1, vocab + 1, dtype=torch.int64) * _signed(_GOLDEN_GAMMA) + _signed(key)
    z = (z ^ _shifted_right(z, 30)) * _signed(_MIX_1)
    z = (z ^ _shifted_right(z, 27)) * _signed(_MIX_2)
    levels = _shifted_right(z ^ _shifted_right(z, 31), 41)
    u = (2 * levels + 1).float() * 2.0**-24
    mantissa, exponent = torch.frexp(u)  # u = m * 2^e, m in [0.5, 1)
    small = (mantissa < 0.707106781186547524).float()
    e = exponent.float() - small
    x = (mantissa + mantissa * small) - 1.0
    z2 = x * x
    f32 = functools.partial(torch.tensor, dtype=torch.float32)
    y = torch.full_like(x, _LOG_POLYNOMIAL[0])
    for c in _LOG_POLYNOMIAL[1:]:
        y = y * x + f32(c)
    y = (y * x) * z2
    y = y + e * f32(_LN2_LOW)
    y = y - z2 * f32(0.5)
    log_u = (x + y) + e * f32(_LN2_HIGH)
    return 0.0 - log_u


def fresh_seed() -> int:
    """A seed for a request that gave none: unseeded requests stay random."""
    return random.getrandbits(63)


class TokenSampler(ABC):
    coupled = False

    @abstractmethod
    def draw(self, probs: torch.Tensor, position: int) -> int:
        """One token from ``probs`` [vocab] for sequence position ``position``."""

    def forget_before(self, position: int) -> None:
        """Positions before ``position`` are committed: nothing will be drawn for them again."""


class MultinomialSampler(TokenSampler):
    """Draws in call order from one generator (the rejection-sampling rule's randomness)."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, probs: torch.Tensor, position: int) -> int:
        return sample(probs, self.generator)


class CoupledSampler(TokenSampler):
    """The exponential race over noise keyed by (seed, position); see the module docstring.

    A position's noise is drawn once and kept while later positions are drafted and verified
    (``forget_before`` drops what no step can read again)."""

    coupled = True

    def __init__(self, seed: int, top_p: float = 1.0) -> None:
        self.seed = seed
        self.top_p = top_p  # the target's nucleus, which ``target_tokens`` cuts
        self._noise: dict[int, torch.Tensor] = {}

    def noise(self, position: int, vocab: int) -> torch.Tensor:
        if not self.holds(position, vocab):
            self._noise[position] = position_noise(self.seed, position, vocab)
        return self._noise[position]

    def holds(self, position: int, vocab: int) -> bool:
        cached = self._noise.get(position)
        return cached is not None and cached.shape[0] == vocab

    def keep(self, position: int, noise: torch.Tensor) -> None:
        """``noise`` is this sampler's row for ``position`` (``noise_rows`` drew it with others)."""
        self._noise[position] = noise

    def draw(self, probs: torch.Tensor, position: int) -> int:
        noise = self.noise(position, probs.shape[-1]).to(probs.device)
        return int((probs.float() / noise).argmax())

    def gumbel(self, first_position: int, k: int, vocab: int) -> torch.Tensor:
        """-log E of positions first_position.. first_position + k - 1 [k, vocab]: the same races as
        ``draw``, as Gumbel-max noise (argmax of log q + g) for a draft drawn inside a native call."""
        return gumbel_rows([self] * k, range(first_position, first_position + k), vocab)

    def target_tokens(self, tempered: torch.Tensor, first_position: int) -> list[int]:
        """The target's token for each row of ``tempered`` [rows, vocab] (``tempered_probabilities``:
        before the nucleus, which the race cuts itself); row r is for ``first_position + r``."""
        vocab = tempered.shape[-1]
        noise = noise_rows([self] * tempered.shape[0], range(first_position, first_position + tempered.shape[0]), vocab)
        return coupled_race(tempered, noise, self.top_p).tolist()

    def forget_before(self, position: int) -> None:
        for stale in [p for p in self._noise if p < position]:
            del self._noise[stale]


def draw_batch(samplers: list[TokenSampler], probs: torch.Tensor, positions: list[int]) -> list[int]:
    """``samplers[i].draw(probs[i], positions[i])`` for every i, as few tensor calls as the rules
    allow: one race over the coupled rows, one inverse CDF over the others (each still drawing its
    uniform from its own generator, in its own order). Every token equals the one-at-a-time draw."""
    tokens = [0] * len(samplers)
    coupled = [i for i, s in enumerate(samplers) if s.coupled]
    others = [i for i, s in enumerate(samplers) if not s.coupled]
    vocab = probs.shape[-1]
    if coupled:
        noise = noise_rows([samplers[i] for i in coupled], [positions[i] for i in coupled], vocab)  # type: ignore[misc]
        for i, token in zip(coupled, (probs[coupled].float() / noise.to(probs.device)).argmax(-1).tolist()):
            tokens[i] = token
    if others:
        u = torch.cat([torch.rand(1, generator=samplers[i].generator) for i in others])  # type: ignore[attr-defined]
        for i, token in zip(others, inverse_cdf(probs[others], u.to(probs.device)).tolist()):
            tokens[i] = token
    return tokens


def coupled_target_tokens(samplers: list[CoupledSampler], tempered: torch.Tensor, positions: list[int]) -> list[int]:
    """``samplers[i].target_tokens(tempered[i:i + 1], positions[i])[0]`` for every row i, one race
    per top-p among the samplers."""
    tokens = [0] * len(samplers)
    vocab = tempered.shape[-1]
    by_top_p: dict[float, list[int]] = {}
    for i, s in enumerate(samplers):
        by_top_p.setdefault(s.top_p, []).append(i)
    for top_p, members in by_top_p.items():
        noise = noise_rows([samplers[i] for i in members], [positions[i] for i in members], vocab)
        rows = tempered if len(members) == len(samplers) else tempered[members]
        for i, token in zip(members, coupled_race(rows, noise, top_p).tolist()):
            tokens[i] = token
    return tokens


def sampler_for(sampling: SamplingParams) -> TokenSampler:
    """A request's sampler: the coupled rule's noise or a generator, from its seed (a fresh one
    when it gave none)."""
    seed = sampling.seed if sampling.seed is not None else fresh_seed()
    return CoupledSampler(seed, sampling.top_p) if sampling.coupled else MultinomialSampler(seed)
