"""`quickdraft bench` end to end on a tiny random pair, with tiny settings: the report has its
structure and its plots, and greedy speculative outputs equal plain greedy. No timing asserts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from hf_factory import make_hf_checkpoint  # noqa: E402

from quickdraft.bench.harness import alpha_from_steps, load_prompts, warmup_prompts  # noqa: E402
from quickdraft.cli import main  # noqa: E402
from quickdraft.model.loader import default_draft_dtype, dtype_name, load_model  # noqa: E402
from quickdraft.model.weights import save_pretrained  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench-pair")
    target = make_hf_checkpoint("llama", root / "target", seed=11, num_hidden_layers=2, hidden_size=64)
    # A related draft (the target plus noise) so that some drafts are accepted.
    loaded = load_model(target, tokenizer=False)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.2 * p.std())
    save_pretrained(loaded.model, root / "draft")
    return target, root / "draft"


def test_shipped_prompt_set_has_continuations_and_grounded_tasks() -> None:
    prompts = load_prompts()
    kinds = {p["kind"] for p in prompts}
    assert kinds == {"continuation", "grounded"}
    assert len({p["id"] for p in prompts}) == len(prompts)
    assert {p["kind"] for p in load_prompts(limit=2)} == kinds  # a limit keeps both kinds
    # Byte-level BPE merges a newline with the next line's indentation: a prompt ending in a bare
    # newline ends on a token boundary the model never saw in training, and derails it.
    assert not [p["id"] for p in prompts if p["prompt"] != p["prompt"].rstrip()]


def test_alpha_counts_a_fully_accepted_step_as_no_rejection() -> None:
    assert alpha_from_steps([(4, 4)]) == 1.0
    assert alpha_from_steps([(4, 1)]) == pytest.approx(1 / 2)  # one accepted, then one rejection
    assert alpha_from_steps([(2, 2), (3, 0)]) == pytest.approx(2 / 3)
    assert alpha_from_steps([]) is None


def test_warm_up_covers_every_cache_size_of_the_measured_rounds() -> None:
    # with 100 new tokens and max_gamma 8: prompts up to 147 tokens need a 256-slot cache, then 512
    short, mid, long = [1] * 20, [2] * 140, [3] * 300
    assert warmup_prompts([mid, short], 100, 8) == [mid]  # one size: its longest prompt
    assert warmup_prompts([short, long, mid], 100, 8) == [mid, long]
    assert warmup_prompts([long], 100, 8) == [long]


def test_the_bench_measures_the_embedded_targets_self_draft_alone_and_behind_prompt_lookup(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = main(["bench", "--target", "embedded", "--drafter", "prompt-lookup+self", "--out", str(out),
                 "--prompt-limit", "2", "--max-new-tokens", "12", "--repeats", "1", "--gammas", "2",
                 "--sampling-gammas", "2", "--trees", "", "--threads", "1", "--clock", "cpu", "--no-peers",
                 "--no-plots", "--no-compile-target", "--no-exact"])
    assert code == 0
    capsys.readouterr()
    rows = {r["method"]: r for r in json.loads((out / "bench.json").read_text())["results"]}
    for name in ("self-draft auto", "prompt lookup + self-draft auto", "prompt lookup + draft auto",
                 "self-draft auto T=0.8", "prompt lookup + self-draft auto T=0.8"):
        assert rows[name]["equals_plain"], name  # greedy, and seeded sampling under the coupled rule
    assert rows["prompt lookup + self-draft auto"]["family"] == "lookup+self-draft"
    assert rows["prompt lookup + self-draft auto"]["mean_accepted_length"] > 0


def test_bench_reports_every_configuration_and_greedy_outputs_equal_plain(pair, tmp_path, capsys) -> None:
    target, draft = pair
    out = tmp_path / "out"
    # Eager target steps: building the compiled ones takes ~45 s, and test_compiled_drafter.py proves
    # them (exact mode bit-identical on them); this test is about what the bench measures and reports.
    code = main(["bench", "--target", str(target), "--draft", str(draft), "--out", str(out), "--prompt-limit", "2",
                 "--max-new-tokens", "10", "--repeats", "1", "--gammas", "1,3", "--sampling-gammas", "2",
                 "--threads", "1", "--clock", "cpu", "--no-compile-target"])
    assert code == 0
    assert "| method |" in capsys.readouterr().out
    report = json.loads((out / "bench.json").read_text())
    for name in ("bench.md", "speedup_vs_gamma.png", "tokens_per_s.png"):
        assert (out / name).stat().st_size > 0
    rows = {r["method"]: r for r in report["results"]}
    expected = {"plain", "plain exact", "draft γ=1", "draft γ=3", "draft auto", "draft auto exact",
                "early exit auto", "prompt lookup auto", "prompt lookup + draft auto", "plain T=0.8", "draft γ=2 T=0.8", "draft auto T=0.8",
                "draft auto rejection T=0.8", "draft tree 16", "draft tree 16 exact", "plain exact tree 16"}
    assert expected <= set(rows)
    # exact mode's promise is per engine: a tree engine's exact rows are held to its own plain decoding
    assert rows["draft tree 16 exact"]["equals_plain_reference"] == "plain exact tree 16"
    assert rows["plain"]["speedup"] == pytest.approx(1.0)
    assert rows["plain T=0.8"]["speedup"] == pytest.approx(1.0)  # sampling runs are measured against plain sampling
    assert rows["plain"]["speedup_by_kind"] == pytest.approx({"continuation": 1.0, "grounded": 1.0})
    assert set(rows["prompt lookup auto"]["speedup_by_kind"]) == {"continuation", "grounded"}
    settings = report["settings"]
    assert settings["dtype"] in ("fp32", "bf16")
    assert settings["draft_dtype"] == dtype_name(default_draft_dtype(settings["dtype"]))
    assert rows["draft auto T=0.8"]["baseline"] == "plain T=0.8"
    assert rows["draft auto rejection T=0.8"]["rule"] == "rejection" and "equals_plain" not in rows["draft auto rejection T=0.8"]
    for row in rows.values():
        assert row["tokens"] == 2 * 10  # EOS ignored: every method generates max_new_tokens per prompt
        assert row["tokens_per_s"] > 0
        if row["family"] in ("draft", "early-exit", "prompt-lookup", "lookup+draft"):
            for key in ("alpha", "acceptance_rate", "mean_accepted_length", "cost", "bound", "efficiency",
                        "per_position_acceptance"):
                assert key in row
            # auto γ may decode a short run plainly throughout (no γ expected to pay): then nothing was drafted
            assert (row["cost"] is not None and row["cost"] >= 0) or (row["gamma"] == "auto" and not row["draft_steps_fraction"])
            assert len(row["per_position_acceptance"]) <= 8
        reference_row = row["family"] == "plain" and row["tree"] is not None  # a tree engine's own plain decoding
        if row["decoding"] == "greedy" and not row["peer"] and not reference_row:
            assert row["equals_plain"], f"{row['method']}: greedy output differs from plain greedy"
        if row["rule"] == "auto":  # seeded sampling, coupled rule: the same tokens as seeded plain sampling
            assert row["equals_plain"], f"{row['method']}: seeded output differs from seeded plain sampling"
    assert rows["draft γ=3"]["alpha"] > 0  # the related draft is sometimes right
    headline = report["headline"]
    assert headline["best_draft_greedy"]["method"] in rows and headline["best_draft_sampling"]["method"] in rows
    assert any(note.startswith("exact mode: ") for note in report["notes"])
    if report["machine"]["transformers"]:
        assert {"hf plain", "hf assisted", "hf prompt lookup (10)", "hf plain T=0.8"} <= set(rows)
