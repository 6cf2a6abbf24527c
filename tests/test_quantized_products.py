"""A draft's quantised weight products (``kernels.pack_int8``, ``kernels.pack_int4``): exactly the
quantised product they define, a row's bits independent of the other rows, and a whole forward that
stays close to the bf16 one. Only drafts use them, so only the guesses change: the target's
verification keeps every output."""

from __future__ import annotations

import pytest
import torch

from quickdraft import kernels
from quickdraft.model.config import ModelConfig
from quickdraft.model.native import NativeForward
from quickdraft.model.transformer import Transformer

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs a CPU with AVX2 or better and a C++ compiler")


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _quantised_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       weight_levels: int = 127) -> torch.Tensor:
    """The definition, in torch: columns scaled to ``weight_levels`` levels either side of 0 and rows to
    127 (round half to even), their integer dot products exact, then rescaled in fp32 and rounded to bf16."""
    w = weight.float()
    w_largest = w.abs().amax(dim=1)
    w_scale = torch.where(w_largest > 0, w_largest / weight_levels, torch.ones_like(w_largest))
    w_levels = torch.round(w / w_scale[:, None]).clamp(-weight_levels, weight_levels).long()
    rows = x.float()
    largest = rows.abs().amax(dim=1)
    levels = torch.full_like(largest, 127)  # tensor by tensor: torch divides a scalar by a tensor as a reciprocal
    x_scale = torch.where(largest > 0, largest / levels, torch.ones_like(largest))
    inverse = torch.where(largest > 0, levels / largest, torch.zeros_like(largest))
    x_levels = torch.round(rows * inverse[:, None]).long()
    sums = (x_levels @ w_levels.T).float()
    y = sums * (w_scale[None, :] * x_scale[:, None])
    if bias is not None:
        y = y + bias.float()
    return y.bfloat16()


# 37 rows: the 6-row tiles and a partial last one; 200 outputs: a partial last column block; input
# sizes of whole and partial 16-lane vectors (a row's quantisation); a zero row (scale 1, all zero).
# int4: 7 levels a side, two levels a byte (k = 100: an odd number of 4-input groups, half a line's pair).
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n_out,k,bias", [(200, 384, True), (64, 96, False), (130, 36, True), (70, 100, False)])
def test_quantised_linear_is_the_quantised_product_and_rows_are_invariant(bits: int, n_out: int, k: int,
                                                                           bias: bool) -> None:
    weight, x = _bf16(n_out, k, seed=0), _bf16(37, k, seed=1)
    x[5] = 0
    b = _bf16(n_out, seed=2) if bias else None
    packed = (kernels.pack_int8 if bits == 8 else kernels.pack_int4)(weight)
    if not kernels.int8_products():  # the AVX2 build: refused, clearly
        with pytest.raises(RuntimeError, match="AVX-512 VNNI"):
            kernels.linear_bf16(x, packed, b, n_out)
        return
    y = kernels.linear_bf16(x, packed, b, n_out)
    assert y.shape == (37, n_out) and torch.equal(y, _quantised_product(x, weight, b, 127 if bits == 8 else 7))
    exact = x.double() @ weight.double().T + (b.double() if b is not None else 0)
    assert (y.double() - exact).abs().max() < (0.05 if bits == 8 else 0.4) * exact.abs().max()
    for rows in (1, 2, 5, 6, 7, 12, 17):
        for start in range(0, 37 - rows + 1, 6):
            assert torch.equal(kernels.linear_bf16(x[start:start + rows], packed, b, n_out), y[start:start + rows])


@pytest.mark.parametrize("pack", [kernels.pack_int8, kernels.pack_int4])
def test_packs_refuse_an_input_size_they_cannot_group_by_four(pack) -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        pack(_bf16(8, 18, seed=0))


def test_pack_int4_folds_two_of_int8s_line_vectors_into_each_byte() -> None:
    """A line (4 inputs of a block's 64 columns) is 4 vectors of 64 levels in int8's layout, byte j of
    vector v holding column 16 v + j // 4, input j % 4; int4 folds vectors 0 and 1 into its first 64 bytes
    (level + 8, low and high nibble) and 2 and 3 into the next 64."""
    levels = torch.randint(-7, 8, (70, 24), generator=torch.Generator().manual_seed(4))
    levels[:, 0] = 7  # every column's largest magnitude 7: its scale is 1 and its levels are these
    packed = kernels.pack_int4(levels.bfloat16())
    blocks, lines = 2, 24 // 4
    assert packed.dtype == torch.uint8 and packed.shape == (blocks, lines * 128 + 512)
    padded = torch.zeros(blocks * 64, 24, dtype=torch.long)
    padded[:70] = levels
    j = torch.arange(64)
    for b in range(blocks):
        for q in range(lines):
            vectors = [padded[b * 64 + 16 * v + j // 4, 4 * q + j % 4] + 8 for v in range(4)]
            line = packed[b, q * 128:(q + 1) * 128].long()
            assert torch.equal(line[:64], vectors[0] | vectors[1] << 4)
            assert torch.equal(line[64:], vectors[2] | vectors[3] << 4)
    scales = packed[:, lines * 128:lines * 128 + 256].contiguous().view(torch.float32).flatten()
    assert torch.equal(scales, torch.ones(128))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_quantised_whole_forward_is_close_to_the_packed_one_and_row_invariant(dtype: torch.dtype, bits: int) -> None:
    if not kernels.int8_products():
        pytest.skip("int8 products need the AVX-512 VNNI build")
    torch.manual_seed(3)
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_kv_head=2,
                         head_dim=16, intermediate_size=160, block_size=256, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).to(dtype).eval()
    assert model.pack_products() and model.native is not None
    tokens = torch.randint(0, 300, (1, 12))
    with torch.inference_mode():
        packed = model(tokens, 0, model.new_cache(32))[0]
        assert model.quantize_native_products(bits) and model.native.layer_bits == bits
        head = model.native.weights[-1]
        assert head.dtype == torch.int8  # the head at 8 bits whatever the layers'
        cache = model.new_cache(32)
        alone = torch.cat([model(tokens[:, i:i + 1], i, cache) for i in range(12)], dim=1)[0]
        batch = model.new_cache(32, batch=3)
        others = torch.randint(0, 300, (3, 12))
        others[1] = tokens[0]
        batched = model.forward_batched(others, torch.arange(12).repeat(3, 1), batch)[1]
    assert torch.equal(batched, alone)
    assert (alone.float() - packed.float()).abs().max() < 0.1 * packed.float().abs().max()
    assert (alone.argmax(-1) == packed.argmax(-1)).float().mean() >= 0.75


def test_a_whole_forward_keeps_its_packed_weights_without_quantised_products_or_room_for_them(monkeypatch,
                                                                                                caplog) -> None:
    from quickdraft import resources

    config = ModelConfig(model_type="llama", vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_kv_head=2,
                         head_dim=16, intermediate_size=64, block_size=64, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).bfloat16().eval()
    model.pack_products()
    before = model.native
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "int8_products", lambda: False)
        assert not model.quantize_native_products() and model.native is before
    assert before is None or before.layer_bits is None
    if kernels.int8_products():
        with monkeypatch.context() as patch:  # an int8 copy larger than half the memory available now
            patch.setattr(resources, "available_memory_bytes", lambda: 2 * 64 * 32)
            assert not model.quantize_native_products() and model.native is before
        assert "the unquantised products" in caplog.text
        assert model.quantize_native_products() and model.native.layer_bits == 8
