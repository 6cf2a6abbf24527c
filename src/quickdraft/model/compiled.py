"""Compiled fixed-shape decode steps for a small model (the draft).

A draft model of a few million parameters is bound by per-op dispatch, not by its weights: its
eager 1-row forward is ~60 small ops. ``torch.compile`` of ``Transformer.forward_static`` fuses
them into one graph per (row count, cache capacity). Capacities are rounded up to powers of two so
a server sees a handful of graphs. Anything that cannot be compiled (no C++ compiler, an
unsupported op) falls back to the eager forward with one warning: drafts only change speed,
never the output, so a fallback is always safe.
"""

from __future__ import annotations

import logging

import torch

from quickdraft.model.kv_cache import KVCache
from quickdraft.model.transformer import Transformer

log = logging.getLogger(__name__)

MIN_STATIC_CAPACITY = 256


def static_capacity(needed: int) -> int:
    """The cache capacity to allocate: the next power of two >= ``needed``, at least 256."""
    capacity = MIN_STATIC_CAPACITY
    while capacity < needed:
        capacity *= 2
    return capacity


class CompiledSteps:
    """``run(tokens, start, cache)`` -> logits [T, vocab]: compiled for T <= ``max_rows``, eager
    (the ordinary forward, same cache) for longer inputs such as a prompt."""

    def __init__(self, model: Transformer, *, enabled: bool, max_rows: int = 2) -> None:
        self.model = model
        self.max_rows = max_rows
        self.enabled = enabled
        self._compiled = torch.compile(model.forward_static, dynamic=False, fullgraph=True) if enabled else None

    def prepare(self, cache: KVCache) -> None:
        """Build every graph for this cache now (each row count once, writing scratch slots from 0
        on that the caller's prefill overwrites), so no compilation lands inside a request's decode."""
        if not self.enabled:
            return
        self.model.prepare_static(cache.capacity)
        with torch.inference_mode():
            for rows in range(1, self.max_rows + 1):
                self.run([0] * rows, 0, cache)

    def run(self, tokens: list[int], start: int, cache: KVCache) -> torch.Tensor:
        x = torch.tensor([tokens], device=self.model.device)
        if self._compiled is not None and len(tokens) <= self.max_rows:
            positions = torch.arange(start, start + len(tokens), device=self.model.device)
            try:
                return self._compiled(x, positions, cache)[0]
            except Exception as exc:  # noqa: BLE001 - any compile failure: eager is always correct
                log.warning("compiling the draft model's steps failed (%s: %s); drafting eagerly",
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                self._compiled = None
                self.enabled = False
        return self.model(x, start, cache)[0]
