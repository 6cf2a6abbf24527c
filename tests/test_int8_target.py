"""An int8 target (``Engine(target_bits=8)``): the target's own weight products int8, plain and
speculative decoding both running that quantised model. Speculation stays exact relative to it:
greedy speculative output is its plain greedy output bit for bit, alone or in a batch, and no
forward of it may fall back to the per-op path (which would compute the bf16 weights' bits)."""

from __future__ import annotations

import pytest
import torch

from quickdraft import Engine, kernels
from quickdraft.errors import QuickdraftError
from quickdraft.model.loader import load_model
from quickdraft.model.native import NATIVE_MAX_ROWS
from test_exact_greedy import prompts

pytestmark = pytest.mark.skipif(not kernels.available() or not kernels.int8_products(),
                                reason="needs quickdraft's int8 kernels (AVX-512 VNNI)")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_an_int8_targets_speculative_greedy_output_is_its_plain_greedy_output(checkpoints, dtype: str) -> None:
    engines = {name: Engine(checkpoints["target"], drafter, dtype=dtype, target_bits=8)
               for name, drafter in (("draft", checkpoints["related"]), ("early exit", "early-exit:1"),
                                     ("lookup", "prompt-lookup"))}
    bf16_products = Engine(checkpoints["target"], None, dtype=dtype)
    differs = False
    for engine in engines.values():
        assert engine.model.native is not None and engine.model.native.layer_bits == 8 and engine.model.native_only
    for prompt in prompts(8):
        plain = engines["draft"].generate(prompt, 64, gamma=0)
        differs |= plain.token_ids != bf16_products.generate(prompt, 64, gamma=0).token_ids
        for name, engine in engines.items():
            for gamma in (1, 3, "auto"):
                assert engine.generate(prompt, 64, gamma=gamma).token_ids == plain.token_ids, (name, gamma, prompt)
    assert differs, "the int8 target decoded exactly as the unquantised one on every prompt: were its products int8?"


def test_an_int8_targets_batched_greedy_output_is_each_prompt_decoded_alone(checkpoints) -> None:
    engine = Engine(checkpoints["target"], checkpoints["related"], dtype="bf16", target_bits=8)
    batch = prompts(12)
    results = engine.generate_batch(batch, 48, gamma="auto", max_batch=8)
    for prompt, result in zip(batch, results):
        assert result.token_ids == engine.generate(prompt, 48, gamma=0).token_ids, prompt


def test_a_batched_step_beyond_one_native_call_runs_as_several_with_the_same_bits(checkpoints) -> None:
    """More rows than one native call takes: the int8 target splits the batch into groups of entries
    (the per-op path would compute the bf16 weights' bits); each sequence's logits are its own alone."""
    model = load_model(checkpoints["target"], dtype="bf16").model
    assert model.pack_products() and model.quantize_target_products()
    sequences, rows = NATIVE_MAX_ROWS // 9 + 3, 9
    tokens = torch.randint(0, 96, (sequences, rows), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(rows).repeat(sequences, 1)
    with torch.inference_mode():
        together = model.forward_batched(tokens, positions, model.new_cache(64, batch=sequences))
        for b in (0, sequences // 2, sequences - 1):
            alone = model.forward_batched(tokens[b:b + 1], positions[b:b + 1], model.new_cache(64, batch=1))
            assert torch.equal(together[b], alone[0])


def test_an_int8_target_refuses_what_it_cannot_run(checkpoints, monkeypatch) -> None:
    with pytest.raises(QuickdraftError, match="target_bits must be 8"):
        Engine(checkpoints["target"], None, dtype="bf16", target_bits=4)
    model = load_model(checkpoints["target"], dtype="bf16").model
    assert model.pack_products() and model.quantize_target_products()
    with torch.inference_mode(), pytest.raises(QuickdraftError, match="whole forwards"):
        model(torch.zeros(1, 80, dtype=torch.long), 0, model.new_cache(128))  # a chain past the native rows
    monkeypatch.setattr(kernels, "int8_products", lambda: False)
    with pytest.raises(QuickdraftError, match="AVX-512 VNNI"):
        Engine(checkpoints["target"], None, dtype="bf16", target_bits=8)
