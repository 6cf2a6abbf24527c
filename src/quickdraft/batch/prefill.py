"""Prefill of several sequences of a batch in few forwards.

Requests that join together (a burst of clients, a test's thousands of requests) sit in
consecutive slots. Their prompt chunks are fed as one [S, T] forward per run of consecutive slots
instead of one forward each: per-call overhead, not arithmetic, is what a short prompt costs. A
shorter chunk is padded with rows that continue its own positions: they write keys past its data,
which its own later rows overwrite before anything reads them (the cache's rollback invariant),
and the causal mask keeps them out of its real rows. The runs are cut where padding would cost
more rows than another forward (``prefill_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.batch.shapes import window_bucket
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.native import NATIVE_MAX_ROWS
from quickdraft.model.transformer import KERNEL_ATTENTION_ROWS, Transformer

GROUP_ROWS = 1024  # rows of one grouped prefill forward on the per-op path, outside exact mode
# What one more forward costs, in rows: the embedded target's native prefill ran [1, 8] in 1.24 ms
# and ~0.12 ms a row from 16 rows up (Zen 4), a call's fixed part ~3 rows; bursts of the load test's
# prompts took 0.91-0.94x round 35's time with 4, 0.92x with 8, 0.94x with 16
# (docs/bench/round36/prefill_groups_ab.py --call-rows N).
CALL_ROWS = 4


@dataclass
class PrefillChunk:
    slot: int
    tokens: list[int]
    start: int  # the sequence position of tokens[0]


def prefill_groups(chunks: list[PrefillChunk], max_rows: int, max_chunk: int, capacity: int) -> list[list[PrefillChunk]]:
    """Runs of consecutive slots, each fed as one padded [S, T] forward of at most ``max_rows`` rows
    inside the cache, that feed every chunk for the fewest rows: padded rows plus CALL_ROWS a
    forward (one pass of dynamic programming over the slots). A chunk longer than ``max_chunk``
    stays alone. Padding is arithmetic: a burst of 16 prompts of 10-25 tokens grouped whole ran ~30%
    padding rows."""
    ordered = sorted(chunks, key=lambda c: c.slot)
    n = len(ordered)
    # Plain lists and no builtins in the inner loop: a test's bursts of 256 two-token prompts grow
    # groups of hundreds, and this DP was ~10% of its batched run.
    slots = [c.slot for c in ordered]
    lengths = [len(c.tokens) for c in ordered]
    starts = [c.start for c in ordered]
    cost = [0.0] + [float("inf")] * n  # cost[i]: the cheapest grouping of the first i chunks
    first_of_last = [0] * (n + 1)  # where that grouping's last group starts
    for end in range(1, n + 1):
        best, best_begin = cost[end - 1] + CALL_ROWS + lengths[end - 1], end - 1  # the last chunk alone
        width, latest = lengths[end - 1], starts[end - 1]
        if width > max_chunk:
            cost[end], first_of_last[end] = best, best_begin
            continue
        for begin in range(end - 2, -1, -1):  # the group ordered[begin:end], grown leftwards
            length = lengths[begin]
            if slots[begin + 1] != slots[begin] + 1 or length > max_chunk:
                break
            if length > width:
                width = length
            if starts[begin] > latest:
                latest = starts[begin]
            rows = (end - begin) * width
            if rows > max_rows or latest + width > capacity:
                break
            total = cost[begin] + CALL_ROWS + rows
            if total < best:
                best, best_begin = total, begin
        cost[end], first_of_last[end] = best, best_begin
    groups: list[list[PrefillChunk]] = []
    end = n
    while end > 0:
        groups.append(ordered[first_of_last[end]:end])
        end = first_of_last[end]
    return groups[::-1]


def grouping(model: Transformer, exact: bool) -> tuple[int, int]:
    """(rows per grouped prefill forward, longest chunk grouped): groups that the native forward
    takes whole (its rows are invariant by construction, so exact mode may group them; a longer
    prompt goes alone, in native chunks). Without it, exact mode prefills every chunk alone, and
    other modes group up to GROUP_ROWS rows."""
    if model.native is not None:
        return NATIVE_MAX_ROWS, KERNEL_ATTENTION_ROWS
    if not exact:
        return GROUP_ROWS, GROUP_ROWS
    return 1, 0


def prefill(model: Transformer, cache: KVCache, chunks: list[PrefillChunk], max_rows: int, max_chunk: int) -> None:
    """Feed every chunk into its slot's cache entry (a lone chunk exactly as a single sequence's
    prefill: ``model.prefill(tokens, start, entry)``). No logits are computed."""
    for group in prefill_groups(chunks, max_rows, max_chunk, cache.capacity):
        if len(group) == 1:
            c = group[0]
            model.prefill(torch.tensor([c.tokens]), c.start, cache.entry(c.slot))
            continue
        width = max(len(c.tokens) for c in group)
        tokens = torch.tensor([c.tokens + [0] * (width - len(c.tokens)) for c in group])
        positions = torch.tensor([list(range(c.start, c.start + width)) for c in group])
        window = window_bucket(max(c.start for c in group) + width, cache.capacity)
        model.prefill_batched(tokens, positions, cache.entries(group[0].slot, group[-1].slot + 1), window=window)
