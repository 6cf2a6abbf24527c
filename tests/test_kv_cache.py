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
