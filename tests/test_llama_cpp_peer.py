"""llama.cpp as a bench peer: parsing its real output, the errors when it is missing, the bench flag.

The fixtures in fixtures/llama_cpp/ are real output of the build scripts/llama_cpp/build.sh makes
(llama.cpp 0.5.0-dev, commit 0c1e570, from llama-cpp-python 0.3.36), on the embedded pair in fp32,
16 new tokens; each *.command file holds the command line that made it. The tests that run
llama.cpp itself are skipped when no build is found.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from quickdraft.assets import default_draft_path, default_target_path, embedded_pair_available
from quickdraft.bench.harness import LLAMA_CPP_DRAFT, LLAMA_CPP_PLAIN, BenchSettings, Bench
from quickdraft.bench.llama_cpp import (
    ENV_VAR,
    LlamaCpp,
    LlamaCppError,
    find_bin_dir,
    gguf_path,
    parse_plain,
    parse_speculative,
    same_output,
    token_bytes,
)
from quickdraft.model.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "llama_cpp"
# Our engine's plain greedy output (fp32, EOS ignored) for fixtures/llama_cpp/prompt.txt, 16 tokens.
OUR_GREEDY_16 = [274, 332, 324, 519, 15, 502, 9, 502, 10, 200, 200, 316, 573, 64, 502, 9]

needs_pair = pytest.mark.skipif(not embedded_pair_available(), reason="the embedded model pair is not installed")


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    if not embedded_pair_available():
        pytest.skip("the embedded model pair is not installed")
    return Tokenizer.from_dir(Path(default_target_path()))


def test_plain_run_is_timed_by_llamas_eval_and_sampling_lines_not_its_loading() -> None:
    run = parse_plain(fixture("plain.stdout"), fixture("plain.stderr").decode(), requested=16)
    assert run.n_tokens == 16 and run.decode_tokens == 15  # the first token comes from the prompt's forward
    # eval time = 56.95 ms / 15 runs, sampling time = 0.51 ms in the captured log
    assert run.decode_seconds == pytest.approx((56.95 + 0.51) / 1000)
    assert run.prompt_tokens == 28
    assert run.text == fixture("plain.stdout")[:-2]  # the tool's closing "\n\n" is not generated text
    assert run.seconds_for(30) == pytest.approx(run.decode_seconds / 15 * 30)


def test_plain_run_that_decoded_a_different_count_is_refused() -> None:
    with pytest.raises(LlamaCppError, match="decoded 15 tokens after the prompt, expected 31"):
        parse_plain(fixture("plain.stdout"), fixture("plain.stderr").decode(), requested=32)


def test_speculative_run_reports_llamas_decode_line_and_acceptance() -> None:
    prompt = fixture("prompt.txt")
    run = parse_speculative(fixture("speculative.stdout"), fixture("speculative.stderr").decode(), prompt)
    # "decoded 25 tokens in 0.062 seconds", n_drafted = 34, n_accept = 20: its last step kept a
    # whole accepted draft, past the 16 asked for
    assert (run.n_tokens, run.decode_tokens, run.decode_seconds) == (25, 25, pytest.approx(0.062))
    assert (run.drafted, run.accepted) == (34, 20)
    plain = parse_plain(fixture("plain.stdout"), fixture("plain.stderr").decode(), requested=16)
    assert run.text.startswith(plain.text) and len(run.text) > len(plain.text)


def test_speculative_run_whose_closing_newlines_were_lost_at_exit_still_parses() -> None:
    # llama.cpp's logger can drop a process's last line at exit: here the closing "\n\n"
    stdout = fixture("speculative.stdout")
    whole = parse_speculative(stdout, fixture("speculative.stderr").decode(), fixture("prompt.txt"))
    cut = parse_speculative(stdout[:-2], fixture("speculative.stderr").decode(), fixture("prompt.txt"))
    assert whole.text == cut.text + b"\n\n" and whole.n_tokens == cut.n_tokens


def test_speculative_run_whose_prompt_echo_differs_is_refused() -> None:
    with pytest.raises(LlamaCppError, match="tokenization of the prompt differs"):
        parse_speculative(fixture("speculative.stdout"), fixture("speculative.stderr").decode(), b"import yaml")


def test_output_without_timing_lines_names_the_missing_line() -> None:
    with pytest.raises(LlamaCppError, match="eval time"):
        parse_plain(fixture("plain.stdout"), "no timings here", requested=16)


def test_llama_cpp_greedy_text_equals_our_greedy_bytes(tokenizer: Tokenizer) -> None:
    ours = token_bytes(tokenizer, OUR_GREEDY_16)
    plain = parse_plain(fixture("plain.stdout"), fixture("plain.stderr").decode(), requested=16)
    speculative = parse_speculative(fixture("speculative.stdout"), fixture("speculative.stderr").decode(),
                                    fixture("prompt.txt"))
    assert same_output(plain, ours, len(OUR_GREEDY_16))
    assert same_output(speculative, ours, len(OUR_GREEDY_16))  # 25 tokens: ours is its prefix
    assert not same_output(plain, ours + b"x", len(OUR_GREEDY_16))
    assert not same_output(plain, ours[:-1], len(OUR_GREEDY_16))  # same count: bytes must be equal, not a prefix


def test_token_bytes_are_the_utf8_bytes_even_inside_a_character(tokenizer: Tokenizer) -> None:
    for text in ("def f(x):\n    return x", "naïve café — 東京 🦙", "\t\r\n  \x00"):
        ids = tokenizer.encode(text)
        assert token_bytes(tokenizer, ids) == text.encode()
        assert b"".join(token_bytes(tokenizer, [i]) for i in ids) == text.encode()
    assert token_bytes(tokenizer, [tokenizer.eos_token_id]) == b"<|endoftext|>"


def test_missing_build_directory_names_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(LlamaCppError, match=r"does not exist; build it with scripts/llama_cpp/build\.sh"):
        find_bin_dir(tmp_path / "nowhere")
    (tmp_path / "build" / "bin").mkdir(parents=True)
    (tmp_path / "build" / "bin" / "llama-completion").touch()  # one tool of the two
    with pytest.raises(LlamaCppError, match="no llama-completion and llama-speculative-simple in"):
        find_bin_dir(tmp_path)
    (tmp_path / "build" / "bin" / "llama-speculative-simple").touch()
    assert find_bin_dir(tmp_path) == tmp_path / "build" / "bin"


@needs_pair
def test_missing_gguf_names_the_convert_script(tmp_path: Path) -> None:
    with pytest.raises(LlamaCppError, match=re.escape(f"scripts/llama_cpp/convert.sh {tmp_path}")):
        gguf_path(tmp_path, default_target_path(), "fp32")
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "embedded-draft-bf16.gguf").touch()
    assert gguf_path(tmp_path, default_draft_path(), "bf16") == tmp_path / "gguf" / "embedded-draft-bf16.gguf"
    (tmp_path / "gguf" / "embedded-copy-target-f32.gguf").touch()
    assert gguf_path(tmp_path, "embedded-copy", "fp32") == tmp_path / "gguf" / "embedded-copy-target-f32.gguf"
    with pytest.raises(LlamaCppError, match="fp32 and bf16 only, not fp16"):
        gguf_path(tmp_path, default_draft_path(), "fp16")


def test_a_model_outside_the_embedded_pairs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LlamaCppError, match="embedded pairs only"):
        gguf_path(tmp_path, tmp_path / "my-model", "fp32")


def test_bench_flag_and_environment_variable_name_the_llama_cpp_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    from quickdraft.bench.cli import settings_from_args
    from quickdraft.cli import build_parser

    monkeypatch.delenv(ENV_VAR, raising=False)
    args = build_parser().parse_args(["bench", "--llama-cpp", "/opt/llama"])
    assert settings_from_args(args).llama_cpp == "/opt/llama"
    assert settings_from_args(build_parser().parse_args(["bench"])).llama_cpp is None
    monkeypatch.setenv(ENV_VAR, "/from/env")
    assert settings_from_args(build_parser().parse_args(["bench"])).llama_cpp == "/from/env"
    assert settings_from_args(build_parser().parse_args(["bench", "--llama-cpp", "/flag"])).llama_cpp == "/flag"


@needs_pair
def test_bench_with_a_missing_build_fails_before_measuring(tmp_path: Path) -> None:
    settings = BenchSettings.quick(target=default_target_path(), draft=default_draft_path(), dtype="fp32",
                                   llama_cpp=str(tmp_path / "nowhere"), peers=False, prompt_limit=1)
    with pytest.raises(LlamaCppError, match="build.sh"):
        Bench(settings, progress=False).run()


# ---- with a build --------------------------------------------------------------------------------
def _llama_cpp_root() -> Path | None:
    root = Path(os.environ.get(ENV_VAR) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "quickdraft" / "llama.cpp")
    try:
        find_bin_dir(root)
        gguf_path(root, default_target_path(), "fp32")
        gguf_path(root, default_draft_path(), "fp32")
    except Exception:  # noqa: BLE001 - any missing piece means: no build to test against
        return None
    return root


needs_build = pytest.mark.skipif(_llama_cpp_root() is None,
                                 reason=f"no llama.cpp build with GGUFs (set {ENV_VAR}, or run "
                                        "scripts/llama_cpp/build.sh and scripts/llama_cpp/convert.sh)")


@needs_build
def test_llama_cpp_tokenizes_every_bench_prompt_as_we_do(tokenizer: Tokenizer) -> None:
    from quickdraft.bench.harness import load_prompts

    peer = LlamaCpp.for_models(_llama_cpp_root(), default_target_path(), None, "fp32", "fp32", threads=1)
    for prompt in load_prompts():
        assert peer.tokenize(prompt["prompt"]) == tokenizer.encode(prompt["prompt"]), prompt["id"]


@needs_build
def test_bench_rows_for_llama_cpp_equal_our_greedy_output(tmp_path: Path) -> None:
    settings = BenchSettings.quick(target=default_target_path(), draft=default_draft_path(), dtype="fp32",
                                   llama_cpp=str(_llama_cpp_root()), peers=False, prompt_limit=2, repeats=1,
                                   gammas=(), exact=False, early_exit=None, prompt_lookup=None, threads=1)
    rows = {r["method"]: r for r in Bench(settings, progress=False).run()["results"]}
    for name in (LLAMA_CPP_PLAIN, LLAMA_CPP_DRAFT):
        assert rows[name]["equals_plain"], name
        assert rows[name]["tokens_per_s"] > 0 and rows[name]["tokens"] == 2 * 32
    assert 0 < rows[LLAMA_CPP_DRAFT]["acceptance_rate"] <= 1


def test_the_llama_cpp_ratios_compare_decode_rates_as_llama_cpp_times_itself() -> None:
    """llama.cpp's rate excludes prompt processing, so the headline ratio uses our decode-only rate;
    the wall-clock ratio (our prefill included) is kept beside it."""
    from quickdraft.bench.harness import BASELINE, LLAMA_CPP_PLAIN, headline_figures

    def row(method: str, family: str, tokens_per_s: float, decode: float | None) -> dict:
        return {"method": method, "family": family, "exact": False, "decoding": "greedy", "speedup": 1.0,
                "tokens_per_s": tokens_per_s, "decode_tokens_per_s": decode}

    rows = [row(BASELINE, "plain", 100.0, 120.0), row(LLAMA_CPP_PLAIN, "llama-cpp-plain", 200.0, None)]
    figures = headline_figures(rows)["plain_vs_llama_cpp_plain"]
    assert figures["ratio"] == pytest.approx(0.6) and figures["ratio_wall"] == pytest.approx(0.5)
