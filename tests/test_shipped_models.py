"""The embedded model pair shipped in quickdraft/assets: it loads in quickdraft and in transformers
with the same logits, the draft and target share one vocabulary, and the held-out prompts are there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import quickdraft
from quickdraft.model.loader import load_model

ASSETS = Path(quickdraft.__file__).resolve().parent / "assets"
TARGET, DRAFT = ASSETS / "target", ASSETS / "draft"
SNIPPET = 'def parse_args(argv=None):\n    """Parse the command line."""\n    parser = argparse.ArgumentParser('

pytestmark = pytest.mark.skipif(
    not ((TARGET / "model.safetensors").exists() and (DRAFT / "model.safetensors").exists()),
    reason="shipped model pair not installed yet (quickdraft train ... && quickdraft train install)",
)


@pytest.fixture(scope="module")
def target():  # noqa: ANN201
    return load_model(TARGET)


@pytest.fixture(scope="module")
def draft():  # noqa: ANN201
    return load_model(DRAFT)


def test_shipped_files_are_complete_and_small() -> None:
    total = 0
    for model_dir in (TARGET, DRAFT):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json"):
            assert (model_dir / name).exists(), f"{model_dir / name} is missing"
        total += sum(f.stat().st_size for f in model_dir.iterdir())
    assert total <= 80 * 2**20, f"shipped models take {total / 2**20:.1f} MiB, over the 80 MiB budget"


def test_draft_and_target_share_one_vocabulary(target, draft) -> None:  # noqa: ANN001
    assert target.config.vocab_size == draft.config.vocab_size
    assert target.tokenizer.vocab == draft.tokenizer.vocab
    assert target.eos_token_ids == draft.eos_token_ids


def test_draft_is_at_most_a_tenth_of_the_target(target, draft) -> None:  # noqa: ANN001
    assert draft.n_params * 10 <= target.n_params


def test_early_exit_layer_is_recorded_and_valid(target) -> None:  # noqa: ANN001
    layer = json.loads((TARGET / "config.json").read_text())["quickdraft_early_exit_layer"]
    assert 1 <= layer < target.config.n_layer


def test_tokenizer_round_trips_python_source(target) -> None:  # noqa: ANN001
    text = Path(quickdraft.__file__).read_text() + "\n\t# ünïcödé ✓\r\n"
    assert target.tokenizer.decode(target.tokenizer.encode(text)) == text


@pytest.mark.parametrize("which", ["target", "draft"])
def test_transformers_loads_the_shipped_model_with_matching_logits(which: str, target, draft) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    ours = target if which == "target" else draft
    model_dir = TARGET if which == "target" else DRAFT
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = ours.tokenizer.encode(SNIPPET)
    assert hf_tokenizer(SNIPPET)["input_ids"] == ids
    tokens = torch.tensor([ids])
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours.model(tokens)
    relative = (got - expected).abs().max() / expected.abs().max()
    assert relative <= 1e-4, f"{which}: logits differ from transformers' by {relative:.2e} (relative)"


def test_held_out_prompts_are_shipped() -> None:
    lines = (ASSETS / "prompts_heldout.jsonl").read_text().splitlines()
    prompts = [json.loads(line) for line in lines]
    assert len(prompts) >= 50
    assert all(p["prompt"].strip() and p["source"] for p in prompts)
