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
from quickdraft.sampling import SamplingParams, greedy_tokens, sample
from quickdraft.tree import ROOT, TokenTree


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
        return verify_greedy(draft, greedy_tokens(logits).tolist())
    assert p is not None
    if sampler.coupled:
        return verify_greedy(draft, sampler.draw_rows(p, first_position))
    assert isinstance(sampler, MultinomialSampler)
    return verify_sampling(draft, q, p, sampler.generator)


def verify_tree(
    tree: TokenTree,
    logits: torch.Tensor,
    p: torch.Tensor | None,
    sampling: SamplingParams,
    sampler: TokenSampler,
    first_position: int,
) -> tuple[list[int], int]:
    """One tree step's verification. logits [N + 1, vocab]: row 0 is the root's (it predicts
    position ``first_position``), row 1 + i node i's (position ``first_position + depths[i]``);
    p their probabilities under ``sampling`` (None when greedy).

    Greedy and coupled: walk from the root to the child whose token is the target's own (argmax, or
    the coupled rule's sample at that position) while one exists, as ``verify_greedy`` does along a
    chain. Rejection sampling: at each node the children are tested in the order they were drawn,
    by recursive rejection sampling without replacement (Jeon et al. 2024, "Recursive Speculative
    Decoding"; SpecInfer's multi-step speculative sampling with draws without replacement): child x
    drawn from q_i (the drafter's q without the earlier siblings, renormalised) is accepted with
    probability min(1, p_i(x) / q_i(x)); on rejection p_{i+1} = norm(max(0, p_i − q_i)). p_i(x) < q_i(x)
    at a rejection, so p_{i+1} gives x no mass, matching q_{i+1}, which cannot draw it again. Each
    test is one single-draft rejection step between p_i and q_i, so the token leaving a node follows
    p exactly (Leviathan et al.'s lemma, applied once per sibling); when every child is rejected,
    the token is drawn from the last residual. Point-mass children (q absent) are the case
    q_i = one-hot(x): accept with probability p_i(x), else p_{i+1} = p_i without x.

    Returns (the accepted nodes from the root down, the target's token that follows them)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    path: list[int] = []
    node = ROOT
    while True:
        row = node + 1
        position = first_position + (tree.depths[node] if node != ROOT else 0)
        kids = children.get(node, [])
        if sampling.greedy or sampler.coupled:
            if sampling.greedy:
                token = int(greedy_tokens(logits[row]))
            else:
                assert p is not None
                token = sampler.draw(p[row], position)
            nxt = next((kid for kid in kids if tree.tokens[kid] == token), None)
        else:
            assert p is not None and isinstance(sampler, MultinomialSampler)
            nxt, token = _test_siblings([tree.tokens[k] for k in kids], tree.child_q.get(node), p[row],
                                        sampler.generator)
            nxt = None if nxt is None else kids[nxt]
        if nxt is None:
            return path, token
        path.append(nxt)
        node = nxt


def _test_siblings(
    siblings: list[int], q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None,
) -> tuple[int | None, int]:
    """Recursive rejection sampling over ``siblings`` (drawn in this order without replacement from
    q, or point masses when q is None) against p [vocab]: (the accepted sibling's index, its token),
    or (None, a token from the final residual)."""
    q_left = None if q is None else q.clone()
    for i, x in enumerate(siblings):
        if q_left is None:
            q_x = 1.0
        else:
            q_left /= q_left.sum()
            q_x = float(q_left[x])
        if float(torch.rand((), generator=generator)) * q_x < float(p[x]):
            return i, x
        if q_left is None:
            residual = p.clone()
            residual[x] = 0
        else:
            residual = (p - q_left).clamp_(min=0)
            q_left[x] = 0
        total = residual.sum()
        # total == 0 needs p == q_i, under which x would have been accepted; guard against rounding.
        p = residual / total if total > 0 else p
    return None, sample(p, generator)
