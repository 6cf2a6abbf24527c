"""quickdraft's bf16 CPU kernels: close to a float64 reference, and a row's bits independent of
the other rows, the cache window and where its visible slots sit (what exact mode relies on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quickdraft import kernels
from quickdraft.model.transformer import RMSNorm

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs a CPU with AVX2 or better and a C++ compiler")


def _lesser_builds() -> list[str]:
    """The instruction sets below the one this run's kernels are built for that this CPU also runs
    (on an AMX CPU: avx512_bf16 and avx2); none inside a run that already chose one."""
    if os.environ.get("QUICKDRAFT_KERNELS_ISA") or not kernels.available():
        return []
    runnable = kernels.runnable_isas()
    return runnable[runnable.index(kernels.loaded_isa()) + 1:]


@pytest.mark.slow
@pytest.mark.parametrize("isa", _lesser_builds())
def test_a_lesser_build_this_cpu_runs_passes_the_product_and_forward_tests(isa: str) -> None:
    # The machines this project runs on differ (AMX, AVX-512, AVX2): each build's rows are checked
    # wherever the CPU can run it, not only the build a run picks.
    env = {**os.environ, "QUICKDRAFT_KERNELS_ISA": isa}
    # and the sampling kernels' tests, whose vectors differ by build too, and the int8 products' (AVX2 refuses them)
    files = [__file__, *(str(Path(__file__).with_name(name))
                         for name in ("test_seeded_sampling.py", "test_sampling.py", "test_quantized_products.py"))]
    done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-p",
                           "no:xdist", *files, "-k",
                           "linear or native_forwards or attention or first_maxima or native_noise or coupled_race"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


# Input sizes: whole AMX steps of 32 inputs (384, 96), a remainder after them (200), a remainder
# alone (18). 37 rows: the AMX build's groups of 16 and a partial third; the AVX-512 build's 6-row tiles.
@pytest.mark.parametrize("n_out,k,bias", [(200, 384, True), (64, 96, False), (130, 200, True), (1000, 18, True)])
def test_linear_matches_reference_and_rows_are_invariant(n_out: int, k: int, bias: bool) -> None:
    weight, x = _bf16(n_out, k, seed=0), _bf16(37, k, seed=1)
    b = _bf16(n_out, seed=2) if bias else None
    y = kernels.linear_bf16(x, kernels.pack_bf16(weight), b, n_out)
    reference = x.double() @ weight.double().T + (b.double() if b is not None else 0)
    torch_error = (F.linear(x, weight, b).double() - reference).abs().max()
    assert y.shape == (37, n_out) and y.dtype == torch.bfloat16
    assert (y.double() - reference).abs().max() <= 2 * torch_error + 1e-3
    packed = kernels.pack_bf16(weight)
    for rows in (1, 2, 5, 6, 7, 12, 16, 17, 33):
        for start in range(0, 37 - rows + 1, 5):
            assert torch.equal(kernels.linear_bf16(x[start:start + rows], packed, b, n_out), y[start:start + rows])


def test_linear_keeps_leading_dimensions_and_threads_do_not_change_bits(every_call_shared) -> None:
    weight, x = _bf16(130, 64, seed=3), _bf16(2, 5, 64, seed=4)
    packed = kernels.pack_bf16(weight)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.linear_bf16(x, packed, None, 130)
        torch.set_num_threads(2)
        two = kernels.linear_bf16(x, packed, None, 130)
    finally:
        torch.set_num_threads(threads)
    assert one.shape == (2, 5, 130) and torch.equal(one, two)


def test_the_least_work_a_thread_takes_does_not_change_bits() -> None:
    """Whether a product or an attention is shared between threads or kept on one (``set_min_task_work``:
    always shared, the default, never shared) changes which thread computes a column or a head, never its bits."""
    weight = _bf16(1000, 384, seed=5)
    packs = [kernels.pack_bf16(weight)] + ([kernels.pack_int8(weight)] if kernels.int8_products() else [])
    x = _bf16(17, 384, seed=6)
    attention = _attention_case(2, 6, 2, 5, 64, 300, seed=11)
    threads, least = torch.get_num_threads(), kernels.min_task_work()

    def outputs() -> list[torch.Tensor]:
        products = [kernels.linear_bf16(x[:rows], packed, None, 1000) for packed in packs for rows in (1, 6, 17)]
        return products + [kernels.attend_bf16(*attention), kernels.attend_bf16(*(t[:1] for t in attention))]

    try:
        torch.set_num_threads(2)
        by_least_work = {}
        for work in (0, least, 1 << 40):
            kernels.set_min_task_work(work)
            by_least_work[work] = outputs()
    finally:
        kernels.set_min_task_work(least)
        torch.set_num_threads(threads)
    shared = by_least_work[0]
    for work, got in by_least_work.items():
        assert all(torch.equal(a, b) for a, b in zip(got, shared, strict=True)), work


def test_pack_refuses_what_the_kernel_cannot_take() -> None:
    with pytest.raises(ValueError, match="even input size"):
        kernels.pack_bf16(_bf16(8, 7, seed=0))
    with pytest.raises(ValueError, match="bf16"):
        kernels.pack_bf16(torch.zeros(8, 8))


def _attention_case(batch: int, n_head: int, n_kv: int, t: int, d: int, capacity: int, seed: int):
    q = _bf16(batch, n_head, t, d, seed=seed)
    keys, values = _bf16(batch, n_kv, capacity, d, seed=seed + 1), _bf16(batch, n_kv, capacity, d, seed=seed + 2)
    mask = torch.rand(batch, t, capacity, generator=torch.Generator().manual_seed(seed + 3)) < 0.6
    mask[..., 0] = True
    return q, keys, values, mask


@pytest.mark.parametrize("n_head,n_kv,d", [(6, 2, 64), (4, 4, 40), (2, 1, 128)])
def test_attention_matches_reference(n_head: int, n_kv: int, d: int) -> None:
    q, keys, values, mask = _attention_case(2, n_head, n_kv, 5, d, 300, seed=10)
    y = kernels.attend_bf16(q, keys, values, mask)
    reference = F.scaled_dot_product_attention(q.double(), keys.double(), values.double(), attn_mask=mask[:, None],
                                               enable_gqa=n_head != n_kv)
    assert y.shape == q.shape and (y.double() - reference).abs().max() < 0.02


def test_attention_rows_do_not_depend_on_window_neighbours_or_slot_positions() -> None:
    q, keys, values, mask = _attention_case(3, 6, 2, 4, 64, 256, seed=20)
    mask[..., 200:] = False
    y = kernels.attend_bf16(q, keys, values, mask)
    # a narrower window holding every visible slot
    assert torch.equal(kernels.attend_bf16(q, keys[:, :, :200], values[:, :, :200], mask[..., :200]), y)
    # each row alone, and each sequence of the batch alone
    for i in range(4):
        assert torch.equal(kernels.attend_bf16(q[:, :, i:i + 1], keys, values, mask[:, i:i + 1]), y[:, :, i:i + 1])
    assert torch.equal(kernels.attend_bf16(q[1:2], keys[1:2], values[1:2], mask[1:2]), y[1:2])
    # the same visible keys and values moved to other slots, in the same order (a tree's ancestors)
    visible = mask[0, 0].nonzero().squeeze(1)
    moved = torch.sort(torch.randperm(256, generator=torch.Generator().manual_seed(1))[: len(visible)]).values
    keys2, values2 = torch.zeros_like(keys[:1]), torch.zeros_like(values[:1])
    keys2[:, :, moved], values2[:, :, moved] = keys[:1, :, visible], values[:1, :, visible]
    mask2 = torch.zeros(1, 1, 256, dtype=torch.bool)
    mask2[0, 0, moved] = True
    assert torch.equal(kernels.attend_bf16(q[:1, :, :1], keys2, values2, mask2), y[:1, :, :1])


def test_attention_rows_that_share_a_prefix_get_the_bits_they_get_alone() -> None:
    # Rows go through the kernel two at a time, the slots that begin both their lists weighed in one
    # pass: a causal chain (each row sees one slot more), a row that sees fewer than the one before it,
    # rows whose lists part after a common prefix (a tree's siblings) and an odd row out.
    q, keys, values, _ = _attention_case(2, 6, 2, 7, 64, 256, seed=40)
    mask = torch.zeros(2, 7, 256, dtype=torch.bool)
    mask[:, 0, :150], mask[:, 1, :151] = True, True  # a chain
    mask[:, 2, :152], mask[:, 3, :140] = True, True  # fewer slots than the row before it
    mask[:, 4, :140], mask[:, 4, 145] = True, True  # siblings: the prefix, then slots of their own
    mask[:, 5, :140], mask[:, 5, 150], mask[:, 5, 152] = True, True, True
    mask[:, 6, :100], mask[:, 6, 170:180] = True, True
    y = kernels.attend_bf16(q, keys, values, mask)
    for i in range(7):
        assert torch.equal(kernels.attend_bf16(q[:, :, i:i + 1], keys, values, mask[:, i:i + 1]), y[:, :, i:i + 1]), i


@pytest.mark.parametrize("d", [64, 28])
def test_attention_over_a_prefix_equals_the_same_keys_scattered(d: int) -> None:
    # A chain's rows see a run of consecutive slots (vector-at-a-time paths); a tree's nodes see the
    # same keys with gaps between them: same bits, for every run length around the vector widths.
    for visible in (1, 15, 16, 17, 31, 32, 33, 100):
        q, keys, values, _ = _attention_case(1, 6, 2, 1, d, 256, seed=30 + visible)
        mask = torch.zeros(1, 1, 256, dtype=torch.bool)
        mask[..., :visible] = True
        y = kernels.attend_bf16(q, keys, values, mask)
        spread = torch.sort(torch.randperm(256, generator=torch.Generator().manual_seed(visible))[:visible]).values
        keys2, values2 = torch.zeros_like(keys), torch.zeros_like(values)
        keys2[:, :, spread], values2[:, :, spread] = keys[:, :, :visible], values[:, :, :visible]
        mask2 = torch.zeros(1, 1, 256, dtype=torch.bool)
        mask2[0, 0, spread] = True
        assert torch.equal(kernels.attend_bf16(q, keys2, values2, mask2), y), visible


def test_rms_norm_matches_the_module_and_rows_are_invariant() -> None:
    norm = RMSNorm(96, 1e-5).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(_bf16(96, seed=5))
    x = _bf16(7, 96, seed=6)
    y = kernels.rms_norm_bf16(x, norm.weight, norm.eps)
    assert (y.float() - norm(x).float()).abs().max() <= 0.02 * norm(x).float().abs().max()
    assert all(torch.equal(kernels.rms_norm_bf16(x[i:i + 1], norm.weight, norm.eps), y[i:i + 1]) for i in range(7))


def test_a_packed_model_computes_what_torch_computes() -> None:
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=128, n_layer=2, n_head=4, n_kv_head=2,
                         head_dim=32, intermediate_size=256, block_size=256, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).bfloat16().eval()
    tokens = torch.randint(0, 300, (1, 40))
    with torch.inference_mode():
        cache = model.new_cache(64)
        reference = torch.cat([model(tokens[:, :36], 0, cache), model(tokens[:, 36:], 36, cache)], dim=1)
        assert model.pack_products() and model.products_packed
        cache = model.new_cache(64)
        packed = torch.cat([model(tokens[:, :36], 0, cache), model(tokens[:, 36:], 36, cache)], dim=1)
    assert (packed.float() - reference.float()).abs().max() < 0.05 * reference.float().abs().max()
    assert (packed.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


def test_a_chains_positions_and_mask_from_the_cached_tables_are_the_ones_built_per_call() -> None:
    """``_chain_inputs`` slices its tables (grown as windows widen) where ``_native_chain`` built
    positions and a causal mask per call: the same values, every shape a chain takes."""
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import CHAIN_TABLE_ROWS, Transformer

    config = ModelConfig(model_type="llama", vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_kv_head=1,
                         head_dim=8, intermediate_size=32, block_size=4096, norm_eps=1e-6,
                         tie_word_embeddings=True)
    model = Transformer(config)
    for start, t, window in [(0, 1, 1), (0, 5, 5), (7, 3, 64), (250, CHAIN_TABLE_ROWS, 266), (255, 1, 300),
                             (1000, 6, 1006), (3, 2, 4096), (0, 1, 2)]:
        positions, mask = model._chain_inputs(start, t, window)
        expected = torch.arange(start, start + t)
        assert positions.shape == (1, t) and torch.equal(positions[0], expected)
        assert mask.shape == (1, t, window) and torch.equal(mask[0], model._attention_mask(expected, window, False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_forwards_give_a_row_the_same_bits_alone_in_a_batch_and_in_a_tree(dtype: torch.dtype) -> None:
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    torch.manual_seed(1)
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_kv_head=2,
                         head_dim=16, intermediate_size=160, block_size=256, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).to(dtype).eval()
    reference = Transformer(config).to(dtype).eval()
    reference.load_state_dict(model.state_dict())
    assert model.pack_products() and model.native is not None
    tokens = torch.randint(0, 300, (1, 12))
    with torch.inference_mode():
        cache, per_op = model.new_cache(32), reference.new_cache(32)
        alone = torch.cat([model(tokens[:, i:i + 1], i, cache) for i in range(12)], dim=1)[0]
        expected = reference(tokens, 0, per_op)[0]
        tolerance = 0.05 if dtype == torch.bfloat16 else 1e-4
        assert (alone.float() - expected.float()).abs().max() < tolerance * expected.float().abs().max()
        # three sequences in one batched step: the middle one holds the same tokens
        batch = model.new_cache(32, batch=3)
        others = torch.randint(0, 300, (3, 12))
        others[1] = tokens[0]
        positions = torch.arange(12).repeat(3, 1)
        batched = model.forward_batched(others, positions, batch)[1]
        assert torch.equal(batched, alone)
        # the last 3 tokens as a chain-shaped tree whose nodes sit at scattered slots
        cache2 = model.new_cache(32)
        model(tokens[:, :9], 0, cache2)
        slots = torch.tensor([9, 14, 20])
        mask = torch.zeros(3, 21, dtype=torch.bool)
        mask[:, :9] = True
        for row in range(3):
            mask[row, slots[: row + 1]] = True
        tree = model.forward_tree(tokens[:, 9:], torch.arange(9, 12), slots, mask, cache2)[0]
        assert torch.equal(tree, alone[9:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_prefill_writes_the_forwards_cache_bits_without_computing_logits(dtype: torch.dtype, monkeypatch) -> None:
    """prefill / prefill_batched skip the LM head (the native forward computes logits for none of
    the rows, or for the last of each sequence in a greedy draft) and leave the same keys and
    values as forwards of the same rows; a prompt longer than the native forward takes goes in
    native chunks, never through the per-op path (whose LM head would run)."""
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import KERNEL_ATTENTION_ROWS, Transformer

    torch.manual_seed(2)
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_kv_head=2,
                         head_dim=16, intermediate_size=160, block_size=256, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).to(dtype).eval()
    assert model.pack_products() and model.native is not None
    head_calls = []  # the per-op path's LM head, and native forwards asked for logits
    model.lm_head.register_forward_hook(lambda *args: head_calls.append("per-op"))
    native_forward = kernels.forward

    def recording(*args):
        if args[17] > 0:  # logits_rows (the feature arguments follow it)
            head_calls.append("native")
        return native_forward(*args)

    monkeypatch.setattr(kernels, "forward", recording)
    with torch.inference_mode():
        for length in (12, KERNEL_ATTENTION_ROWS + 20):  # one native call, then two
            tokens = torch.randint(0, 300, (1, length))
            forward_cache, prefill_cache = model.new_cache(128), model.new_cache(128)
            for first in range(0, length, KERNEL_ATTENTION_ROWS):
                model(tokens[:, first: first + KERNEL_ATTENTION_ROWS], first, forward_cache)
            head_calls.clear()
            model.prefill(tokens, 0, prefill_cache)
            assert not head_calls
            for a, b in zip((*forward_cache.keys, *forward_cache.values), (*prefill_cache.keys, *prefill_cache.values)):
                assert torch.equal(a[:, :, :length], b[:, :, :length])
        batch_forward, batch_prefill = model.new_cache(128, batch=2), model.new_cache(128, batch=2)
        tokens, positions = torch.randint(0, 300, (2, 9)), torch.arange(9).repeat(2, 1)
        full = model.forward_batched(tokens, positions, batch_forward)
        head_calls.clear()
        model.prefill_batched(tokens, positions, batch_prefill)
        assert not head_calls
        for a, b in zip((*batch_forward.keys, *batch_forward.values), (*batch_prefill.keys, *batch_prefill.values)):
            assert torch.equal(a[:, :, :9], b[:, :, :9])
        # the native op's last-rows logits are those rows of the full logits, bit for bit
        native = model.native
        mask = model._attention_mask(positions.reshape(-1), 128, False).view(2, 9, 128)
        last = native(tokens, positions, positions, mask, model.new_cache(128, batch=2), logits_rows=3)
        assert last.shape == (2, 3, 300) and torch.equal(last, full[:, 6:])


def test_a_model_too_large_for_a_packed_copy_keeps_torchs_kernels(monkeypatch, caplog) -> None:
    from quickdraft import resources
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=64, n_layer=1, n_head=4, n_kv_head=4,
                         head_dim=16, intermediate_size=128, block_size=64, norm_eps=1e-6, tie_word_embeddings=True)
    model = Transformer(config).bfloat16()
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 1000)
    assert not model.pack_products() and model.native is None and not model.products_packed
    assert "not packing" in caplog.text
    monkeypatch.undo()
    assert model.pack_products() and model.native is not None


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_greedy_draft_in_one_call_is_the_step_by_step_draft(checkpoints, dtype: str) -> None:
    from quickdraft.drafters.base import DraftContext
    from quickdraft.drafters.draft_model import DraftModelDrafter
    from quickdraft.model.loader import load_model
    from quickdraft.randomness import sampler_for
    from quickdraft.sampling import SamplingParams

    drafters = [DraftModelDrafter(load_model(checkpoints["related"], dtype=dtype)) for _ in range(2)]
    assert drafters[0].model.native is not None
    target = load_model(checkpoints["target"], dtype=dtype).model
    prompt = torch.randint(3, 90, (80,), generator=torch.Generator().manual_seed(4)).tolist()  # a prefill > 64 rows
    for drafter in drafters:
        drafter.begin(prompt, DraftContext(target, target.new_cache(160), 160, drafter.vocab_limit))
    greedy = SamplingParams()
    sampler = sampler_for(greedy)
    native, calls = drafters[0].model.native, []
    one_call_draft = native.draft_greedy
    native.draft_greedy = lambda *args, **kwargs: calls.append(args) or one_call_draft(*args, **kwargs)
    tokens = list(prompt)
    for k, accepted in [(4, 2), (6, 6), (1, 0), (5, 3)]:
        # confidence_stop=0.0 never stops a draft, but takes the step-by-step path
        one_call, step_by_step = drafters[0].propose(tokens, k, greedy, sampler), drafters[1].propose(
            tokens, k, greedy, sampler, confidence_stop=0.0)
        assert one_call.tokens == step_by_step.tokens and len(one_call.tokens) == k
        assert one_call.forward_calls == step_by_step.forward_calls and one_call.q is None
        # the one call times each of its steps (auto γ plans the first apart), the Python steps do not
        assert one_call.step_seconds is not None and len(one_call.step_seconds) == k
        assert all(0 < seconds < 1 for seconds in one_call.step_seconds) and step_by_step.step_seconds is None
        for drafter in drafters:
            drafter.accept(accepted)
        assert drafters[0].cache.length == drafters[1].cache.length
        tokens += one_call.tokens[:accepted] + [7]  # the target's own next token
    assert len(calls) == 4  # every proposal: the 80 prompt tokens are prefilled first (a catch-up), then drafted from
    length = drafters[0].cache.length
    assert all(torch.equal(a[:, :, :length], b[:, :, :length])
               for a, b in zip(drafters[0].cache.keys + drafters[0].cache.values,
                               drafters[1].cache.keys + drafters[1].cache.values))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_coupled_sampled_draft_in_one_call_races_as_the_step_by_step_draft(checkpoints, dtype: str) -> None:
    """Under the coupled rule a sampled chain is drafted in one call too (a Gumbel-max over the
    positions' noise): the same tokens as Python's race step by step at a plain temperature; with
    top-p the untruncated race, in one call too; the rejection rule in one call as well, with its q."""
    from quickdraft.drafters.base import DraftContext
    from quickdraft.drafters.draft_model import DraftModelDrafter
    from quickdraft.model.loader import load_model
    from quickdraft.randomness import sampler_for
    from quickdraft.sampling import SamplingParams

    drafters = [DraftModelDrafter(load_model(checkpoints["related"], dtype=dtype)) for _ in range(2)]
    target = load_model(checkpoints["target"], dtype=dtype).model
    prompt = torch.randint(3, 90, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    for drafter in drafters:
        drafter.begin(prompt, DraftContext(target, target.new_cache(160), 160, drafter.vocab_limit))
    native, calls = drafters[0].model.native, []
    one_call_draft = native.draft_greedy
    native.draft_greedy = lambda *args, **kwargs: calls.append(args) or one_call_draft(*args, **kwargs)
    tokens, drafted = list(prompt), 0
    for temperature in (0.8, 1.5):
        sampling = SamplingParams(temperature=temperature, seed=11)
        sampler = sampler_for(sampling)
        assert sampler.coupled
        for k, accepted in [(4, 2), (6, 6), (1, 0), (5, 3)]:
            one_call, step_by_step = drafters[0].propose(tokens, k, sampling, sampler), drafters[1].propose(
                tokens, k, sampling, sampler, confidence_stop=0.0)
            assert one_call.tokens == step_by_step.tokens and one_call.q is None
            drafted += len(set(one_call.tokens))
            for drafter in drafters:
                drafter.accept(accepted)
            tokens += one_call.tokens[:accepted] + [7]
    assert len(calls) == 8 and drafted > 16  # every proposal in one call, and not one repeated token
    nucleus = SamplingParams(temperature=0.8, top_p=0.9, seed=11)  # races the untruncated softmax, in one call
    assert drafters[0].propose(tokens, 3, nucleus, sampler_for(nucleus)).q is None and len(calls) == 9
    drafters[0].accept(0)
    rejection = SamplingParams(temperature=0.8, seed=11, rule="rejection")  # draws, and returns q
    assert drafters[0].propose(tokens + [7], 3, rejection, sampler_for(rejection)).q is not None and len(calls) == 10
    drafters[0].accept(0)
    truncated = SamplingParams(temperature=0.8, top_p=0.9, seed=11, rule="rejection")  # q cut as p is: step by step
    assert drafters[0].propose(tokens + [7, 7], 3, truncated, sampler_for(truncated)).q is not None
    assert len(calls) == 10


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_rejection_rule_draft_in_one_call_draws_from_the_q_it_returns(checkpoints, dtype: str) -> None:
    """The rejection rule's chain in one native call: each token a draw from softmax(logit / T) (the
    untruncated requests' q), returned with that q: the first row equals the step-by-step
    draft's q at the same context, and 6,000 one-call drafts' first tokens fit it (chi-square); a
    wrong draw (the argmax) fails the same test."""
    from scipy.stats import chisquare

    from quickdraft.drafters.base import DraftContext
    from quickdraft.drafters.draft_model import DraftModelDrafter
    from quickdraft.model.loader import load_model
    from quickdraft.randomness import MultinomialSampler
    from quickdraft.sampling import SamplingParams

    drafter = DraftModelDrafter(load_model(checkpoints["related"], dtype=dtype))
    stepper = DraftModelDrafter(load_model(checkpoints["related"], dtype=dtype))
    target = load_model(checkpoints["target"], dtype=dtype).model
    prompt = torch.randint(3, 90, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    for d in (drafter, stepper):
        d.begin(prompt, DraftContext(target, target.new_cache(160), 160, d.vocab_limit))
    sampling = SamplingParams(temperature=1.3, rule="rejection")
    sampler = MultinomialSampler(3)
    reference = stepper.propose(prompt, 1, sampling, sampler, confidence_stop=0.0).q
    first = drafter.propose(prompt, 4, sampling, sampler)
    assert first.q is not None and first.q.shape == (4, drafter.vocab_limit) and len(first.tokens) == 4
    torch.testing.assert_close(first.q.sum(-1), torch.ones(4))
    torch.testing.assert_close(first.q[0], reference[0], rtol=1e-4, atol=1e-6)  # step by step: q at T, top-p 1
    q = first.q[0].double().numpy()
    counts = np.zeros_like(q)
    for _ in range(6000):
        drafter.cache.length = len(prompt) - 1  # the same context each time: the last prompt token fed again
        counts[drafter.propose(prompt, 1, sampling, sampler).tokens[0]] += 1
    keep = q * 6000 >= 5
    observed, expected = np.append(counts[keep], counts[~keep].sum()), np.append(q[keep], q[~keep].sum()) * 6000
    assert keep.sum() >= 5  # a spread distribution: the test can tell a draw from an argmax
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3
    argmax = np.zeros_like(q)
    argmax[int(q.argmax())] = 6000  # what a wrong draw (the greedy token) would give
    argmax_observed = np.append(argmax[keep], argmax[~keep].sum())
    assert chisquare(argmax_observed, expected * 6000 / expected.sum()).pvalue < 1e-6


def test_a_one_call_draft_refuses_draws_it_would_misread(checkpoints) -> None:
    """The kernel reads the rejection rule's draws as k packed float64: a strided view is refused by
    name, not read as other numbers."""
    from quickdraft.model.loader import load_model

    model = load_model(checkpoints["related"], dtype="bf16").model
    assert model.pack_products() and model.native is not None
    cache = model.new_cache(64)
    strided = torch.rand(8, dtype=torch.float64)[::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        model.native.draft_greedy([3, 4, 5], 4, model.config.vocab_size, cache, uniforms=strided)
    assert len(model.native.draft_greedy([3, 4, 5], 4, model.config.vocab_size, cache,
                                         uniforms=strided.contiguous())) == 4
    with pytest.raises(RuntimeError, match="step_seconds"):  # its step times likewise
        model.native.draft_greedy([3, 4, 5], 4, model.config.vocab_size, cache, step_seconds=torch.empty(3, dtype=torch.float64))


def test_a_batch_of_rejection_rule_drafts_draws_in_one_call_from_the_q_it_returns(checkpoints) -> None:
    """The batch drafter's native call draws a rejection-rule sequence's chain beside a greedy one:
    the greedy chain is the lone drafter's, the drawn sequence's q row 0 is the step-by-step q, and
    3,000 one-call drafts' first tokens fit it (chi-square), which the argmax would not."""
    from scipy.stats import chisquare

    from quickdraft.batch.drafters import DraftRequest
    from quickdraft.drafters.base import DraftContext
    from quickdraft.drafters.draft_model import DraftModelDrafter
    from quickdraft.engine import Engine
    from quickdraft.model.loader import load_model
    from quickdraft.randomness import MultinomialSampler
    from quickdraft.sampling import SamplingParams

    engine = Engine(str(checkpoints["target"]), str(checkpoints["related"]), dtype="bf16")
    drafter = engine.batch_scheduler(4).drafter
    native = drafter.model.native
    assert native is not None
    calls = []
    one_call_draft = native.draft_batch
    native.draft_batch = lambda *args: calls.append(args) or one_call_draft(*args)
    stepper = DraftModelDrafter(load_model(checkpoints["related"], dtype=drafter.model.dtype))
    target = engine.target.model
    prompt = torch.randint(3, 90, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    stepper.begin(prompt, DraftContext(target, target.new_cache(160), 160, stepper.vocab_limit))
    drawn, greedy = SamplingParams(temperature=1.3, rule="rejection"), SamplingParams(temperature=0.0)
    sampler = MultinomialSampler(3)
    reference = stepper.propose(prompt, 1, drawn, sampler, confidence_stop=0.0).q
    stepper.cache.length = len(prompt) - 1  # the last prompt token fed again
    lone_greedy = stepper.propose(prompt, 3, greedy, sampler).tokens
    drafter.begin([(0, prompt), (1, prompt)])
    requests = [DraftRequest(0, prompt, 3, drawn, sampler), DraftRequest(1, prompt, 3, greedy, sampler)]
    drafts = drafter.propose(requests, 2)
    assert len(calls) == 1 and drafts[1].q is None and drafts[1].tokens == lone_greedy
    timed = [d.step_seconds for d in drafts if d.step_seconds is not None]  # the call's, once: each step's time
    assert len(timed) == 1 and len(timed[0]) == 3 and all(0 < seconds < 1 for seconds in timed[0])
    q = drafts[0].q
    assert q is not None and q.shape == (3, drafter.vocab_limit) and len(drafts[0].tokens) == 3
    torch.testing.assert_close(q[0], reference[0], rtol=1e-4, atol=1e-6)
    q = q[0].double().numpy()
    counts = np.zeros_like(q)
    for _ in range(3000):
        drafter.length[:2] = [len(prompt) - 1] * 2  # the same context each time: the last prompt token fed again
        counts[drafter.propose(requests, 2)[0].tokens[0]] += 1
    assert len(calls) == 3001  # two sequences: the batched call, never the lone one
    keep = q * 3000 >= 5
    observed, expected = np.append(counts[keep], counts[~keep].sum()), np.append(q[keep], q[~keep].sum()) * 3000
    assert keep.sum() >= 5
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3
    argmax = np.zeros_like(q)
    argmax[int(q.argmax())] = 3000
    assert chisquare(np.append(argmax[keep], argmax[~keep].sum()), expected * 3000 / expected.sum()).pvalue < 1e-6


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_lone_sequence_of_a_batch_drafts_in_one_call(checkpoints, temperature: float) -> None:
    """The batch scheduler's draft model drafts a lone sequence's chain in one native call (greedy,
    or the coupled race), several in one batched native call (draft_batch); outputs stay plain decoding's."""
    from quickdraft.engine import Engine
    from quickdraft.sampling import SamplingParams

    engine = Engine(str(checkpoints["target"]), str(checkpoints["related"]), dtype="bf16")
    scheduler = engine.batch_scheduler(4)
    native = scheduler.drafter.model.native
    assert native is not None
    calls = []
    one_call_draft = native.draft_greedy
    native.draft_greedy = lambda *args, **kwargs: calls.append(args) or one_call_draft(*args, **kwargs)
    sampling = SamplingParams(temperature=temperature, seed=3)
    prompts = [[5, 9, 17, 33, 2, 8], [7, 7, 12, 40]]
    plain = [engine.generate_batch([p], 24, sampling, gamma=0, max_batch=4)[0].token_ids for p in prompts]
    alone = engine.generate_batch(prompts[:1], 24, sampling, gamma=3, max_batch=4)[0]
    assert alone.token_ids == plain[0] and alone.stats.num_drafts > 0
    assert len(calls) == alone.stats.num_drafts
    calls.clear()
    together = engine.generate_batch(prompts, 24, sampling, gamma=3, max_batch=4)
    assert [r.token_ids for r in together] == plain
    assert len(calls) < sum(r.stats.num_drafts for r in together)  # drafted together, not one by one


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_first_maxima_are_the_indices_torch_max_gives(dtype: torch.dtype) -> None:
    """Greedy verification's argmax (``sampling.greedy_tokens``): the first maximum on ties (rounded
    logits tie often), rows of -inf (a subset head's missing tokens), +inf, a NaN (torch.max's own
    answer), row lengths that end inside a vector, views whose rows are apart."""
    from quickdraft.sampling import greedy_tokens

    g = torch.Generator().manual_seed(0)
    for trial in range(120):
        rows, vocab = int(torch.randint(1, 20, (1,), generator=g)), int(torch.randint(1, 9000, (1,), generator=g))
        x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
        if trial % 3 == 0:
            x = x.round()
        if trial % 5 == 0:
            x[:, ::2] = float("-inf")
        if trial % 7 == 0:
            x[0] = float("-inf")
        if trial % 11 == 0:
            x[-1, vocab // 2] = float("nan")
        if trial % 13 == 0:
            x[0, vocab - 1] = float("inf")
        for logits in (x, x[:, : max(1, vocab // 2)], x.view(1, rows, vocab)):
            assert torch.equal(greedy_tokens(logits), torch.max(logits, -1)[1])
        assert torch.equal(kernels.first_maxima(x), torch.max(x, -1)[1])


def test_native_steps_time_their_rows_once_per_machine_whatever_the_capacity(monkeypatch, tmp_path):
    """A native step is one C++ call at any capacity: a request needing a larger cache reuses the row
    timings (timing them again held its first token back ~0.4 s on the embedded target). The first
    ROW_TIMING_SAMPLES processes with a model of the same shape each time them once, keeping their
    sample in the user cache; every process plans with the samples' median, and later ones time
    nothing, unless what the cost depends on differs (here the thread count, then the kernels' build) or
    the samples have aged."""
    from quickdraft.model import compiled
    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer

    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    config = ModelConfig(model_type="llama", vocab_size=300, n_embd=96, n_layer=2, n_head=6, n_kv_head=2,
                         head_dim=16, intermediate_size=160, block_size=1024, norm_eps=1e-6, tie_word_embeddings=True)
    timed = []

    def process_steps() -> compiled.CompiledSteps:
        """A new process's steps, whose timings are made up: the n-th to time measures rows x n."""
        model = Transformer(config).to(torch.bfloat16).eval()
        assert model.pack_products() and model.native is not None
        steps = compiled.CompiledSteps(model, enabled=True, row_buckets=(1, 2, 3))
        monkeypatch.setattr(steps, "_time_rows", lambda cache, counts: timed.append(list(counts))
                            or {rows: rows * len(timed) for rows in counts})
        return steps

    first = process_steps()
    for capacity in (256, 512, 256):
        first.prepare(first.model.new_cache(capacity))
    assert timed == [[1, 2, 3]] and first.row_seconds == {1: 1.0, 2: 2.0, 3: 3.0}
    planned = [first.row_seconds]
    for _ in range(compiled.ROW_TIMING_SAMPLES):  # four more processes time, the last one reads
        steps = process_steps()
        steps.prepare(steps.model.new_cache(512))
        planned.append(steps.row_seconds)
    assert len(timed) == compiled.ROW_TIMING_SAMPLES
    assert planned[1] == {1: 1.5, 2: 3.0, 3: 4.5}  # the median of two samples
    assert planned[-1] == planned[-2] == {1: 3.0, 2: 6.0, 3: 9.0}  # the median of five: 1, 2, 3, 4, 5 x rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        other = process_steps()
        other.prepare(other.model.new_cache(256))
    finally:
        torch.set_num_threads(threads)
    assert len(timed) == compiled.ROW_TIMING_SAMPLES + 1
    # another build of the kernels (their source changed: a 6-row int8 tile once ran twice as fast after
    # a fix) times again rather than plan with the old build's costs
    monkeypatch.setattr(kernels, "build_id", lambda: "another-build")
    rebuilt = process_steps()
    rebuilt.prepare(rebuilt.model.new_cache(256))
    assert len(timed) == compiled.ROW_TIMING_SAMPLES + 2
    # a week on, the kept samples no longer count: the next process times again and plans with its own
    timed_now = compiled._now()
    monkeypatch.setattr(compiled, "_now", lambda: timed_now + compiled.ROW_TIMING_MAX_AGE + 60)
    later = process_steps()
    later.prepare(later.model.new_cache(256))
    assert len(timed) == compiled.ROW_TIMING_SAMPLES + 3 and later.row_seconds == {1: 8.0, 2: 16.0, 3: 24.0}
