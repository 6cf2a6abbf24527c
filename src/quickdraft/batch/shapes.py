"""The shapes of a batched step, and the probe that says which of them exact mode may mix.

A batched target forward is [S, R]: S sequences (a power of two, the running ones first) × R rows
(1 + the step's draft length, from ROW_BUCKETS). Exact mode needs a row's logits to be the same
bits whatever shape it was computed in, at whatever slot and row: then a request's output does not
depend on its neighbours, on when it joined, or on the γ of a step (batch invariance). Whether
kernels give that is a fact of the platform (CPU ISA, BLAS, dtype, threads), so it is probed on the
model itself, end to end, as ``exact.py`` probes the single-sequence bucket. Where the probe fails,
exact mode runs every step at one fixed shape (max batch × max rows), which is invariant by
construction and slower at low load.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from quickdraft.model.transformer import Transformer

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 3, 5, 9, 17)
MIN_WINDOW = 128


def window_bucket(needed: int, capacity: int) -> int:
    """The attention window of a step: the smallest power of two (>= MIN_WINDOW) covering every
    position that matters, capped at the capacity. Attention over the whole preallocated cache
    would cost a short sequence as much as the longest one the server allows."""
    w = MIN_WINDOW
    while w < needed:
        w *= 2
    return min(w, capacity)


def slot_bucket(n: int, max_batch: int) -> int:
    """The smallest power of two >= n, capped at max_batch."""
    s = 1
    while s < n:
        s *= 2
    return min(s, max_batch)


def row_bucket(rows: int, max_rows: int) -> int:
    """The smallest row bucket >= rows (and <= max_rows, which is itself a valid shape)."""
    if rows > max_rows:
        raise ValueError(f"{rows} rows exceed the step's maximum {max_rows}")
    return min(next((b for b in ROW_BUCKETS if b >= rows), max_rows), max_rows)


def all_shapes(max_batch: int, max_rows: int) -> list[tuple[int, int]]:
    slots = sorted({slot_bucket(n, max_batch) for n in range(1, max_batch + 1)})
    rows = sorted({row_bucket(r, max_rows) for r in range(1, max_rows + 1)})
    return [(s, r) for s in slots for r in rows]


_probe_cache: dict[tuple, bool] = {}


@torch.inference_mode()
def shapes_are_batch_invariant(model: Transformer, shapes: Sequence[tuple[int, int]], capacity: int) -> bool:
    """True when a sequence's logits are bit-identical in every shape of ``shapes`` and every
    attention window, at the first and the last slot, with 1 or 2 real rows, whatever the other
    slots and rows hold. Cached per
    platform, model shapes and capacity."""
    config = model.config
    key = (str(model.device), str(model.dtype), torch.get_num_threads(), config.n_layer, config.n_embd,
           config.n_head, config.n_kv_head, config.intermediate_size, config.vocab_size, capacity, tuple(shapes))
    if key in _probe_cache:
        return _probe_cache[key]
    generator = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    max_batch = max(s for s, _ in shapes)
    cache = model.new_cache(capacity, batch=max_batch)
    for tensors in (cache.keys, cache.values):
        for t in tensors:
            t.copy_(torch.randn(t.shape, generator=generator).to(t))
    saved = [t[0].clone() for t in (*cache.keys, *cache.values)]
    position = min(MIN_WINDOW // 2, capacity - 2 * max(r for _, r in shapes))
    probe_tokens = torch.randint(0, vocab, (2,), generator=generator)
    reference: dict[int, torch.Tensor] = {}
    invariant = True
    windows = sorted({window_bucket(w, capacity) for w in (MIN_WINDOW, capacity)} | {window_bucket(2 * MIN_WINDOW, capacity)})
    for (s, r), window in ((shape, w) for shape in shapes for w in windows):
        for slot in {0, s - 1}:
            for n in (1, 2):
                if n > r:
                    continue
                for t, original in zip((*cache.keys, *cache.values), saved):
                    t[slot].copy_(original)  # the probe sequence's own cache, the same in every run
                tokens = torch.randint(0, vocab, (s, r), generator=generator)
                positions = torch.randint(0, window - r, (s, 1), generator=generator) + torch.arange(r)
                tokens[slot, :n] = probe_tokens[:n]
                positions[slot] = torch.arange(position, position + r)
                logits = model.forward_batched(tokens, positions, cache.first(s), window=window)[slot, :n]
                if n not in reference:
                    reference[n] = logits
                elif not torch.equal(logits, reference[n]):
                    log.debug("shape (%d, %d) slot %d rows %d differs from the first shape", s, r, slot, n)
                    invariant = False
                    break
            if not invariant:
                break
        if not invariant:
            break
    _probe_cache[key] = invariant
    return invariant
