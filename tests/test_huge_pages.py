"""Packed weights on 2 MiB pages: the same bytes in a mapping advised for huge pages, and a model whose
products live there computes the same bits as one whose products do not."""

from __future__ import annotations

import pytest
import torch

from quickdraft import huge_pages, kernels

needs_huge_pages = pytest.mark.skipif(not huge_pages.huge_pages_available(),
                                      reason="the kernel offers no transparent huge pages to madvise")


def _tensors() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(1000, 700, generator=generator).bfloat16(),  # 1.4 MB
            torch.randint(-128, 127, (333, 77), dtype=torch.int8, generator=generator),  # not a multiple of 64 bytes
            torch.randn(5, 3, 129, generator=generator)]


def test_the_kernels_transparent_huge_page_mode_is_the_bracketed_word(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    assert huge_pages.transparent_huge_pages() == "madvise"
    setting.write_text("always madvise [never]\n")
    assert huge_pages.transparent_huge_pages() == "never"
    assert not huge_pages.huge_pages_available()
    monkeypatch.setattr(huge_pages, "THP_SETTING", tmp_path / "missing")
    assert huge_pages.transparent_huge_pages() is None
    originals = _tensors()
    assert all(a is b for a, b in zip(huge_pages.on_huge_pages(originals), originals, strict=True))


@needs_huge_pages
def test_copies_on_huge_pages_hold_the_same_bytes_side_by_side_on_cache_lines():
    originals = _tensors()
    copies = huge_pages.on_huge_pages(originals)
    for original, copy in zip(originals, copies, strict=True):
        assert copy is not original and copy.dtype == original.dtype and copy.is_contiguous()
        assert torch.equal(copy, original)
        assert copy.data_ptr() % huge_pages.ALIGN == 0
    ends = [(c.data_ptr(), c.data_ptr() + c.numel() * c.element_size()) for c in copies]
    assert all(end <= start for (_, end), (start, _) in zip(ends, ends[1:]))  # in order, none overlapping
    assert ends[-1][1] - ends[0][0] < 2 * huge_pages.HUGE_PAGE  # one mapping
    assert copies[0].data_ptr() % huge_pages.HUGE_PAGE == 0
    assert huge_pages.huge_page_bytes(copies[0]) >= huge_pages.HUGE_PAGE


def test_quickdraft_huge_pages_0_refuses_them(monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_HUGE_PAGES", "0")
    assert not huge_pages.huge_pages_available()
    originals = _tensors()
    assert all(a is b for a, b in zip(huge_pages.on_huge_pages(originals), originals, strict=True))


@needs_huge_pages
def test_a_mapping_that_fails_leaves_the_tensors_where_they_are(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(huge_pages.mmap, "mmap", refuse)
    originals = _tensors()
    assert all(a is b for a, b in zip(huge_pages.on_huge_pages(originals), originals, strict=True))
    assert "stay on small pages" in caplog.text


def test_tensors_too_small_to_gain_stay_where_they_are():
    small = [torch.zeros(100, 100), torch.ones(7, dtype=torch.int8)]
    assert all(a is b for a, b in zip(huge_pages.on_huge_pages(small), small, strict=True))


@needs_huge_pages
@pytest.mark.skipif(not kernels.available(), reason="needs quickdraft's CPU kernels")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_model_whose_products_live_on_huge_pages_computes_the_same_bits(monkeypatch, dtype):
    import copy

    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig(model_type="llama", vocab_size=2048, n_embd=384, n_layer=2, n_head=6, n_kv_head=2,
                         head_dim=64, intermediate_size=1024, block_size=256, norm_eps=1e-6, tie_word_embeddings=True)
    on_huge = Transformer(config).to(dtype).eval()
    on_small = copy.deepcopy(on_huge)
    offered = huge_pages.huge_pages_available
    monkeypatch.setattr(huge_pages, "huge_pages_available", lambda: False)
    assert on_small.pack_products()
    monkeypatch.setattr(huge_pages, "huge_pages_available", offered)
    assert on_huge.pack_products()
    assert on_huge.native is not None and on_small.native is not None
    products = [w for w in on_huge.native.weights[1:] if w.numel() * w.element_size() >= 65536]  # [0]: the table
    assert len(products) == 2 * 4 + 1 and all(huge_pages.huge_page_bytes(w) > 0 for w in products)
    assert not any(huge_pages.huge_page_bytes(w) > 0 for w in on_small.native.weights)
    tokens = torch.randint(0, 2048, (1, 12))
    with torch.inference_mode():
        logits = [model(tokens, 0, model.new_cache(32)) for model in (on_huge, on_small)]
        assert torch.equal(*logits)
        if kernels.int8_products():  # a draft's quantised products, made by the native forward itself
            assert on_huge.quantize_native_products(4) and on_small.quantize_native_products(4)
            quantized = [w for w in on_huge.native.weights if w.dtype == torch.int8]
            assert quantized and all(huge_pages.huge_page_bytes(w) > 0 for w in quantized)
            drafts = [model.native.draft_greedy(tokens[0].tolist(), 5, 2048, model.new_cache(32))
                      for model in (on_huge, on_small)]
            assert drafts[0] == drafts[1]
