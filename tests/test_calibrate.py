"""Early-exit layer calibration: the fastest measured layer wins, and the choice is cached per model."""

from __future__ import annotations

import json

from quickdraft import Engine
from quickdraft.calibrate import CACHE_FILE, cache_dir, calibrate_exit_layer, candidate_layers
from quickdraft.drafters.early_exit import EarlyExitDrafter, QuantizedEarlyExitDrafter
from quickdraft.model.loader import load_model


def test_candidates_cover_every_layer_of_a_shallow_model_and_the_first_half_of_a_deep_one():
    assert candidate_layers(6) == [1, 2, 3, 4, 5]
    deep = candidate_layers(32, trained=20)
    assert 20 in deep and max(layer for layer in deep if layer != 20) <= 16 and min(deep) >= 1
    assert len(deep) <= 7


def test_the_fastest_measured_layer_is_chosen_then_read_from_the_cache(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    target = models["target"]  # 3 layers: candidates 1 and 2
    measured = []

    def fake_measure(model, layer, prompts):
        measured.append(layer)
        assert prompts and all(prompts)
        return {1: 50.0, 2: 20.0}[layer]

    first = calibrate_exit_layer(target, measure=fake_measure)
    assert (first.layer, first.cached, first.tokens_per_s) == (1, False, {1: 50.0, 2: 20.0})
    second = calibrate_exit_layer(target, measure=fake_measure)
    assert (second.layer, second.cached) == (1, True)
    assert measured == [1, 2]  # measured once, then cached
    stored = json.loads((cache_dir() / CACHE_FILE).read_text())
    assert [entry["layer"] for entry in stored.values()] == [1]


def test_calibration_picks_the_argmax_and_the_key_depends_on_the_dtype(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    import quickdraft.calibrate as calibrate

    monkeypatch.setattr(calibrate, "candidate_layers", lambda n, trained=None: [1, 2, 3])
    rates = {1: 10.0, 2: 30.0, 3: 20.0}
    fp32 = load_model(checkpoints["target"])
    assert calibrate_exit_layer(fp32, measure=lambda m, layer, p: rates[layer]).layer == 2
    rates = {1: 40.0, 2: 30.0, 3: 20.0}
    bf16 = load_model(checkpoints["target"], dtype="bf16")
    assert calibrate_exit_layer(bf16, measure=lambda m, layer, p: rates[layer]).layer == 1
    assert calibrate_exit_layer(fp32, measure=lambda m, layer, p: 1 / 0).layer == 2  # cached, not re-measured


def test_another_build_of_the_kernels_calibrates_again(checkpoints, tmp_path, monkeypatch):
    """A layer measured on one build of the kernels is not taken for another: its drafts cost otherwise."""
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    import quickdraft.calibrate as calibrate
    from quickdraft import kernels

    monkeypatch.setattr(calibrate, "candidate_layers", lambda n, trained=None: [1, 2])
    target = load_model(checkpoints["target"])
    monkeypatch.setattr(kernels, "build_id", lambda: "one-build")
    assert calibrate_exit_layer(target, measure=lambda m, layer, p: {1: 10.0, 2: 30.0}[layer]).layer == 2
    assert calibrate_exit_layer(target, measure=lambda m, layer, p: 1 / 0).cached
    monkeypatch.setattr(kernels, "build_id", lambda: "another-build")
    again = calibrate_exit_layer(target, measure=lambda m, layer, p: {1: 40.0, 2: 30.0}[layer])
    assert (again.layer, again.cached) == (1, False)


def test_each_early_exit_form_is_calibrated_apart(checkpoints, tmp_path, monkeypatch):
    """The int8 draft-model form drafts at another cost than the shared-cache one: a layer measured for
    one is not taken for the other."""
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    import quickdraft.calibrate as calibrate

    monkeypatch.setattr(calibrate, "candidate_layers", lambda n, trained=None: [1, 2])
    monkeypatch.setattr(QuantizedEarlyExitDrafter, "applies", staticmethod(lambda target, quantized_draft=True: quantized_draft))
    target = load_model(checkpoints["target"])
    shared = calibrate_exit_layer(target, quantized_draft=False, measure=lambda m, layer, p: {1: 10.0, 2: 30.0}[layer])
    quantized = calibrate_exit_layer(target, measure=lambda m, layer, p: {1: 40.0, 2: 30.0}[layer])
    assert (shared.layer, quantized.layer, quantized.cached) == (2, 1, False)
    assert calibrate_exit_layer(target, quantized_draft=False, measure=lambda m, layer, p: 1 / 0).layer == 2


def test_early_exit_without_a_layer_is_calibrated_for_real_and_stays_exact(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    engine = Engine(models["target"], "early-exit", exact=False)
    assert isinstance(engine.drafter, (EarlyExitDrafter, QuantizedEarlyExitDrafter)) and engine.drafter.exit_layer in (1, 2)
    assert (tmp_path / CACHE_FILE).exists()
    prompt = list(range(2, 20))
    assert engine.generate(prompt, 24, gamma=3).token_ids == engine.generate(prompt, 24, gamma=0).token_ids


def test_a_damaged_cache_is_recalibrated(models, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path))
    (tmp_path / CACHE_FILE).write_text("{not json")
    assert calibrate_exit_layer(models["target"], measure=lambda m, layer, p: 1.0).layer == 1
    json.loads((tmp_path / CACHE_FILE).read_text())  # rewritten whole
