"""The embedded model pairs shipped in quickdraft/assets: they load in quickdraft and in transformers
with the same logits, each draft and target share one vocabulary, the copy pair copies its context,
and the held-out prompts are there."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

import quickdraft
from quickdraft.assets import EMBEDDED_PAIRS
from quickdraft import kernels
from quickdraft.model.loader import load_model

ASSETS = Path(quickdraft.__file__).resolve().parent / "assets"
SNIPPET = 'def parse_args(argv=None):\n    """Parse the command line."""\n    parser = argparse.ArgumentParser('
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")

pytestmark = pytest.mark.skipif(
    not all((root / which / "model.safetensors").exists() for root in EMBEDDED_PAIRS.values()
            for which in ("target", "draft")),
    reason="shipped model pairs not installed yet (quickdraft train ... && quickdraft train install)",
)


@pytest.fixture(scope="module", params=sorted(EMBEDDED_PAIRS))
def pair(request):  # noqa: ANN001, ANN201
    root = EMBEDDED_PAIRS[request.param]
    return {"name": request.param, "root": root, "target": load_model(root / "target"),
            "draft": load_model(root / "draft")}


def test_shipped_files_are_complete_and_small() -> None:
    total = 0
    for root in EMBEDDED_PAIRS.values():
        for model_dir in (root / "target", root / "draft"):
            for name in MODEL_FILES:
                assert (model_dir / name).exists(), f"{model_dir / name} is missing"
            total += sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file())  # self_draft/ included
    assert total <= 80 * 2**20, f"shipped models take {total / 2**20:.1f} MiB, over the 80 MiB budget"


def test_both_pairs_speak_one_vocabulary(pair) -> None:  # noqa: ANN001
    target, draft = pair["target"], pair["draft"]
    assert target.config.vocab_size == draft.config.vocab_size
    assert target.tokenizer.vocab == draft.tokenizer.vocab
    assert target.eos_token_ids == draft.eos_token_ids
    default = json.loads((ASSETS / "target" / "tokenizer.json").read_text())
    assert json.loads((pair["root"] / "target" / "tokenizer.json").read_text()) == default


def test_each_draft_ships_a_head_of_its_most_frequent_tokens_the_engine_uses(pair) -> None:  # noqa: ANN001
    from quickdraft.drafters.factory import make_drafter
    from quickdraft.model.draft_head import load_draft_head

    draft = pair["draft"]
    head = load_draft_head(draft.path, draft.config.vocab_size)
    assert head is not None and len(head) == draft.config.vocab_size // 4
    assert set(draft.eos_token_ids) <= set(head.tolist())  # a draft can always propose the end
    ids = draft.tokenizer.encode(SNIPPET, add_special_tokens=False)
    assert sum(i in set(head.tolist()) for i in ids) >= 0.8 * len(ids)  # Python source is mostly head tokens
    assert make_drafter(draft, pair["target"]).head_tokens == len(head)  # type: ignore[union-attr]


def test_draft_is_at_most_a_tenth_of_the_target(pair) -> None:  # noqa: ANN001
    assert pair["draft"].n_params * 10 <= pair["target"].n_params


def test_early_exit_layer_is_recorded_and_valid(pair) -> None:  # noqa: ANN001
    layer = json.loads((pair["root"] / "target" / "config.json").read_text())["quickdraft_early_exit_layer"]
    assert 1 <= layer < pair["target"].config.n_layer


def test_tokenizer_round_trips_python_source() -> None:
    tokenizer = load_model(ASSETS / "target").tokenizer
    text = Path(quickdraft.__file__).read_text() + "\n\t# ünïcödé ✓\r\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("which", ["target", "draft"])
def test_transformers_loads_the_shipped_model_with_matching_logits(which: str, pair) -> None:  # noqa: ANN001
    transformers = pytest.importorskip("transformers")
    ours = pair[which]
    model_dir = pair["root"] / which
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = ours.tokenizer.encode(SNIPPET)
    assert hf_tokenizer(SNIPPET)["input_ids"] == ids
    tokens = torch.tensor([ids])
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours.model(tokens)
    relative = (got - expected).abs().max() / expected.abs().max()
    assert relative <= 1e-4, f"{pair['name']} {which}: logits differ from transformers' by {relative:.2e} (relative)"


def test_embedded_names_resolve_to_their_pair() -> None:
    from quickdraft.cli import resolve_target_and_drafter

    assert load_model("embedded-copy", tokenizer=False).path == ASSETS / "copy" / "target"
    for name, root in EMBEDDED_PAIRS.items():
        args = argparse.Namespace(target=name, draft=None, drafter=None)
        # the name loads the target; its default drafter is prompt lookup, then the pair's draft
        assert resolve_target_and_drafter(args) == (name, f"prompt-lookup+{root / 'draft'}")
    args = argparse.Namespace(target=str(ASSETS / "copy" / "target"), draft=None, drafter=None)
    assert resolve_target_and_drafter(args)[1] == f"prompt-lookup+{ASSETS / 'copy' / 'draft'}"
    args = argparse.Namespace(target="embedded", draft=str(ASSETS / "draft"), drafter=None)
    assert resolve_target_and_drafter(args)[1] == str(ASSETS / "draft")  # --draft: the draft model alone
    args = argparse.Namespace(target="embedded-copy", draft=None, drafter="prompt-lookup")
    assert resolve_target_and_drafter(args) == ("embedded-copy", "prompt-lookup")
    args = argparse.Namespace(target=None, draft=None, drafter=None)
    assert resolve_target_and_drafter(args) == (str(ASSETS / "target"), f"prompt-lookup+{ASSETS / 'draft'}")


def test_held_out_prompts_are_shipped() -> None:
    lines = (ASSETS / "prompts_heldout.jsonl").read_text().splitlines()
    prompts = [json.loads(line) for line in lines]
    assert len(prompts) >= 50
    assert all(p["prompt"].strip() and p["source"] for p in prompts)


def repeated_held_out_spans(model, n: int = 32, span: int = 40) -> torch.Tensor:  # noqa: ANN001
    """[n, 2 * span]: the first ``span`` tokens of ``n`` held-out prompts, each followed by itself."""
    lines = (ASSETS / "prompts_heldout.jsonl").read_text().splitlines()
    spans = [ids[:span] for ids in (model.tokenizer.encode(json.loads(line)["prompt"]) for line in lines)
             if len(ids) >= span][:n]
    assert len(spans) == n, "too few held-out prompts of span length"
    return torch.tensor([s + s for s in spans])


@pytest.mark.parametrize("which", ["target", "draft"])
def test_copy_pair_copies_its_context(which: str) -> None:
    """Prompt lookup pays on grounded prompts only if the target continues text it has seen; the
    draft must copy too, or it disagrees with the target wherever the target copies."""
    from quickdraft.train.copy_augment import repeat_top1

    model = load_model(ASSETS / "copy" / which)
    scores = repeat_top1(model.model, repeated_held_out_spans(model))
    assert scores["repeat_top1"] >= 0.6, scores
    assert scores["repeat_top1"] >= scores["first_top1"] + 0.25, scores


SELF_DRAFT = ASSETS / "target" / "self_draft"


@pytest.mark.skipif(not (SELF_DRAFT / "self_draft.json").exists(), reason="no shipped self-draft")
def test_the_default_target_ships_a_self_draft_that_keeps_greedy_exact_and_gets_accepted() -> None:
    from quickdraft.engine import Engine
    from quickdraft.model.self_draft import load_self_draft

    target = load_model(ASSETS / "target", dtype="auto")
    draft = load_self_draft(SELF_DRAFT, target)
    assert draft.model.head_ids is not None and draft.n_params < target.n_params  # shares the target's layers
    module_bytes = sum(f.stat().st_size for f in SELF_DRAFT.iterdir())
    assert module_bytes < 0.25 * (ASSETS / "target" / "model.safetensors").stat().st_size
    from quickdraft.bench.harness import load_prompts

    engine = Engine(target, "self", exact=True)  # found beside the target
    if kernels.int8_products():  # the draft's own quantised copy of the target's layers; the target keeps its own
        assert engine.drafter.model.native.layer_bits == 4 and engine.model.native.layer_bits is None
    untrained = Engine(target, "early-exit:1", exact=True)  # the same first layer, the target's own head
    accepted = {"self": [0, 0], "early-exit:1": [0, 0]}
    for prompt in [p["prompt"] for p in load_prompts(None, 8)]:
        plain = engine.generate(prompt, 48, gamma=0).token_ids
        for name, e in (("self", engine), ("early-exit:1", untrained)):
            result = e.generate(prompt, 48, gamma=4)
            assert result.token_ids == plain
            accepted[name][0] += result.stats.accepted
            accepted[name][1] += result.stats.drafted
    rate = {name: a / d for name, (a, d) in accepted.items()}
    # trained: most drafted tokens are the target's, far more than its first layer alone gets right
    assert rate["self"] > 0.6 and rate["self"] > 2 * rate["early-exit:1"], rate
