"""Growing a token tree from a drafting model (EAGLE-2's dynamic trees, with the one restriction
lossless sampling needs).

Depth by depth, the ``width`` nodes with the highest path probability (the product of the
drafter's probabilities from the root) are expanded: one drafter forward over all of them, then
``branching`` children each. Greedy and coupled drafts take each node's most likely children and,
once grown, keep the ``budget`` nodes of highest path probability (EAGLE-2's re-ranking). Rejection
sampling draws the children without replacement from q (Gumbel top-k) and keeps them all, up to
the budget: which nodes get children may depend on the nodes' own tokens, but how many children a
node keeps must not depend on the tokens drawn for them (``verify.verify_tree`` relies on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.randomness import CoupledSampler, MultinomialSampler, TokenSampler
from quickdraft.sampling import SamplingParams, probabilities
from quickdraft.tree import ROOT, TokenTree

if TYPE_CHECKING:
    from quickdraft.model.compiled import CompiledTreeSteps
    from quickdraft.model.kv_cache import KVCache
    from quickdraft.model.transformer import Transformer

# The budgets tree_nodes="auto" measures, besides chains (tree_budget.py).
AUTO_TREE_BUDGETS = (4, 8, 16)


@dataclass(frozen=True)
class TreeShape:
    budget: int  # nodes verified per step (the root excluded)
    depth: int  # the deepest node
    width: int  # nodes expanded per depth
    branching: int  # children per expanded node

    def __post_init__(self) -> None:
        for name in ("budget", "depth", "width", "branching"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QuickdraftError(f"tree {name} must be an integer >= 1, got {value!r}")

    @classmethod
    def for_budget(cls, budget: int, depth: int | None = None) -> TreeShape:
        """The default shape for a node budget: two nodes expanded per depth, two children each,
        as deep as half the budget (at least 1)."""
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise QuickdraftError(f"the tree budget must be an integer >= 1 (nodes per step), got {budget!r}")
        return cls(budget=budget, depth=depth or max(1, budget // 2), width=2, branching=2)

    @property
    def grown_nodes(self) -> int:
        """The most nodes growth creates before re-ranking (scratch slots a drafter may write)."""
        return self.branching + (self.depth - 1) * self.width * self.branching


Expand = Callable[[TokenTree, list[int]], torch.Tensor]


def grow_tree(
    root_logits: torch.Tensor,
    expand: Expand,
    shape: TreeShape,
    sampling: SamplingParams,
    sampler: TokenSampler,
    first_position: int,
) -> tuple[TokenTree, list[int]]:
    """A tree from a drafting model. ``root_logits`` [vocab] predict the root's children (sequence
    position ``first_position``); ``expand(tree, nodes)`` feeds those nodes (their ancestors already
    fed) and returns their logits [len(nodes), vocab]. Returns the tree and, per node, its index
    in the grown tree (the numbering ``expand`` saw): re-ranking drops and renumbers nodes."""
    rerank = sampling.greedy or sampler.coupled
    cap = shape.grown_nodes if rerank else shape.budget
    tree = TokenTree(forward_calls=1)
    scores: list[float] = []
    frontier, rows = [ROOT], root_logits[None]
    for depth in range(1, shape.depth + 1):
        created = []
        # One call for the whole frontier: log q when greedy, else q under the request's sampling.
        dists = torch.log_softmax(rows.float(), -1) if sampling.greedy else probabilities(rows, sampling)
        for parent, dist in zip(frontier, dists):
            room = cap - len(tree)
            if room <= 0:
                break
            tokens, log_q, q = _children(dist, min(shape.branching, room), sampling, sampler,
                                         first_position + depth - 1)
            if q is not None:
                tree.child_q[parent] = q
            base = scores[parent] if parent != ROOT else 0.0
            for token, score in zip(tokens, log_q):
                created.append(tree.add(token, parent))
                scores.append(base + score)
        if depth == shape.depth or not created or len(tree) >= cap:
            break
        frontier = sorted(created, key=lambda i: -scores[i])[: shape.width]
        rows = expand(tree, frontier)
        tree.forward_calls += 1
    if not rerank or len(tree) <= shape.budget:
        return tree, list(range(len(tree)))
    # A child's score never exceeds its parent's (log q <= 0; ties keep the lower index, the parent):
    # the best `budget` nodes include every kept node's ancestors.
    keep = sorted(range(len(tree)), key=lambda i: (-scores[i], i))[: shape.budget]
    return tree.subtree(keep)


def _children(
    dist: torch.Tensor, k: int, sampling: SamplingParams, sampler: TokenSampler, position: int,
) -> tuple[list[int], list[float], torch.Tensor | None]:
    """Up to k children of one node, for sequence position ``position``, from its distribution
    [vocab] (log q when greedy, else q): (tokens in drawing order, their log q, the q they were
    drawn from without replacement, or None when they are not a random draw)."""
    if sampling.greedy:
        top = dist.topk(k)
        return top.indices.tolist(), top.values.tolist(), None
    q = dist
    k = min(k, int(torch.count_nonzero(q)))
    if isinstance(sampler, CoupledSampler):
        # The target's token at this position is the race's winner argmax p / E: race q the same way.
        keys = q / sampler.noise(position, q.shape[-1]).to(q.device)
        top = keys.topk(k).indices
        log_q, drawn = q.index_select(0, top).log(), None
    else:
        assert isinstance(sampler, MultinomialSampler)
        # Gumbel top-k: the k largest log q − log E are k draws without replacement, in drawing order.
        noise = torch.empty_like(q).exponential_(generator=sampler.generator)
        log_q_all = q.log()
        top = (log_q_all - noise.log()).topk(k).indices
        log_q, drawn = log_q_all.index_select(0, top), q
    return top.tolist(), log_q.tolist(), drawn


def model_expansion(model: Transformer, cache: KVCache, base: int, vocab_limit: int, *,
                    steps: CompiledTreeSteps | None = None, exit_layer: int | None = None) -> Expand:
    """``grow_tree``'s ``expand`` for a model drafting into ``cache`` whose slots [0, base) hold the
    committed tokens (the root last): grown node j is fed at slot base + j and position
    base - 1 + its depth, through the compiled ``steps`` when given, else eagerly (``exit_layer``:
    the first layers only, early exit)."""

    def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        tokens = [tree.tokens[i] for i in nodes]
        positions = [base - 1 + tree.depths[i] for i in nodes]
        slots = [base + i for i in nodes]
        mask = tree_mask_rows(tree, nodes, base)
        if steps is not None:
            return steps.run(tokens, positions, slots, mask, cache)[:, :vocab_limit]
        device = model.device
        logits = model.forward_tree(torch.tensor([tokens], device=device), torch.tensor(positions, device=device),
                                    torch.tensor(slots, device=device), mask.to(device), cache, exit_layer=exit_layer)
        return logits[0, :, :vocab_limit]

    return expand


def tree_mask_rows(tree: TokenTree, nodes: list[int], prefix: int) -> torch.Tensor:
    """[len(nodes), prefix + len(tree)] bool: each node sees slots [0, prefix) and the slots
    ``prefix + j`` of its ancestors j and itself (a drafter's layout of the grown tree)."""
    mask = torch.zeros(len(nodes), prefix + len(tree), dtype=torch.bool)
    mask[:, :prefix] = True
    mask[:, prefix:] = tree.ancestors()[nodes]
    return mask
