"""Exact mode: the fixed row count every target forward uses after prefill.

A matrix product over M rows may use a different kernel (and summation order) than one over M'
rows, and, for some M, rows in a partial tile are computed differently from rows in a full one.
A forward whose every linear layer gives each row the same bits wherever it sits among M rows,
for one fixed M, makes "the target alone" and "the target verifying" bit-identical. Which M have
that property is a fact of the platform (CPU ISA, BLAS, dtype), so it is probed, not assumed.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from quickdraft.model.transformer import Transformer

log = logging.getLogger(__name__)

MAX_PROBED_ROWS = 64


def rows_are_position_invariant(weight: torch.Tensor, rows: int, bias: torch.Tensor | None = None, seed: int = 0) -> bool:
    """True when F.linear gives one input row the same bits at every index among ``rows`` rows."""
    generator = torch.Generator().manual_seed(seed)
    n_in = weight.shape[1]
    probe = torch.randn(n_in, generator=generator).to(weight)
    reference = None
    for index in range(rows):
        x = torch.randn(rows, n_in, generator=generator).to(weight)
        x[index] = probe
        out = F.linear(x, weight, bias)[index]
        if reference is None:
            reference = out
        elif not torch.equal(out, reference):
            return False
    return True


def _linear_weights(model: Transformer) -> dict[tuple[int, int], torch.Tensor]:
    shapes: dict[tuple[int, int], torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            shapes.setdefault(tuple(module.weight.shape), module.weight)
    return shapes


def _platform_key(model: Transformer) -> tuple:
    """What a probe's answer depends on: device, dtype, thread count (BLAS picks different kernels
    and tilings for it) and the model's linear shapes."""
    return (str(model.device), str(model.dtype), torch.get_num_threads(), tuple(sorted(_linear_weights(model))))


_bucket_cache: dict[tuple, int | None] = {}


def exact_row_bucket(model: Transformer, min_rows: int) -> int | None:
    """The smallest M >= min_rows for which every linear shape of ``model`` is row-invariant on
    this platform, or None when no M up to MAX_PROBED_ROWS is. Cached per platform and shapes."""
    weights = _linear_weights(model)
    key = (*_platform_key(model), min_rows)
    if key not in _bucket_cache:
        with torch.inference_mode():
            _bucket_cache[key] = next(
                (
                    rows
                    for rows in range(min_rows, MAX_PROBED_ROWS + 1)
                    if all(rows_are_position_invariant(w, rows) for w in weights.values())
                ),
                None,
            )
        log.debug("exact-mode row bucket for %s: %s", key, _bucket_cache[key])
    return _bucket_cache[key]


_tree_cache: dict[tuple, bool] = {}


def tree_rows_match_chain(model: Transformer, rows: int, prefix: int = 40, capacity: int = 256, seed: int = 0) -> bool:
    """Exact mode's probe for token trees: every node of a random ``rows - 1``-node tree, verified
    in one exact-mode forward, gets the bits its path's tokens get fed as a chain (the same row
    count, the nodes at consecutive slots), i.e. the bits of plain exact decoding. Cached per
    platform, shapes and row count."""
    from quickdraft.tree import ROOT, TokenTree, run_tree

    key = (*_platform_key(model), rows)
    if key in _tree_cache:
        return _tree_cache[key]
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (prefix + 1,), generator=generator).tolist()
    tree = TokenTree()
    for i in range(rows - 1):
        parent = ROOT if i < 2 else int(torch.randint(-1, i, (), generator=generator))
        tree.add(int(torch.randint(0, vocab, (), generator=generator)), parent)
    capacity = max(capacity, prefix + 2 * rows)
    cache = model.new_cache(capacity)
    agree = True
    with torch.inference_mode():
        model(torch.tensor([tokens[:prefix]], device=model.device), 0, cache)
        tree_logits = run_tree(model, tokens[prefix], prefix, tree, cache, pad_to=rows)
        for node in range(len(tree)):
            path = tree.path(node)
            chain = TokenTree.chain([tree.tokens[i] for i in path])
            chain_logits = run_tree(model, tokens[prefix], prefix, chain, cache, pad_to=rows)
            if not torch.equal(chain_logits[len(path)], tree_logits[node + 1]):
                agree = False
                break
    _tree_cache[key] = agree
    log.debug("tree rows match chain rows for %s: %s", key, agree)
    return agree
