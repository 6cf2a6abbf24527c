"""A preallocated key/value cache: one buffer per layer and a length pointer.

Rollback is moving the pointer; slots past ``length`` may hold stale keys from rejected drafts
or padding rows, and are overwritten by the next forward that writes there.

For the native forward (``model/native.py``) the cache also keeps its keys in *key blocks*: per
layer [batch, kv_heads, ceil(slots / lanes), head_dim, lanes], each block the keys of ``lanes``
consecutive slots transposed, as the attention kernel scores them. The kernel used to build that
layout from the keys on every call, for every sequence and key/value head: with 16 one-row sequences
400 positions deep, a quarter of the step. The keys stay the truth: the native forward writes both,
and every other writer refreshes the blocks it touched (``refresh_key_blocks``).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layer: int,
        n_kv_head: int,
        head_dim: int,
        capacity: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        key_block_lanes: int | None = None,
    ) -> None:
        shape = (batch, n_kv_head, capacity, head_dim)  # [batch, kv_heads, slots, head_dim]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.key_blocks: list[torch.Tensor] | None = None
        if key_block_lanes:
            blocks = (batch, n_kv_head, -(-capacity // key_block_lanes), head_dim, key_block_lanes)
            self.key_blocks = [torch.zeros(blocks, dtype=dtype, device=device) for _ in range(n_layer)]
        self.capacity = capacity
        self.length = 0  # committed tokens; slots [0, length) are valid
        # [batch, slots, n_embd] once ``keep_features``: each row's residual stream after the model's
        # last layer, at its slot (what a feature draft drafts from), written by every full forward
        self.features: torch.Tensor | None = None
        # The layers' views per batch-entry slice, made once (_view): a batched step asks for one
        # every step, and 2 x n_layer tensor slices cost more than the rest of its Python.
        self._views: dict[tuple[int, int], tuple] = {}

    @property
    def nbytes(self) -> int:
        kept = [*(self.key_blocks or []), *([] if self.features is None else [self.features])]
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values, *kept))

    def keep_features(self, n_embd: int) -> torch.Tensor:
        """Keep, from now on, every row's last residual stream at its slot (``features``)."""
        keys = self.keys[0]
        if self.features is None or self.features.shape[-1] != n_embd:
            self.features = torch.zeros(keys.shape[0], self.capacity, n_embd, dtype=keys.dtype, device=keys.device)
            self._views.clear()
        return self.features

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` committed tokens, in O(1)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot roll back {n} tokens from a cache holding {self.length}")
        self.length -= n

    def set_length(self, length: int) -> None:
        if not 0 <= length <= self.capacity:
            raise ValueError(f"cache length {length} outside [0, {self.capacity}]")
        self.length = length

    def reset(self) -> None:
        self.length = 0

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    def first(self, n: int) -> KVCache:
        """A view of batch entries [0, n) (shares storage; no copy): a batched step over n sequences."""
        return self._view(slice(0, n))

    def entries(self, start: int, stop: int) -> KVCache:
        """A view of batch entries [start, stop) (shares storage): a prefill of consecutive slots."""
        return self._view(slice(start, stop))

    def entry(self, b: int) -> KVCache:
        """A batch-1 view of entry b (shares storage): prefill of one sequence of a batch."""
        return self._view(slice(b, b + 1))

    def _view(self, entries: slice) -> KVCache:
        key = (entries.start, entries.stop)
        if key not in self._views:
            self._views[key] = ([k[entries] for k in self.keys], [v[entries] for v in self.values],
                                None if self.features is None else self.features[entries],
                                None if self.key_blocks is None else [b[entries] for b in self.key_blocks])
        view = KVCache.__new__(KVCache)
        view.keys, view.values, view.features, view.key_blocks = self._views[key]
        view.capacity, view.length, view._views = self.capacity, 0, {}
        return view

    def move_entry(self, source: int, destination: int, length: int | None = None) -> None:
        """Copy entry ``source``'s keys and values over entry ``destination`` (compaction of a batch):
        its first ``length`` positions, those a sequence holds (nothing reads a position before
        writing it), or all of them."""
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[destination, :, :length].copy_(t[source, :, :length])
        if self.features is not None:
            self.features[destination, :length].copy_(self.features[source, :length])
        if self.key_blocks is not None:
            blocks = None if length is None else -(-length // self.key_blocks[0].shape[-1])
            for t in self.key_blocks:
                t[destination, :, :blocks].copy_(t[source, :, :blocks])

    def compact(self, sources: list[int], destination: int) -> None:
        """Copy the keys and values at slots ``sources`` to the consecutive slots from ``destination``
        (a token tree's accepted path into place after the committed prefix; nothing recomputed)."""
        if not sources or sources == list(range(destination, destination + len(sources))):
            return
        index = torch.tensor(sources, device=self.keys[0].device)
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[:, :, destination : destination + len(sources)] = t.index_select(2, index)
        if self.features is not None:
            self.features[:, destination : destination + len(sources)] = self.features.index_select(1, index)
        self.refresh_key_blocks(destination, destination + len(sources))

    def refresh_key_blocks(self, start: int = 0, stop: int | None = None) -> None:
        """Rebuild the key blocks that hold slots [start, stop) (default: all) from the keys, in every
        entry of this cache (or view): what a writer other than the native forward must do after
        changing keys there. Nothing to do without key blocks."""
        stop = self.capacity if stop is None else min(stop, self.capacity)
        if self.key_blocks is not None and stop > start:
            self.refresh_key_blocks_at(torch.arange(start, stop, device=self.keys[0].device))

    def refresh_key_blocks_at(self, slots: torch.Tensor) -> None:
        """``refresh_key_blocks`` for the blocks holding ``slots`` (any shape) only: a per-op batched step
        writes each sequence's few rows and the idle entries' scratch slots at the end of the cache,
        and the span between them holds nothing it wrote. (Lanes past the capacity, in a last block cut
        short, get the last slot's key: nothing reads them.)"""
        if self.key_blocks is None or slots.numel() == 0:
            return
        lanes = self.key_blocks[0].shape[-1]
        blocks = torch.unique(slots.flatten() // lanes)
        held = (blocks[:, None] * lanes + torch.arange(lanes, device=blocks.device)).clamp_(max=self.capacity - 1)
        for keys, kept in zip(self.keys, self.key_blocks):
            rows = keys.index_select(2, held.flatten()).unflatten(2, (len(blocks), lanes)).transpose(-1, -2)
            kept.index_copy_(2, blocks, rows)
