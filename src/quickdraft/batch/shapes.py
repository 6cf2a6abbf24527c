"""The shapes of a batched step, and the probe that says which of them exact mode may mix.

A batched target forward is [S, R]: S sequences (a power of two, the running ones first) × R rows
(1 + the step's draft length, from ROW_BUCKETS). Exact mode needs a row's logits to be the same
bits whatever shape it was computed in, at whatever slot and row: then a request's output does not
depend on its neighbours, on when it joined, or on the γ of a step (batch invariance). Whether
kernels give that is a fact of the platform (CPU ISA, BLAS, dtype, threads), so it is probed on the
model itself, end to end, as ``exact.py`` probes the single-sequence bucket: exact mode uses only
the shapes whose bits agree with the largest one (at worst that one shape, max batch × max rows,
invariant by construction and slower at low load). Measured here (AMD EPYC Zen 4, 1 thread): the
embedded target agrees in every shape in bf16; in fp32 a one-row product differs from M >= 4 rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from quickdraft.model.transformer import Transformer

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 3, 4, 5, 9, 17)
# A lone sequence's step also takes every row count up to this, unpadded as the single-sequence engine
# verifies: padded to 9 rows (each row past ~6 costs compute here), a sampled request's drafts of 5-8 tokens
# paid for 9 rows and goodput kept γ near 3. Every count 1-9 raised its tokens a call 2.53 -> 2.85 and its
# speed 0.87 -> 0.91x of the single-sequence engine (docs/bench/round40/lone_vs_scheduler.py, mixed requests).
# Larger batches keep the buckets: each shape is timed, and probed in exact mode.
LONE_ROWS = 9
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


def step_inputs(capacity: int, n_slots: int, width: int,
                fed: dict[int, tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batched step's tokens and positions [n_slots, width]: slot s of ``fed`` feeds its tokens
    (padded with 0 to ``width``) at consecutive positions from its start; every other slot feeds
    token 0 at the scratch positions, the end of its cache entry, past any sequence's data, where
    padding rows and idle slots write keys nobody reads. One tensor from Python lists per field:
    per-slot writes cost more than a small model's step."""
    token_rows, position_rows = [[0] * width] * n_slots, [list(range(capacity - width, capacity))] * n_slots
    for slot, (tokens, start) in fed.items():
        token_rows[slot] = tokens + [0] * (width - len(tokens))
        position_rows[slot] = list(range(start, start + width))
    both = torch.tensor([token_rows, position_rows])  # one call: each costs ~5 µs of a lone sequence's step
    return both[0], both[1]


def all_shapes(max_batch: int, max_rows: int) -> list[tuple[int, int]]:
    slots = sorted({slot_bucket(n, max_batch) for n in range(1, max_batch + 1)})
    rows = sorted({row_bucket(r, max_rows) for r in range(1, max_rows + 1)})
    lone_rows = sorted({*rows, *range(1, min(LONE_ROWS, max_rows) + 1)})
    return [(s, r) for s in slots for r in (lone_rows if s == 1 else rows)]


_probe_cache: dict[tuple, tuple[list[tuple[int, int]], bool]] = {}


@torch.inference_mode()
def invariant_shapes(model: Transformer, shapes: Sequence[tuple[int, int]],
                     capacity: int) -> tuple[list[tuple[int, int]], bool]:
    """Which shapes exact mode may use, and whether it may narrow the attention window.

    The reference is the largest shape attending over the whole cache. A shape is kept when a
    sequence's logits in it are bit-identical to the reference's, at its first and last slot, with 1
    or 2 real rows, whatever the other slots and rows hold; windows are allowed when every window
    bucket gives the reference shape the same bits too. The largest shape always qualifies, so
    exact mode can always run (at worst every step at [max batch, max rows]). Cached per platform,
    model shapes and capacity."""
    config = model.config
    key = (str(model.device), str(model.dtype), torch.get_num_threads(), config.n_layer, config.n_embd,
           config.n_head, config.n_kv_head, config.intermediate_size, config.vocab_size, capacity, tuple(shapes))
    if key in _probe_cache:
        return _probe_cache[key]
    generator = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    largest = max(shapes, key=lambda shape: (shape[0] * shape[1], shape))
    cache = model.new_cache(capacity, batch=largest[0])
    for tensors in (cache.keys, cache.values):
        for t in tensors:
            t.copy_(torch.randn(t.shape, generator=generator).to(t))
    cache.refresh_key_blocks()
    saved = [t[0].clone() for t in (*cache.keys, *cache.values)]
    position = min(MIN_WINDOW // 2, capacity - 2 * largest[1])
    probe_tokens = torch.randint(0, vocab, (2,), generator=generator)

    def probe(s: int, r: int, slot: int, n: int, window: int) -> torch.Tensor:
        for t, original in zip((*cache.keys, *cache.values), saved):
            t[slot].copy_(original)  # the probe sequence's own cache, the same in every run
        cache.entry(slot).refresh_key_blocks()
        tokens = torch.randint(0, vocab, (s, r), generator=generator)
        positions = torch.randint(0, window - r, (s, 1), generator=generator) + torch.arange(r)
        tokens[slot, :n] = probe_tokens[:n]
        positions[slot] = torch.arange(position, position + r)
        return model.forward_batched(tokens, positions, cache.first(s), window=window)[slot, :n]

    reference = {n: probe(*largest, 0, n, capacity) for n in (1, 2) if n <= largest[1]}

    def agrees(s: int, r: int, window: int) -> bool:
        return all(torch.equal(probe(s, r, slot, n, window), reference[n])
                   for slot in sorted({0, s - 1}) for n in reference if n <= r)

    kept = [shape for shape in shapes if agrees(*shape, capacity)]
    windows = {window_bucket(w, capacity) for w in (MIN_WINDOW, 2 * MIN_WINDOW, capacity // 2)}
    windows_ok = all(agrees(*largest, w) for w in sorted(windows)) and all(agrees(*kept[0], w) for w in sorted(windows))
    if len(kept) < len(shapes):
        log.debug("exact batched shapes on this platform: %s of %s", kept, list(shapes))
    _probe_cache[key] = (kept, windows_ok)
    return _probe_cache[key]
