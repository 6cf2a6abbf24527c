"""Token trees: structure, greedy verification, the KV compaction, and the lossless sampling rule.

The sampling tests decode with bigram models (the target's and the drafter's logits depend on the
last token only), so the tree loop runs with no forward passes: ``grow_tree`` grows the tree from
the draft bigram, ``verify_tree`` verifies it against the target bigram, and the first three tokens
of 10,000 runs per configuration are compared with the target's exact joint distribution by the
chi-square test of test_sampling_exact. A rule that accepts the first sibling whose p ≥ q fails it.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import quickdraft.verify as verify_module
from quickdraft.drafters.trees import TreeShape, grow_tree
from quickdraft.model.kv_cache import KVCache
from quickdraft.randomness import sampler_for
from quickdraft.sampling import GREEDY, SamplingParams, probabilities
from quickdraft.tree import ROOT, TokenTree, tree_attention_mask
from quickdraft.tree_budget import CHAIN, TreeBudgetController
from quickdraft.verify import target_probabilities, verify_tree
from test_sampling_exact import ALPHA, chi_square_p

VOCAB = 12
N_SAMPLES = 10_000
# temperature, top-k, top-p, tree (budget, depth, width, branching), rule
CONFIGS = [
    (1.0, 0, 1.0, (6, 3, 2, 2), "rejection"),
    (0.5, 5, 1.0, (4, 2, 1, 3), "rejection"),
    (1.5, 0, 0.8, (8, 3, 2, 3), "rejection"),
    (1.0, 5, 0.8, (3, 3, 1, 1), "rejection"),  # the chain as a width-1 tree
    (0.8, 0, 1.0, (6, 3, 2, 2), "coupled"),
    (1.2, 5, 0.9, (5, 3, 1, 2), "coupled"),
]


def small_tree() -> TokenTree:
    """   root
         /    \\
        a(0)   b(1)
       /  \\      \\
     c(2) d(3)   e(4)
      |
     f(5)"""
    tree = TokenTree()
    for token, parent in [(10, ROOT), (11, ROOT), (12, 0), (13, 0), (14, 1), (15, 2)]:
        tree.add(token, parent)
    return tree


def test_tree_structure_depths_paths_and_ancestors():
    tree = small_tree()
    assert tree.depths == [1, 1, 2, 2, 2, 3]
    assert tree.path(5) == [0, 2, 5] and tree.path(4) == [1, 4]
    assert tree.children(ROOT) == [0, 1] and tree.children(0) == [2, 3]
    seen = tree.ancestors()
    assert seen[5].tolist() == [True, False, True, False, False, True]
    assert seen[4].tolist() == [False, True, False, False, True, False]
    sub, kept = tree.subtree([0, 2, 5, 1])
    assert kept == [0, 1, 2, 5] and sub.parents == [ROOT, ROOT, 0, 2] and sub.tokens == [10, 11, 12, 15]
    with pytest.raises(ValueError, match="without its parent"):
        tree.subtree([2])


def test_attention_mask_lets_each_node_see_the_prefix_and_its_ancestors_only():
    tree = small_tree()
    mask = tree_attention_mask(tree, prefix=4, window=16, rows=9)  # root at slot 3, node i at 4 + i
    assert mask[0].nonzero().ravel().tolist() == [0, 1, 2, 3]
    assert mask[1 + 5].nonzero().ravel().tolist() == [0, 1, 2, 3, 4, 6, 9]  # f: a, c, itself
    assert mask[1 + 4].nonzero().ravel().tolist() == [0, 1, 2, 3, 5, 8]  # e: b, itself
    assert mask[8].nonzero().ravel().tolist() == list(range(12))  # a padding row: causal


def test_greedy_tree_verification_walks_the_targets_argmax():
    tree = small_tree()
    logits = torch.zeros(7, 20)
    # the target wants a (10) after the root, then d (13), then 7 after d
    for row, token in [(0, 10), (1, 13), (1 + 3, 7)]:
        logits[row, token] = 1.0
    path, nxt = verify_tree(tree, logits, None, GREEDY, sampler_for(GREEDY), first_position=5)
    assert (path, nxt) == ([0, 3], 7)
    logits[0] = 0
    logits[0, 3] = 1.0  # no child of the root is 3
    assert verify_tree(tree, logits, None, GREEDY, sampler_for(GREEDY), 5) == ([], 3)


def test_compaction_moves_the_accepted_path_behind_the_prefix():
    cache = KVCache(2, 1, 4, 16)
    for layer in range(2):
        cache.keys[layer][0, 0] = torch.arange(16.0)[:, None] + 100 * layer
        cache.values[layer][0, 0] = -torch.arange(16.0)[:, None]
    cache.compact([6, 9, 11], 5)
    assert cache.keys[1][0, 0, 5:8, 0].tolist() == [106.0, 109.0, 111.0]
    assert cache.values[0][0, 0, 4:9, 0].tolist() == [-4.0, -6.0, -9.0, -11.0, -8.0]


def bigram(seed: int, scale: float) -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


TARGET, DRAFT = bigram(1, 1.5), bigram(2, 1.5)
PROMPT_TOKEN = 3


def tree_decode(params: SamplingParams, shape: TreeShape, seed: int, n_tokens: int = 3) -> list[int]:
    """Speculative decoding with trees on the bigram pair, as the engine's tree step runs it."""
    sampling = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed, rule=params.rule)
    sampler = sampler_for(sampling)
    tokens = [PROMPT_TOKEN]
    while len(tokens) <= n_tokens:
        tree, _ = grow_tree(DRAFT[tokens[-1]], lambda t, nodes: DRAFT[[t.tokens[i] for i in nodes]], shape,
                            sampling, sampler, len(tokens))
        logits = torch.stack([TARGET[tokens[-1]], *(TARGET[t] for t in tree.tokens)])
        path, nxt = verify_tree(tree, logits, target_probabilities(logits, sampling, sampler), sampling, sampler,
                                len(tokens))
        tokens += [tree.tokens[i] for i in path] + [nxt]
        sampler.forget_before(len(tokens))
    return tokens[1 : n_tokens + 1]


def target_joint(params: SamplingParams) -> np.ndarray:
    p = probabilities(TARGET, params).double().numpy()  # [previous, next]
    return p[PROMPT_TOKEN][:, None, None] * p[:, :, None] * p[None, :, :]


def fit(params: SamplingParams, shape: TreeShape, n: int) -> float:
    samples = np.array([tree_decode(params, shape, seed) for seed in range(n)])
    counts = np.zeros((VOCAB,) * 3)
    np.add.at(counts, tuple(samples.T), 1)
    joint = target_joint(params)
    p_values = [chi_square_p(counts, joint, n)]
    for position in range(3):
        axes = tuple(a for a in range(3) if a != position)
        p_values.append(chi_square_p(counts.sum(axis=axes), joint.sum(axis=axes), n))
    return min(p_values)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,tree,rule", CONFIGS)
def test_tree_sampling_follows_the_target_distribution(temperature, top_k, top_p, tree, rule):
    params = SamplingParams(temperature, top_k, top_p, rule=rule)
    assert fit(params, TreeShape(*tree), N_SAMPLES) > ALPHA


def test_the_sampling_test_rejects_accepting_the_first_sibling_whose_p_beats_q(monkeypatch):
    """Power: a plausible wrong rule (take the first sibling with p(x) ≥ q(x), else sample the
    target) over-produces the drafter's favourites, and the same test sees it."""

    def first_sibling_with_p_at_least_q(siblings, q, p, generator):
        for i, x in enumerate(siblings):
            if q is None or float(p[x]) >= float(q[x]):
                return i, x
        return None, int(torch.multinomial(p, 1, generator=generator))

    monkeypatch.setattr(verify_module, "_test_siblings", first_sibling_with_p_at_least_q)
    params = SamplingParams(1.0, 0, 1.0, rule="rejection")
    assert fit(params, TreeShape(6, 3, 2, 2), N_SAMPLES // 4) < ALPHA


def test_rejection_trees_keep_every_drawn_child_and_coupled_trees_rerank():
    """The restriction lossless sampling puts on growth: with rejection sampling, no node's number
    of children depends on the tokens drawn for them (every drawn child is kept, up to the budget);
    greedy and coupled trees keep the budget's most probable nodes."""
    shape = TreeShape(budget=6, depth=4, width=2, branching=2)
    for rule in ("rejection", "coupled"):
        sampling = SamplingParams(1.0, seed=0, rule=rule)
        sampler = sampler_for(sampling)
        tree, grown = grow_tree(DRAFT[0], lambda t, nodes: DRAFT[[t.tokens[i] for i in nodes]], shape, sampling,
                                sampler, 1)
        assert len(tree) == 6
        if rule == "rejection":
            assert grown == list(range(6)) and set(tree.child_q) == {ROOT, *(p for p in tree.parents if p != ROOT)}
            assert all(len(tree.children(p)) == 2 for p in set(tree.parents))
        else:
            assert len(set(grown)) == 6 and not tree.child_q


def test_auto_budget_tries_every_arm_then_runs_the_fastest_and_still_explores():
    controller = TreeBudgetController((4, 8), first_tries=1, explore_every=5)
    speed = {CHAIN: 100.0, 4: 300.0, 8: 200.0}  # tokens per second of each arm
    chosen = []
    for _ in range(20):
        arm = controller.choose()
        chosen.append(arm)
        controller.observe(arm, tokens=3, seconds=3 / speed[arm])
    assert chosen[:3] == [CHAIN, 4, 8]
    assert chosen[3:].count(4) >= 13  # the fastest runs, but for the exploration steps
    assert {CHAIN, 8} <= set(chosen[3:])  # the others are measured again now and then
