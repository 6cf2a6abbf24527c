"""Static-shape forwards, the compiled draft steps, and the dtype defaults around them.

These are torch's paths (torch.compile), which run where quickdraft's CPU kernels do not: every test
here turns the kernels off and uses models loaded with them off, so that no native forward stands in
for them. The module's tests share those models, hence their compiled graphs (seconds each)."""

from __future__ import annotations

import logging

import pytest
import torch

from quickdraft import Engine, kernels
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.model import compiled, transformer
from quickdraft.model.compiled import CompiledSteps, CompiledTreeSteps, static_capacity
from quickdraft.tree import ROOT, TokenTree, run_tree, tree_attention_mask, tree_rows
from quickdraft.model.loader import auto_dtype, default_draft_dtype, load_model
from quickdraft.sampling import SamplingParams


# One worker runs the module: its engines share the compiled graphs of its models.
pytestmark = pytest.mark.xdist_group("compile")


@pytest.fixture(autouse=True)
def torch_kernels_only(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)


@pytest.fixture(scope="module")
def models(checkpoints):
    """Unpacked fp32 models of this module's own (the session's shared ones may carry native forwards
    by now). Engines on the same model share its compiled graphs (``CompiledSteps.shared``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "available", lambda: False)
        return {name: load_model(path) for name, path in checkpoints.items()}


@pytest.mark.parametrize("transposed_lm_head", [True, False])
@torch.inference_mode()
def test_static_forward_matches_the_ordinary_forward_at_every_position(checkpoints, monkeypatch, transposed_lm_head):
    if not transposed_lm_head:  # an LM head above the copy limit goes through linear
        monkeypatch.setattr(transformer, "LM_HEAD_COPY_LIMIT_BYTES", 0)
    model = load_model(checkpoints["target"]).model
    cache, static_cache = model.new_cache(64), model.new_cache(64)
    model.prepare_static(static_cache.capacity)
    prompt = torch.tensor([[5, 9, 2, 7, 1, 3]])
    model(prompt, 0, cache)
    model(prompt, 0, static_cache)  # an eager prefill, then static steps on the same cache
    position = prompt.shape[1]
    for rows in (1, 2, 1, 3):
        tokens = torch.randint(1, 50, (1, rows))
        expected = model(tokens, position, cache)
        got = model.forward_static(tokens, torch.arange(position, position + rows), static_cache)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        position += rows
    assert (model._lm_head_t is not None) == transposed_lm_head


def test_static_capacity_is_a_power_of_two_of_at_least_256():
    assert [static_capacity(n) for n in (1, 256, 257, 600, 1024, 1025)] == [256, 256, 512, 1024, 1024, 2048]


@pytest.mark.slow
def test_compiled_drafter_keeps_greedy_output_and_its_drafts_match_the_eager_drafter(checkpoints, models):
    eager = Engine(models["target"], load_model(checkpoints["related"]), exact=False)
    fast = Engine(models["target"], models["related"], exact=False, compile_drafter=True)
    assert fast.drafter.steps.enabled
    prompt = list(range(3, 30))
    plain = eager.generate(prompt, 48, gamma=0).token_ids
    a, b = eager.generate(prompt, 48, gamma=3), fast.generate(prompt, 48, gamma=3)
    assert a.token_ids == b.token_ids == plain
    assert fast.drafter.steps.enabled, "compilation fell back to eager"
    # Same drafts, hence the same acceptance: compiled steps compute the same logits (to rounding).
    assert (a.stats.drafted, a.stats.accepted) == (b.stats.drafted, b.stats.accepted)
    sampled = fast.generate(prompt, 32, SamplingParams(temperature=0.8, seed=1), gamma=3)
    assert len(sampled.token_ids) == 32


def test_a_failing_compile_falls_back_to_eager_drafting_with_one_warning(checkpoints, monkeypatch, caplog):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(compiled.torch, "compile", broken_compile)
    drafter = DraftModelDrafter(load_model(checkpoints["related"]), compile=True)
    engine = Engine(load_model(checkpoints["target"]), drafter, exact=False)
    with caplog.at_level(logging.WARNING):
        result = engine.generate(list(range(3, 20)), 24, gamma=3)
    assert result.token_ids == engine.generate(list(range(3, 20)), 24, gamma=0).token_ids
    assert not drafter.steps.enabled
    assert sum("running eagerly" in r.message for r in caplog.records) == 1


def test_compiled_steps_disabled_run_the_ordinary_forward(models):
    steps = CompiledSteps(models["target"].model, enabled=False)
    cache = models["target"].model.new_cache(32)
    steps.prepare(cache)  # nothing to build
    logits = steps.run([4, 5], 0, cache)
    assert logits.shape == (2, models["target"].config.vocab_size)


def test_auto_dtype_is_bf16_only_where_the_cpu_has_bf16_dot_products_or_our_kernels(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert auto_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(kernels, "available", lambda: True)
    assert auto_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert auto_dtype("cpu") == torch.float32


def test_a_draft_model_follows_a_bf16_target_only_where_the_bf16_kernels_run(checkpoints, monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert default_draft_dtype("bf16", "cpu") == torch.float32
    assert default_draft_dtype("fp32", "cpu") == torch.float32
    engine = Engine(checkpoints["target"], checkpoints["related"], dtype="bf16", exact=False)
    assert engine.model.dtype == torch.bfloat16 and engine.model.native is None
    assert engine.drafter.model.dtype == torch.float32
    monkeypatch.undo()
    if kernels.available():
        assert default_draft_dtype("bf16", "cpu") == torch.bfloat16
        assert default_draft_dtype("fp32", "cpu") == torch.float32
    pinned = Engine(checkpoints["target"], checkpoints["related"], dtype="bf16", draft_dtype="bf16", exact=False)
    assert pinned.drafter.model.dtype == torch.bfloat16


@pytest.mark.slow
def test_compiled_target_steps_keep_plain_and_speculative_greedy_output(checkpoints, models):
    eager = Engine(models["target"], load_model(checkpoints["related"]), exact=False)
    compiled_target = Engine(models["target"], load_model(checkpoints["related"]), exact=False, compile_target=True)
    prompt = list(range(5, 40))
    plain = eager.generate(prompt, 40, gamma=0).token_ids
    assert compiled_target.generate(prompt, 40, gamma=0).token_ids == plain
    spec = compiled_target.generate(prompt, 40, gamma=3)
    assert spec.token_ids == plain and spec.stats.accepted > 0
    assert compiled_target.target_steps.enabled, "compilation fell back to eager"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_exact_mode_on_compiled_target_steps_is_bit_identical_to_its_plain_decoding(checkpoints, models, dtype):
    # fp32 shares the module's target graphs (row buckets 1, 2, 3, 5). bf16 is a model of its own, and
    # each of its graphs costs ~40 s of C++ compilation on a machine with a cold inductor cache (CI's
    # fresh clone): it builds buckets 1 and 2 only (plain steps and γ = 1 verifies).
    target = models["target"] if dtype == "fp32" else load_model(checkpoints["target"], dtype=dtype)
    max_gamma = 4 if dtype == "fp32" else 1
    engine = Engine(target, load_model(checkpoints["related"]), exact=True, compile_target=True, max_gamma=max_gamma)
    prompt = list(range(5, 40))
    plain = engine.generate(prompt, 48, gamma=0)
    for gamma in sorted({1, max_gamma}) + ["auto"]:
        spec = engine.generate(prompt, 48, gamma=gamma)
        assert spec.token_ids == plain.token_ids, gamma
        assert spec.stats.accepted > 0
    if engine.target_steps is None:  # exactness held above, on the eager fallback
        pytest.skip("the compiled steps are not row-invariant on this platform: exact mode fell back to eager steps")
    assert engine.target_steps.enabled, "compilation fell back to eager"


def test_row_timings_take_the_counts_in_turn_and_never_fall_with_more_rows(models, monkeypatch):
    """Auto γ plans with these: a machine slowing down midway must move every count alike, and a
    noisy count cheaper than a shorter one is lifted to it."""
    steps = CompiledSteps(models["target"].model, enabled=False, row_buckets=(1, 2, 5))
    clock = [0.0]
    cost = {1: 1.0, 2: 0.8, 5: 3.0}  # 2 rows "cheaper" than 1: noise

    def fake_run(tokens, start, cache):
        clock[0] += cost[len(tokens)] * (1 + clock[0] / 100)  # the machine slows as time passes

    steps.run = fake_run
    monkeypatch.setattr(compiled.time, "perf_counter", lambda: clock[0])
    seconds = steps._time_rows(None, steps.row_buckets, rounds=9)
    assert list(seconds) == [1, 2, 5]
    assert seconds[1] == seconds[2] and seconds[5] > seconds[2]
    assert 2.9 < seconds[5] / seconds[1] < 3.1  # interleaved: the slowdown cancels in the ratio
    steps.row_seconds = seconds
    assert steps.seconds_for(3) == seconds[5]  # padded to its bucket


def test_the_compiled_row_probe_catches_a_row_that_depends_on_its_neighbours(models):
    """rows_agree must fail when a row's bits depend on the call's other rows."""
    steps = CompiledSteps(models["target"].model, enabled=False, row_buckets=(1, 3))
    cache = models["target"].model.new_cache(64)
    eager_run = steps.run

    def row_by_row(tokens, start, cache):  # row-invariant by construction
        return torch.cat([eager_run([token], start + i, cache) for i, token in enumerate(tokens)])

    steps.run = row_by_row
    assert steps.rows_agree(cache)
    steps.run = lambda tokens, start, cache: row_by_row(tokens, start, cache) + 1e-3 * (len(tokens) > 1)
    assert not steps.rows_agree(cache)


@pytest.mark.slow
def test_compiled_tree_steps_match_the_eager_tree_forward_and_keep_greedy_output(checkpoints, models):
    """The compiled tree step (verification, and the draft's expansion) computes the eager tree
    forward's logits to rounding, padding rows included or not; greedy output stays plain's."""
    target = models["target"]
    prompt = [5, 9, 2, 7, 1]
    plain = Engine(target, None, exact=False).generate(prompt, 40, gamma=0).token_ids
    engine = Engine(target, models["related"], exact=False, compile_target=True, compile_drafter=True, tree_nodes=6)
    spec = engine.generate(prompt, 40)
    assert spec.token_ids == plain and spec.stats.tree_steps > 0
    assert engine.tree_steps and all(steps.enabled for steps in engine.tree_steps.values()), "fell back to eager"
    assert any(steps.enabled for steps in engine.drafter._compiled_tree_steps.values())

    tree = TokenTree()
    for token, parent in [(3, ROOT), (4, ROOT), (8, 0), (6, 1)]:
        tree.add(token, parent)
    model = target.model
    with torch.inference_mode():
        for rows in (7,):  # two padding rows after the tree's five
            cache = model.new_cache(256)
            model(torch.tensor([prompt]), 0, cache)
            eager = run_tree(model, 11, len(prompt), tree, cache)
            tokens, positions, slots = tree_rows(11, len(prompt), tree, len(tree) + 1)
            mask = tree_attention_mask(tree, len(prompt) + 1, len(prompt) + len(tree) + 1)
            compiled_logits = CompiledTreeSteps(model, rows).run(tokens, positions, slots, mask, cache)
            torch.testing.assert_close(compiled_logits, eager, rtol=1e-4, atol=1e-4)
