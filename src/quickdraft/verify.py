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

from quickdraft.randomness import CoupledSampler, MultinomialSampler, TokenSampler, coupled_target_tokens
from quickdraft.sampling import (SamplingParams, greedy_tokens, grouped_probabilities, inverse_cdf, probabilities,
                                 sample, tempered_probabilities)
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
    p: [γ + 1, vocab] the target's distributions. Returns (accepted count, next token).

    The γ + 1 uniforms are drawn at once: γ acceptance tests, then the final token's (inverse
    CDF). ``verify_sampling_batch`` computes the same, for many sequences at once."""
    k = len(draft)
    u = torch.rand(k + 1, generator=generator).to(p.device)
    if k:
        idx = torch.tensor(draft, device=p.device)
        rows = torch.arange(k, device=p.device)
        p_x = p[rows, idx]
        q_x = q[rows, idx] if q is not None else torch.ones(k, device=p.device)
        rejected = (u[:k] * q_x >= p_x).nonzero()  # accept iff u < p/q
        if len(rejected):
            i = int(rejected[0])
            if q is not None:
                residual = (p[i] - q[i]).clamp_(min=0)
            else:
                residual = p[i].clone()
                residual[draft[i]] = 0
            # residual == 0 only when p_i <= q_i everywhere with p_i(x) < q_i(x), impossible for
            # normalised p and q; guard against rounding by falling back to p itself.
            return i, int(inverse_cdf(residual if residual.sum() > 0 else p[i], u[k]))
    return k, int(inverse_cdf(p[k], u[k]))


def verify_sampling_batch(
    drafts: list[list[int]],
    qs: list[torch.Tensor | None],
    ps: list[torch.Tensor],
    generators: list[torch.Generator | None],
) -> list[tuple[int, int]]:
    """``verify_sampling`` for many sequences in one set of tensor calls (padded to the longest
    draft). Each sequence draws γ + 1 uniforms from its own generator (its acceptance tests', then
    its final token's), and every row is computed alone, so a sequence's result does not depend on
    the others. A point-mass draft is q = one-hot(x): the acceptance test is u < p(x), and the
    residual max(0, p − one-hot(x)) is p without x (p <= 1)."""
    batch, longest, vocab = len(drafts), max(len(d) for d in drafts), ps[0].shape[-1]
    device = ps[0].device
    lengths = torch.tensor([len(d) for d in drafts], device=device)
    rows = torch.arange(batch, device=device)
    u = torch.nn.utils.rnn.pad_sequence([torch.rand(len(d) + 1, generator=g) for d, g in zip(drafts, generators)],
                                        batch_first=True, padding_value=1.0).to(device)
    accept_u, final_u = u[:, :longest], u[rows, lengths]
    p = torch.nn.utils.rnn.pad_sequence(list(ps), batch_first=True)  # [B, longest + 1, vocab]
    q = torch.zeros(batch, longest + 1, vocab, device=device)
    drafted = [(b, q_b) for b, q_b in enumerate(qs) if drafts[b] and q_b is not None]
    if drafted:
        padded = torch.nn.utils.rnn.pad_sequence([q_b for _, q_b in drafted], batch_first=True)
        q[[b for b, _ in drafted], : padded.shape[1]] = padded.to(q)
    point = [(b, i, x) for b, q_b in enumerate(qs) if q_b is None for i, x in enumerate(drafts[b])]
    if point:
        q[[b for b, _, _ in point], [i for _, i, _ in point], [x for _, _, x in point]] = 1.0
    index = torch.tensor([d + [0] * (longest - len(d)) for d in drafts], device=device)[..., None]
    p_x = p[:, :longest].gather(2, index)[..., 0]
    q_x = q[:, :longest].gather(2, index)[..., 0]
    rejected = (accept_u * q_x >= p_x) & (torch.arange(longest, device=device) < lengths[:, None])  # accept iff u < p/q
    first = torch.where(rejected.any(1), rejected.int().argmax(1), lengths) if longest else lengths  # first rejection, or γ
    p_at = p[rows, first]
    # After full acceptance q's row is the zero padding and the residual is p_γ itself (the bonus).
    residual = (p_at - q[rows, first]).clamp_(min=0)
    weights = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)
    tokens = inverse_cdf(weights, final_u)
    return list(zip(first.tolist(), tokens.tolist()))


def target_probabilities(logits: torch.Tensor, sampling: SamplingParams, sampler: TokenSampler) -> torch.Tensor | None:
    """What verification reads of the target's rows ``logits`` [..., vocab]: nothing when greedy; the
    coupled rule's ``tempered_probabilities`` (its race cuts the nucleus itself); rejection
    sampling's ``probabilities``."""
    if sampling.greedy:
        return None
    return tempered_probabilities(logits, sampling) if sampler.coupled else probabilities(logits, sampling)


def grouped_target_probabilities(logits: list[torch.Tensor], samplings: list[SamplingParams],
                                 samplers: list[TokenSampler]) -> list[torch.Tensor | None]:
    """``target_probabilities`` of many sequences, one call per rule and sampling parameters."""
    out: list[torch.Tensor | None] = [None] * len(logits)
    for coupled, of in ((True, tempered_probabilities), (False, probabilities)):
        members = [i for i, s in enumerate(samplings) if not s.greedy and samplers[i].coupled == coupled]
        if members:
            for i, p in zip(members, grouped_probabilities([logits[i] for i in members],
                                                           [samplings[i] for i in members], of)):
                out[i] = p
    return out


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
    rows; p what ``target_probabilities`` gives of them (None when greedy); row r predicts sequence
    position ``first_position + r``. Greedy: argmax; coupled: the target's own sampled tokens;
    otherwise rejection sampling. Returns (accepted count, next token)."""
    if sampling.greedy:
        return verify_greedy(draft, greedy_tokens(logits).tolist())
    assert p is not None
    if isinstance(sampler, CoupledSampler):
        return verify_greedy(draft, sampler.target_tokens(p, first_position))
    assert isinstance(sampler, MultinomialSampler)
    return verify_sampling(draft, q, p, sampler.generator)


def _stacked_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """The members' rows in one tensor: a lone member's own (a lone sequence's step pays no copy)."""
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def verify_batch(
    drafts: list[list[int]],
    qs: list[torch.Tensor | None],
    logits: list[torch.Tensor],
    ps: list[torch.Tensor | None],
    samplings: list[SamplingParams],
    samplers: list[TokenSampler],
    first_positions: list[int],
) -> list[tuple[int, int]]:
    """``verify_step`` for every sequence of a batched step, one set of tensor calls per rule
    (greedy argmax, the coupled race, rejection sampling) instead of one per sequence. Each row is
    computed alone: a sequence's result is the one ``verify_step`` gives it by itself."""
    out: list[tuple[int, int]] = [(0, 0)] * len(drafts)
    greedy = [i for i, s in enumerate(samplings) if s.greedy]
    coupled = [i for i, s in enumerate(samplings) if not s.greedy and samplers[i].coupled]
    rejection = [i for i, s in enumerate(samplings) if not s.greedy and not samplers[i].coupled]

    def walk(members: list[int], target_tokens: list[int]) -> None:
        """The greedy rule on each member's rows of ``target_tokens`` (the members' rows in order)."""
        first = 0
        for i in members:
            out[i] = verify_greedy(drafts[i], target_tokens[first: first + len(drafts[i]) + 1])
            first += len(drafts[i]) + 1

    if greedy:
        walk(greedy, greedy_tokens(_stacked_rows([logits[i] for i in greedy])).tolist())
    if coupled:
        row_samplers = [samplers[i] for i in coupled for _ in range(len(drafts[i]) + 1)]
        positions = [first_positions[i] + r for i in coupled for r in range(len(drafts[i]) + 1)]
        walk(coupled, coupled_target_tokens(row_samplers, _stacked_rows([ps[i] for i in coupled]),  # type: ignore[misc]
                                            positions))
    if rejection:
        results = verify_sampling_batch([drafts[i] for i in rejection], [qs[i] for i in rejection],
                                        [ps[i] for i in rejection],  # type: ignore[misc]
                                        [samplers[i].generator for i in rejection])  # type: ignore[attr-defined]
        for i, result in zip(rejection, results):
            out[i] = result
    return out


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
    p what ``target_probabilities`` gives of them (None when greedy).

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
                assert p is not None and isinstance(sampler, CoupledSampler)
                token = sampler.target_tokens(p[row: row + 1], position)[0]
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
