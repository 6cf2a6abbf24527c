"""Token trees: many candidate continuations verified by one target forward.

A tree's root is the last committed token; node i (0-based, parents before children) is a draft
token at depth ``depths[i]`` (1 = the root's children). The target scores the root and every node
in one forward: node i sits at sequence position ``len(committed) - 1 + depths[i]`` and attends to
the committed prefix and its own ancestors only (``ancestors``). A chain of γ drafts is the tree
whose node i has parent i - 1.

Children of one parent are kept in the order the drafter drew them: the lossless sampling rule
(``verify_tree``) tests siblings in that order, each against the drafter's distribution with the
earlier siblings removed (recursive rejection sampling without replacement).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from quickdraft.model.kv_cache import KVCache
    from quickdraft.model.transformer import Transformer

ROOT = -1


@dataclass
class TokenTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # ROOT for the root's children
    depths: list[int] = field(default_factory=list)
    # parent -> the drafter's distribution q [vocab] its children were drawn from, without
    # replacement, in index order. Absent: the children are point masses (greedy or copied drafts).
    child_q: dict[int, torch.Tensor] = field(default_factory=dict)
    forward_calls: int = 0  # drafter forward passes spent on this tree

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None, forward_calls: int = 0) -> TokenTree:
        """The width-1 tree of a chain draft; q [len(tokens), vocab] as a chain drafter returns it."""
        tree = cls(forward_calls=forward_calls)
        for i, token in enumerate(tokens):
            tree.add(token, i - 1)
        if q is not None:
            tree.child_q = {i - 1: q[i] for i in range(len(tokens))}
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        if parent != ROOT and not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} is not a node of this {len(self.tokens)}-node tree")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def ancestors(self) -> torch.Tensor:
        """[N, N] bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        seen = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                seen[i] = seen[parent]
            seen[i, i] = True
        return seen

    def subtree(self, keep: list[int]) -> tuple[TokenTree, list[int]]:
        """The tree of the nodes ``keep`` (closed under ancestors), renumbered in their order;
        returns it and, per new node, its index here."""
        keep = sorted(keep)
        new_index = {old: new for new, old in enumerate(keep)}
        tree = TokenTree(forward_calls=self.forward_calls)
        for old in keep:
            parent = self.parents[old]
            if parent != ROOT and parent not in new_index:
                raise ValueError(f"node {old} is kept without its parent {parent}")
            tree.add(self.tokens[old], ROOT if parent == ROOT else new_index[parent])
        tree.child_q = {ROOT if p == ROOT else new_index[p]: q for p, q in self.child_q.items()
                        if p == ROOT or p in new_index}
        return tree, keep


def tree_attention_mask(tree: TokenTree, prefix: int, window: int, rows: int | None = None) -> torch.Tensor:
    """[rows, window] bool for a forward whose row 0 is the root at slot ``prefix - 1`` (seeing
    slots [0, prefix)) and row 1 + i is node i at slot ``prefix + i`` (the prefix and its
    ancestors). Rows past the tree (padding to ``rows``) see the prefix, the tree and themselves:
    they only have to attend to something; their outputs are discarded."""
    n = len(tree)
    rows = rows or n + 1
    mask = torch.zeros(rows, window, dtype=torch.bool)
    mask[:, :prefix] = True
    mask[1 : n + 1, prefix : prefix + n] = tree.ancestors()
    for r in range(n + 1, rows):
        mask[r, : prefix + r] = True
    return mask


def tree_rows(root_token: int, root: int, tree: TokenTree, rows: int) -> tuple[list[int], list[int], list[int]]:
    """(tokens, positions, slots) of a target forward over a tree: the root token at slot and
    position ``root`` (the committed tokens before it in slots [0, root)), node i at slot
    root + 1 + i and position root + depth; ``rows`` - len(tree) - 1 padding rows after them."""
    n = len(tree) + 1
    tokens = [root_token, *tree.tokens] + [0] * (rows - n)
    positions = [root, *(root + d for d in tree.depths), *range(root + n, root + rows)]
    return tokens, positions, list(range(root, root + rows))


def run_tree(model: Transformer, root_token: int, root: int, tree: TokenTree, cache: KVCache, *,
             pad_to: int = 0) -> torch.Tensor:
    """The target's eager forward over a tree (``tree_rows``) -> logits [len(tree) + 1, vocab].
    ``pad_to`` > 0 (exact mode): that many rows attending over the whole cache with the slot-order
    attention, so every call has the same shapes and a row's bits do not depend on where its
    ancestors sit."""
    from quickdraft.model.transformer import attend_ordered, attend_sdpa

    n = len(tree) + 1
    if pad_to and n > pad_to:
        raise AssertionError(f"{n} rows exceed the exact-mode bucket {pad_to}")
    rows = pad_to or n
    tokens, positions, slots = tree_rows(root_token, root, tree, rows)
    device = model.device
    window = cache.capacity if pad_to else root + rows
    mask = tree_attention_mask(tree, root + 1, window, rows).to(device)
    logits = model.forward_tree(torch.tensor([tokens], device=device), torch.tensor(positions, device=device),
                                torch.tensor(slots, device=device), mask, cache,
                                attend=attend_ordered if pad_to else attend_sdpa)
    return logits[0, :n]
