"""The lossless core (Leviathan et al. 2022; Chen et al. 2023).

Given γ draft tokens and the target's distributions at the γ + 1 positions they fill:
- greedy: keep the longest prefix that equals the target's argmax, then the target's own token;
- sampling: accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
  draw from norm(max(0, p_i − q_i)); after full acceptance draw a bonus token from p_γ.
A drafter without a distribution (prompt lookup) drew from a point mass: q_i = one-hot(x_i).
- coupled sampling (quickdraft/randomness.py): the target's token at each position is drawn from
  p_i with the noise the drafter used there, and the greedy rule runs on those tokens
  (``verify_greedy(draft, target_tokens)``): output identical to seeded plain decoding.
"""

from __future__ import annotations

import torch

from quickdraft.randomness import MultinomialSampler, TokenSampler
from quickdraft.sampling import SamplingParams, sample


def verify_greedy(draft: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """target_argmax: the target's argmax (or coupled sample) at each of the len(draft) + 1 positions.

    Returns (number of draft tokens accepted, the target's token that follows them).
    """
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, target_argmax[n]


def verify_sampling(
    draft: list[int],
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """draft: γ tokens; q: [γ, vocab] the drafter's distributions (None: point masses);
    p: [γ + 1, vocab] the target's distributions. Returns (accepted count, next token)."""
    k = len(draft)
    if k:
        idx = torch.tensor(draft)
        rows = torch.arange(k)
        p_x = p[rows, idx]
        q_x = q[rows, idx] if q is not None else torch.ones(k)
        u = torch.rand(k, generator=generator)
        rejected = (u * q_x >= p_x).nonzero()  # accept iff u < p/q
        if len(rejected):
            i = int(rejected[0])
            if q is not None:
                residual = (p[i] - q[i]).clamp_(min=0)
            else:
                residual = p[i].clone()
                residual[draft[i]] = 0
            total = residual.sum()
            # total == 0 only when p_i <= q_i everywhere with p_i(x) < q_i(x), impossible for normalised
            # p and q; guard against rounding by falling back to p itself.
            return i, sample(residual / total if total > 0 else p[i], generator)
    return k, sample(p[k], generator)


def verify_step(
    draft: list[int],
    q: torch.Tensor | None,
    logits: torch.Tensor,
    p: torch.Tensor | None,
    sampling: SamplingParams,
    sampler: TokenSampler,
    first_position: int,
) -> tuple[int, int]:
    """One step's verification under the request's rule. logits [γ + 1, vocab] are the target's
    rows; p their probabilities under ``sampling`` (None when greedy); row r predicts sequence
    position ``first_position + r``. Greedy: argmax; coupled: the target's own sampled tokens;
    otherwise rejection sampling. Returns (accepted count, next token)."""
    if sampling.greedy:
        return verify_greedy(draft, logits.argmax(-1).tolist())
    assert p is not None
    if sampler.coupled:
        return verify_greedy(draft, sampler.draw_rows(p, first_position))
    assert isinstance(sampler, MultinomialSampler)
    return verify_sampling(draft, q, p, sampler.generator)
