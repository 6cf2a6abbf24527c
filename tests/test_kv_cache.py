"""Rollback is moving a pointer: stale keys past it never change what the model computes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quickdraft.model.kv_cache import KVCache

SEQ = 48


@settings(max_examples=40, deadline=None)
@given(
    cut=st.integers(min_value=1, max_value=SEQ - 1),
    garbage=st.integers(min_value=1, max_value=12),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_rollback_then_refeed_equals_fresh_prefill(models, cut, garbage, seed):
    model = models["target"].model
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 96, (1, SEQ), generator=g)
    junk = torch.randint(0, 96, (1, garbage), generator=g)
    with torch.inference_mode():
        fresh = model.new_cache(64)
        model(tokens[:, :cut], 0, fresh)
        expected = model(tokens[:, cut:], cut, fresh)

        rolled = model.new_cache(64)
        model(tokens[:, :cut], 0, rolled)
        rolled.set_length(cut)
        model(junk, cut, rolled)  # a rejected draft writes past the committed length...
        rolled.set_length(cut + garbage)
        rolled.rollback(garbage)  # ...and is forgotten in O(1)
        got = model(tokens[:, cut:], cut, rolled)
    assert torch.equal(got, expected)


def test_rollback_rejects_more_than_held():
    cache = KVCache(n_layer=1, n_kv_head=1, head_dim=4, capacity=8)
    cache.set_length(3)
    with pytest.raises(ValueError, match="cannot roll back 4"):
        cache.rollback(4)
    cache.rollback(3)
    assert cache.length == 0


def test_forward_past_capacity_is_refused(models):
    model = models["target"].model
    cache = model.new_cache(8)
    with pytest.raises(ValueError, match="exceed the KV cache capacity"):
        model(torch.zeros(1, 9, dtype=torch.long), 0, cache)


def test_entry_views_share_the_cache_and_keep_their_own_length():
    cache = KVCache(2, 1, 4, 8, batch=3)
    first_two, again = cache.first(2), cache.first(2)
    assert first_two is not again and first_two.keys[0].shape == (2, 1, 8, 4)
    first_two.keys[1][1, 0, 5] = 7.0  # written through a view: in the cache, and in every view of it
    assert cache.keys[1][1, 0, 5, 0] == 7.0 and again.keys[1][1, 0, 5, 0] == 7.0
    assert cache.entry(1).keys[1][0, 0, 5, 0] == 7.0 and cache.entries(2, 3).keys[1][0, 0, 5, 0] == 0.0
    first_two.set_length(3)
    assert again.length == 0 and cache.length == 0
    cache.move_entry(1, 2)  # compaction of a batch copies the storage the views read
    assert cache.entries(2, 3).keys[1][0, 0, 5, 0] == 7.0
    cache.keys[1][0, 0, 4:6] = 3.0
    cache.move_entry(0, 2, length=5)  # a sequence's 5 positions; what lies past them stays
    assert cache.keys[1][2, 0, 4, 0] == 3.0 and cache.keys[1][2, 0, 5, 0] == 7.0


def test_kept_features_move_with_their_keys_and_views_share_them():
    cache = KVCache(1, 1, 2, 8, batch=2)
    features = cache.keep_features(3)
    for t in (*cache.keys, *cache.values, features):
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).view(t.shape))
    entry = cache.entry(1)
    assert entry.features is not None and entry.features.data_ptr() == features[1:].data_ptr()
    before, keys_before = features.clone(), cache.keys[0].clone()
    cache.compact([5, 6], 2)  # a tree's accepted path into place after 2 committed tokens
    assert torch.equal(features[:, 2:4], before[:, 5:7]) and torch.equal(cache.keys[0][:, :, 2:4],
                                                                          keys_before[:, :, 5:7])
    cache.move_entry(1, 0, length=4)  # compaction of a batch
    assert torch.equal(features[0, :4], features[1, :4]) and torch.equal(features[0, 4:], before[0, 4:])
    assert cache.nbytes == 2 * (2 * 8 * 2 * 4) + 2 * 8 * 3 * 4


def keys_from_blocks(cache: KVCache) -> list[torch.Tensor]:
    """The keys as the key blocks hold them: [batch, kv_heads, capacity, head_dim] per layer."""
    assert cache.key_blocks is not None
    return [b.transpose(-1, -2).flatten(2, 3)[:, :, : cache.capacity] for b in cache.key_blocks]


def test_key_blocks_follow_the_keys_through_refresh_moves_and_compaction():
    cache = KVCache(2, 2, 6, 20, batch=3, key_block_lanes=8)  # 20 slots: the last block is cut short
    assert cache.key_blocks is not None and cache.key_blocks[0].shape == (3, 2, 3, 6, 8)
    for t in (*cache.keys, *cache.values):
        t.copy_(torch.randn(t.shape))
    assert not torch.equal(keys_from_blocks(cache)[0], cache.keys[0])  # nothing mirrors the keys unasked
    cache.refresh_key_blocks()
    assert all(torch.equal(b, k) for b, k in zip(keys_from_blocks(cache), cache.keys))
    cache.entry(1).keys[0][0, 1, 9:11] = 5.0  # a write through a view, refreshed there
    cache.entry(1).refresh_key_blocks(9, 11)
    assert torch.equal(keys_from_blocks(cache)[0], cache.keys[0])
    cache.compact([17, 19], 3)  # a tree's accepted path into place: keys and blocks alike
    assert all(torch.equal(b, k) for b, k in zip(keys_from_blocks(cache), cache.keys))
    cache.move_entry(2, 0, length=11)  # a batch's compaction: the positions the sequence holds
    assert all(torch.equal(b[0, :, :11], k[2, :, :11]) for b, k in zip(keys_from_blocks(cache), cache.keys))
    assert cache.nbytes == 2 * 2 * (3 * 2 * 20 * 6 * 4) + 2 * (3 * 2 * 24 * 6 * 4)


def test_the_native_forward_writes_key_blocks_and_the_per_op_path_refreshes_them():
    """Every forward that writes keys leaves the blocks the native attention reads equal to them:
    the native forward writes both, a forward too large for it (the per-op path) refreshes them."""
    from quickdraft import kernels
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.native import NATIVE_MAX_ROWS
    from quickdraft.model.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_kv_head=2,
                         head_dim=16, intermediate_size=96, block_size=512, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).to(torch.bfloat16).eval()
    if not model.pack_products() or model.native is None:
        pytest.skip(f"no native forward here (kernels: {kernels.loaded_isa()})")
    cache = model.new_cache(512, batch=2)
    assert cache.key_blocks is not None
    rows = NATIVE_MAX_ROWS // 2 + 7  # two sequences of these rows: the per-op path
    with torch.inference_mode():
        for start, t in ((0, 5), (5, rows), (5 + rows, 3)):
            tokens = torch.randint(0, 300, (2, t))
            positions = torch.arange(start, start + t).expand(2, t)
            model.forward_batched(tokens, positions, cache, window=512)
            held = start + t
            assert all(torch.equal(b[:, :, :held], k[:, :, :held]) for b, k in zip(keys_from_blocks(cache), cache.keys))
