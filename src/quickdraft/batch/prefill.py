"""Prefill of several sequences of a batch in few forwards.

Requests that join together (a burst of clients, a test's thousands of requests) sit in
consecutive slots. Their prompt chunks are fed as one [S, T] forward per run of consecutive slots
instead of one forward each: per-call overhead, not arithmetic, is what a short prompt costs. A
shorter chunk is padded with rows that continue its own positions: they write keys past its data,
which its own later rows overwrite before anything reads them (the cache's rollback invariant),
and the causal mask keeps them out of its real rows. A group is formed only while padding wastes
at most about half its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.batch.shapes import window_bucket
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.native import NATIVE_MAX_ROWS
from quickdraft.model.transformer import KERNEL_ATTENTION_ROWS, Transformer

WASTE_SLACK = 64  # padding rows a group may always carry, beyond the 2x bound
GROUP_ROWS = 1024  # rows of one grouped prefill forward on the per-op path, outside exact mode


@dataclass
class PrefillChunk:
    slot: int
    tokens: list[int]
    start: int  # the sequence position of tokens[0]


def prefill_groups(chunks: list[PrefillChunk], max_rows: int, max_chunk: int, capacity: int) -> list[list[PrefillChunk]]:
    """Runs of consecutive slots whose padded [S, T] forward has at most ``max_rows`` rows, pads at
    most about as many rows as it feeds, and stays inside the cache. A chunk longer than
    ``max_chunk`` stays alone."""
    groups: list[list[PrefillChunk]] = []
    width = real = last_start = 0  # of the last group: its widest chunk, rows fed, latest start
    for chunk in sorted(chunks, key=lambda c: c.slot):
        group = groups[-1] if groups else None
        n = len(chunk.tokens)
        if group is not None and chunk.slot == group[-1].slot + 1 and n <= max_chunk and width <= max_chunk:
            grown, latest = max(width, n), max(last_start, chunk.start)
            padded = (len(group) + 1) * grown
            if padded <= max_rows and padded <= 2 * (real + n) + WASTE_SLACK and latest + grown <= capacity:
                group.append(chunk)
                width, real, last_start = grown, real + n, latest
                continue
        groups.append([chunk])
        width, real, last_start = n, n, chunk.start
    return groups


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
