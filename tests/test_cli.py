"""The command line: generate --json, info, and errors as messages with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_factory import make_hf_checkpoint
from quickdraft import Engine
from quickdraft.cli import main
from quickdraft.model.loader import load_model
from tokenizer_factory import write_char_tokenizer


@pytest.fixture(scope="module")
def text_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    target = write_char_tokenizer(make_hf_checkpoint("llama", root / "target", seed=31))
    draft = write_char_tokenizer(make_hf_checkpoint("llama", root / "draft", seed=32, num_hidden_layers=1))
    return target, draft


def run_json(capsys, *args: str) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_reports_text_ids_and_statistics(text_models, capsys):
    target, draft = text_models
    out = run_json(capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f(x):",
                   "--max-new-tokens", "24", "--gamma", "3", "--json")
    assert len(out["token_ids"]) == 24
    engine = Engine(load_model(target), None)
    assert out["token_ids"] == engine.generate("def f(x):", 24, gamma=0).token_ids
    stats = out["stats"]
    for key in ("tokens", "seconds", "tokens_per_s", "acceptance_rate", "mean_accepted_length", "drafted",
                "accepted", "accepted_per_position", "target_calls", "drafter_calls", "peak_rss_bytes"):
        assert key in stats, key
    assert stats["tokens"] == 24 and stats["drafter"] == "draft-model"


def test_generate_without_draft_decodes_plainly(text_models, capsys):
    target, _ = text_models
    out = run_json(capsys, "generate", "--target", str(target), "--prompt", "x = ", "--max-new-tokens", "5",
                   "--temperature", "0.7", "--seed", "3", "--json")
    assert out["stats"]["drafted"] == 0 and len(out["token_ids"]) == 5


def test_generate_streams_text_to_stdout(text_models, capsys):
    target, draft = text_models
    assert main(["generate", "--target", str(target), "--drafter", "prompt-lookup", "--prompt", "abc abc ab",
                 "--max-new-tokens", "10"]) == 0
    captured = capsys.readouterr()
    assert "tokens/s" in captured.err and "acceptance" in captured.err


def test_info_describes_the_model(text_models, capsys):
    target, _ = text_models
    out = run_json(capsys, "info", str(target), "--json")
    assert out["architecture"] == "llama" and out["vocab_size"] == 96 and out["layers"] == 3
    assert out["parameters"] == load_model(target).n_params
    assert out["context_length"] == 512 and out["dtype"] == "float32"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature", "-1"], "temperature must be"),
        (["--top-p", "0"], "top_p must be in"),
        (["--max-new-tokens", "100000"], "exceeds the context"),
        (["--frequency-penalty", "3"], "frequency_penalty must be a number in [-2, 2]"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(text_models, capsys, args, message):
    target, _ = text_models
    assert main(["generate", "--target", str(target), "--prompt", "hi", *args]) == 2
    assert message in capsys.readouterr().err


def test_unknown_model_exits_2(tmp_path, capsys):
    assert main(["generate", "--target", str(tmp_path / "missing"), "--prompt", "hi"]) == 2
    assert "not found" in capsys.readouterr().err


def test_gamma_must_be_non_negative_or_auto(text_models, capsys):
    target, _ = text_models
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(target), "--prompt", "hi", "--gamma", "-1"])
    assert "gamma must be >= 0" in capsys.readouterr().err


def test_gamma_0_decodes_plainly_with_a_draft_given(text_models, capsys):
    target, draft = text_models
    out = run_json(capsys, "generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f(x):",
                   "--max-new-tokens", "12", "--gamma", "0", "--json")
    assert out["stats"]["drafted"] == 0 and out["stats"]["target_calls"] == 12


def test_no_draft_decodes_plainly(text_models, capsys):
    target, _ = text_models
    out = run_json(capsys, "generate", "--target", str(target), "--no-draft", "--prompt", "x = ",
                   "--max-new-tokens", "6", "--json")
    assert out["stats"]["drafter"] is None and out["stats"]["drafted"] == 0


def test_a_seed_gives_the_same_text_whatever_gamma(text_models, capsys):
    target, draft = text_models
    common = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f(x):",
              "--max-new-tokens", "24", "--temperature", "0.8", "--seed", "7", "--json"]
    texts = {run_json(capsys, *common, "--gamma", gamma)["text"] for gamma in ("0", "1", "4", "auto")}
    assert len(texts) == 1


def test_penalties_give_the_penalized_targets_own_greedy_text(text_models, capsys):
    target, draft = text_models
    common = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "def f(x):",
              "--max-new-tokens", "24", "--json"]
    penalties = ["--frequency-penalty", "1.0", "--presence-penalty", "0.5"]
    penalized = {g: run_json(capsys, *common, *penalties, "--gamma", g)["token_ids"] for g in ("0", "3", "auto")}
    assert penalized["0"] == penalized["3"] == penalized["auto"]
    assert penalized["0"] != run_json(capsys, *common, "--gamma", "0")["token_ids"]


def test_an_unknown_sampling_rule_exits_2(text_models, capsys):
    target, _ = text_models
    assert main(["generate", "--target", str(target), "--prompt", "hi", "--temperature", "1",
                 "--sampling-rule", "gumbel"]) == 2
    assert "rule must be one of" in capsys.readouterr().err


def test_loading_holds_the_weights_once(tmp_path):
    """What loading adds to the process stays within the weights + 15% (fused matrices are built
    tensor by tensor, and no memory map of the file stays resident), plus a fixed few MiB of
    first-use allocations that do not grow with the model."""
    import subprocess
    import sys

    model = make_hf_checkpoint("llama", tmp_path / "mid", seed=1, hidden_size=384, num_hidden_layers=6,
                               vocab_size=8192)
    out = subprocess.run([sys.executable, "-m", "quickdraft.cli", "info", str(model), "--json"],
                         capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["weight_bytes"] > 50_000_000
    assert info["rss_added_by_loading_bytes"] <= 1.15 * info["weight_bytes"] + 8 * 2**20


def test_generate_with_the_shipped_self_draft_matches_plain_decoding(capsys):
    """`--drafter self` on the default target finds its self-draft beside it (no draft model loaded)."""
    from quickdraft.assets import default_target_path
    from quickdraft.model.self_draft import is_self_draft_dir

    target = default_target_path()
    if not is_self_draft_dir(Path(target) / "self_draft"):
        pytest.skip("no shipped self-draft")
    out = run_json(capsys, "generate", "--drafter", "self", "--prompt", "def f(x):", "--max-new-tokens", "24",
                   "--gamma", "3", "--json")
    plain = run_json(capsys, "generate", "--no-draft", "--prompt", "def f(x):", "--max-new-tokens", "24", "--json")
    assert out["stats"]["drafter"] == "self-draft" and out["stats"]["drafted"] > 0
    assert out["token_ids"] == plain["token_ids"]


def test_lookup_then_the_embedded_pairs_own_draft_matches_plain_decoding(capsys):
    """`--drafter prompt-lookup+` on an embedded target: lookup, then the pair's draft model."""
    prompt = "def area(w, h):\n    return w * h\n\n\ndef area(w, h):"
    out = run_json(capsys, "generate", "--drafter", "prompt-lookup+", "--prompt", prompt, "--max-new-tokens", "24",
                   "--json")
    plain = run_json(capsys, "generate", "--no-draft", "--prompt", prompt, "--max-new-tokens", "24", "--json")
    assert out["stats"]["drafter"] == "prompt-lookup+draft-model" and out["stats"]["drafted"] > 0
    assert out["token_ids"] == plain["token_ids"]


def test_generate_does_not_import_the_compiler():
    """`quickdraft generate` compiles nothing by default: building the engine and decoding must not
    import torch._dynamo (~0.8 s of its start-up; the loader's meta-device models and the unused
    compiled-step wrappers used to)."""
    import subprocess
    import sys

    script = ("import sys; from quickdraft.cli import main; "
              "main(['generate', '--prompt', 'def f(x):', '--max-new-tokens', '8']); "
              "print('DYNAMO', 'torch._dynamo' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "DYNAMO False"
