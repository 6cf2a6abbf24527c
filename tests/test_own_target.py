"""Bring your own target: `quickdraft train self-draft` and `quickdraft train draft` on a model the
project did not train, of another architecture (GPT-2) and with another tokenizer (characters, 96
tokens), trained briefly here on standard-library text. The drafters they make load, pass the
vocabulary check, and keep greedy output bit-identical to plain decoding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_factory import hf_config, make_hf_checkpoint
from quickdraft.cli import main as cli_main
from quickdraft.engine import Engine
from quickdraft.errors import ModelFormatError, QuickdraftError
from quickdraft.model.loader import load_model
from quickdraft.model.self_draft import (
    CONFIG_FILE,
    SelfDraftModule,
    SelfDraftShape,
    compose,
    load_self_draft,
    save_self_draft,
)
from quickdraft.train.corpus import stdlib_dir
from quickdraft.train.self_draft import frequent_tokens
from quickdraft.train.text_data import prepare_token_data, stream_dtype
from tokenizer_factory import make_char_tokenizer, write_char_tokenizer

SOURCES = ["argparse.py", "textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "glob.py", "copy.py",
           "string.py", "keyword.py", "numbers.py", "colorsys.py"]
PROMPTS = ["def main(argv=None):\n    ", "import os\n\n\nclass ", "    for name in sorted(", "    return self."]
LOOP_FLAGS = ["--batch-size", "8", "--seq-len", "64", "--eval-batches", "2", "--checkpoint-minutes", "100",
              "--threads", "1", "--warmup-steps", "5"]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text")
    for name in SOURCES:
        shutil.copyfile(stdlib_dir() / name, root / name)
    (root / "nested").mkdir()
    (root / "nested" / "notes.txt").write_text("def helper(value):\n    return value\n" * 20)
    (root / "image.bin").write_bytes(bytes(range(256)) * 8)  # not UTF-8: skipped
    return root


@pytest.fixture(scope="module")
def gpt2_target(tmp_path_factory: pytest.TempPathFactory, text_dir: Path) -> Path:
    """A 4-layer GPT-2 with a character tokenizer, trained for 120 steps by transformers itself."""
    import transformers

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("gpt2_target")
    model = transformers.GPT2LMHeadModel(hf_config("gpt2", vocab_size=96, num_hidden_layers=4, hidden_size=64))
    tokenizer = make_char_tokenizer()
    text = "".join((text_dir / name).read_text() for name in SOURCES)
    tokens = torch.tensor(tokenizer.encode(text).ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(120):
        starts = torch.randint(0, tokens.numel() - 65, (16,), generator=generator)
        batch = torch.stack([tokens[s:s + 65] for s in starts])
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 3.0  # it learned something: uniform over 96 tokens is 4.56
    model.save_pretrained(out)
    write_char_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def self_draft_dir(gpt2_target: Path, text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("self_draft")
    code = cli_main(["train", "self-draft", "--kind", "exit", "--target", str(gpt2_target), "--data", str(text_dir),
                     "--out", str(out), "--head-tokens", "48", "--max-steps", "60", "--lr", "3e-3", "--generations", "8",
                     *LOOP_FLAGS])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def feature_draft_dir(gpt2_target: Path, text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("feature_draft")
    code = cli_main(["train", "self-draft", "--kind", "feature", "--target", str(gpt2_target), "--data", str(text_dir),
                     "--out", str(out), "--head-tokens", "48", "--mlp-size", "64", "--max-steps", "150", "--lr", "3e-3",
                     "--generations", "8", *LOOP_FLAGS])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def draft_dir(gpt2_target: Path, text_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("draft")
    code = cli_main(["train", "draft", "--target", str(gpt2_target), "--data", str(text_dir), "--out", str(out),
                     "--max-steps", "60", "--generations", "8", "--head-tokens", "48", *LOOP_FLAGS])
    assert code == 0
    return out / "final"


def _greedy_outputs(engine: Engine, **kwargs) -> list[list[int]]:
    return [engine.generate(prompt, 48, **kwargs).token_ids for prompt in PROMPTS]


def test_self_draft_training_raises_agreement_with_the_target(self_draft_dir: Path) -> None:
    summary = json.loads((self_draft_dir / "summary.json").read_text())
    # validation agreement of the draft's argmax with the target's: the truncated target, then trained
    assert summary["val_agree"] > summary["initial_val_agree"] + 0.05, summary
    meta = json.loads((self_draft_dir / CONFIG_FILE).read_text())
    assert (meta["exit_layer"], meta["adapter_layers"], meta["head_tokens"]) == (1, 1, 48)
    assert meta["target"]["model_type"] == "gpt2"
    data = json.loads((self_draft_dir / "data" / "streams.json").read_text())
    assert data["documents"] == len(SOURCES) + 1  # the nested text file counts, the binary one does not


def test_self_draft_trains_further_from_a_saved_one_on_sampled_text_with_the_tv_term(
        gpt2_target: Path, text_dir: Path, self_draft_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "further"
    code = cli_main(["train", "self-draft", "--target", str(gpt2_target), "--data", str(text_dir), "--out", str(out),
                     "--kind", "exit", "--init-from", str(self_draft_dir), "--max-steps", "20", "--lr", "1e-3",
                     "--generations", "8",
                     "--sampled-generations", "8", "--tv-weight", "1", *LOOP_FLAGS])
    assert code == 0
    saved = json.loads((self_draft_dir / "summary.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    # it starts from the saved module's weights: the same validation figures before any step
    assert summary["initial_val_agree"] == pytest.approx(saved["val_agree"], abs=1e-6)
    assert summary["initial_val_loss"] == pytest.approx(saved["val_loss"], abs=1e-5)
    assert (summary["sampled_generations"], summary["tv_weight"], summary["generations"]) == (8, 1.0, 16)
    assert 0 < summary["val_accept_t0.8"] <= 1
    assert (out / "generations_t0.8.npy").exists()
    meta = json.loads((out / CONFIG_FILE).read_text())
    assert (meta["exit_layer"], meta["adapter_layers"], meta["head_tokens"]) == (1, 1, 48)  # the saved shape


def test_self_draft_greedy_is_bit_identical_to_plain_decoding(gpt2_target: Path, self_draft_dir: Path) -> None:
    engine = Engine(gpt2_target, f"self:{self_draft_dir}", exact=True, tree_nodes=8)
    assert engine.drafter is not None and engine.drafter.name == "self-draft"
    plain = _greedy_outputs(engine, gamma=0)
    for gamma in (1, 3, "auto"):
        assert _greedy_outputs(engine, gamma=gamma, tree=False) == plain, gamma
    assert _greedy_outputs(engine, tree=True) == plain
    # the continuous-batching scheduler drafts for every sequence at once with the same module
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, 48, gamma=3)] == plain
    stats = engine.generate(PROMPTS[0], 48, gamma=3, tree=False).stats
    assert stats.drafted > 0 and stats.accepted > 0  # a trained self-draft gets tokens accepted


def test_a_feature_draft_trains_for_any_target_and_keeps_greedy_exact(gpt2_target: Path,
                                                                                  feature_draft_dir: Path) -> None:
    summary = json.loads((feature_draft_dir / "summary.json").read_text())
    # agreement with the target's argmax, from true features and from its own: the initialisation, then trained
    assert summary["val_agree_true"] > summary["initial_val_agree_true"] + 0.05, summary
    assert summary["val_agree_own"] > summary["initial_val_agree_own"] + 0.05, summary
    meta = json.loads((feature_draft_dir / CONFIG_FILE).read_text())
    assert (meta["format"], meta["head_tokens"], meta["mlp_size"]) == ("quickdraft-feature-draft", 48, 64)
    engine = Engine(gpt2_target, f"self:{feature_draft_dir}", exact=True)  # GPT-2: the per-op path throughout
    assert engine.drafter is not None and engine.drafter.name == "feature-draft"
    plain = _greedy_outputs(engine, gamma=0)
    for gamma in (1, 3, "auto"):
        assert _greedy_outputs(engine, gamma=gamma, tree=False) == plain, gamma
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, 48, gamma=3)] == plain
    stats = engine.generate(PROMPTS[0], 48, gamma=3, tree=False).stats
    assert stats.accepted > stats.drafted / 4  # a trained feature draft gets its tokens accepted


def _feature_draft_trained_on(gpt2_target: Path, text_dir: Path, init_from: Path, out: Path, *, steps: int,
                              flags: tuple[str, ...] = ()) -> dict:
    """`train self-draft --kind feature --init-from` a saved self-draft, for ``steps`` steps: its summary."""
    code = cli_main(["train", "self-draft", "--kind", "feature", "--target", str(gpt2_target), "--data", str(text_dir),
                     "--out", str(out), "--init-from", str(init_from), "--max-steps", str(steps), "--generations", "8",
                     *flags, *LOOP_FLAGS])
    assert code == 0
    return json.loads((out / "summary.json").read_text())


def test_a_feature_draft_trains_further_from_a_saved_one_with_the_tv_term(
        gpt2_target: Path, text_dir: Path, feature_draft_dir: Path, tmp_path: Path) -> None:
    summary = _feature_draft_trained_on(gpt2_target, text_dir, feature_draft_dir, tmp_path / "further", steps=5,
                                        flags=("--tv-weight", "1", "--sampled-generations", "8"))
    saved = json.loads((feature_draft_dir / "summary.json").read_text())
    assert summary["initial_val_agree_true"] == pytest.approx(saved["val_agree_true"], abs=1e-6)
    assert (summary["head_tokens"], summary["mlp_size"]) == (48, 64)
    assert (summary["tv_weight"], summary["tv_temperature"], summary["sampled_generations"]) == (1.0, 0.8, 8)
    # the term is the rejection rate at T = 0.8, the figure the first drafted token's acceptance reports
    assert summary["val_tv_true"] == pytest.approx(1 - summary["val_accept_t0.8"], abs=1e-5)
    assert 0 < summary["val_tv_own"] < 1


def test_an_exit_adapter_trains_on_as_a_feature_draft_that_holds_the_latest_feature(
        gpt2_target: Path, text_dir: Path, self_draft_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fed"
    summary = _feature_draft_trained_on(gpt2_target, text_dir, self_draft_dir, out, steps=20)
    adapter = json.loads((self_draft_dir / "summary.json").read_text())
    # before training it is the adapter: its first drafted token agrees as the adapter's did (over
    # positions 1.. where the adapter's figure counts position 0 too)
    assert summary["initial_val_agree_true"] == pytest.approx(adapter["val_agree"], abs=0.03)
    assert summary["val_agree_own3"] > 0  # its third drafted token, the feature two positions stale
    meta = json.loads((out / CONFIG_FILE).read_text())
    assert (meta["exit_layer"], meta["feedback"], meta["head_tokens"]) == (1, "latest", 48)
    engine = Engine(gpt2_target, f"self:{out}", exact=True)
    assert _greedy_outputs(engine, gamma=3) == _greedy_outputs(engine, gamma=0)


def test_a_draft_trained_for_any_target_loads_everywhere_and_keeps_greedy_exact(gpt2_target: Path,
                                                                                draft_dir: Path) -> None:
    import transformers

    assert transformers.AutoModelForCausalLM.from_pretrained(draft_dir) is not None
    target = load_model(gpt2_target)
    draft = load_model(draft_dir)
    assert draft.config.vocab_size == target.config.vocab_size and draft.n_params < target.n_params / 3
    assert (draft_dir / "tokenizer.json").read_text() == (gpt2_target / "tokenizer.json").read_text()
    engine = Engine(target, draft_dir, exact=True)  # the vocabulary check runs here
    # it drafts over the 48 tokens most frequent in its training stream (--head-tokens 48)
    assert engine.drafter.head_tokens == 48  # type: ignore[union-attr]
    summary = json.loads((draft_dir.parent / "summary.json").read_text())["draft_head"]
    assert summary["head_tokens"] == 48 and summary["text_covered"] > 0.9
    plain = _greedy_outputs(engine, gamma=0)
    assert _greedy_outputs(engine, gamma=3) == plain
    assert engine.generate(PROMPTS[0], 48, gamma=3).stats.accepted > 0


def test_a_draft_trains_on_over_its_cut_head_and_keeps_that_head(gpt2_target: Path, text_dir: Path, draft_dir: Path,
                                                                 tmp_path: Path) -> None:
    """--head-loss fine-tunes a draft as it drafts: over the head it came with (kept, not recounted),
    and the result keeps greedy output exact."""
    out = tmp_path / "head_loss"
    code = cli_main(["train", "draft", "--target", str(gpt2_target), "--data", str(text_dir), "--out", str(out),
                     "--init-from", str(draft_dir), "--head-tokens", "48", "--head-loss", "--max-steps", "20",
                     "--generations", "8", *LOOP_FLAGS])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    history = json.loads((out / "history.json").read_text())
    assert summary["head_loss"] is True and "head_ce" in history[0] and "kl" not in history[0]
    # the head file it came with, its count of the text included
    assert (out / "final" / "draft_head.json").read_text() == (draft_dir / "draft_head.json").read_text()
    engine = Engine(gpt2_target, out / "final", exact=True)
    assert _greedy_outputs(engine, gamma=3) == _greedy_outputs(engine, gamma=0)
    refused = cli_main(["train", "draft", "--target", str(gpt2_target), "--data", str(text_dir),
                        "--out", str(tmp_path / "refused"), "--head-tokens", "0", "--head-loss", "--max-steps", "2",
                        "--generations", "8", *LOOP_FLAGS])
    assert refused != 0 and not (tmp_path / "refused").exists()  # before anything loads or is written


def test_self_draft_of_another_target_is_refused_with_a_clear_error(self_draft_dir: Path, tmp_path: Path) -> None:
    other = load_model(make_hf_checkpoint("gpt2", tmp_path / "other", num_hidden_layers=4, hidden_size=32))
    with pytest.raises(QuickdraftError, match="trained for another target"):
        load_self_draft(self_draft_dir, other)
    with pytest.raises(ModelFormatError, match="train one with `quickdraft train self-draft"):
        Engine(other, "self")  # no TARGET/self_draft


@pytest.mark.parametrize("arch,adapter_mlp", [("llama", True), ("qwen2", True), ("llama", False)])
def test_a_subset_head_scatters_its_logits_and_drafts_only_its_tokens(arch: str, adapter_mlp: bool,
                                                                      tmp_path: Path) -> None:
    target = load_model(make_hf_checkpoint(arch, tmp_path / "t", num_hidden_layers=3, hidden_size=64))
    head_ids = torch.tensor([0, 5, 9, 17, 40, 41, 63, 80])
    module = SelfDraftModule.initialised_from(target.model, SelfDraftShape(1, 1, 8, adapter_mlp), head_ids)
    draft = compose(target.model, module)
    tokens = torch.tensor([[3, 7, 11, 2]])
    logits = draft(tokens)[0]  # [T, vocab]
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[head_ids] = False
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, head_ids]).all()
    # the scattered rows are the head's own: layer 1, the adapter (a copy of layer 1), norm, subset head
    streams: list[torch.Tensor] = []
    target.model.hidden_states(tokens, collect=streams)
    expected = module.logits(target.model, streams[0])[0]
    torch.testing.assert_close(logits[:, head_ids], expected, rtol=0, atol=0)
    if draft.pack_products() and draft.native is not None:  # the C++ forward, attention-only layers included
        cached = draft(tokens, 0, draft.new_cache(16))[0]
        torch.testing.assert_close(cached[:, head_ids], expected, rtol=1e-4, atol=1e-4)
        assert torch.isinf(cached[:, outside]).all()
    save_self_draft(module, target.config, tmp_path / "sd")
    engine = Engine(target, f"self:{tmp_path / 'sd'}", exact=True)
    plain = engine.generate([3, 7, 11], 32, gamma=0).token_ids
    result = engine.generate([3, 7, 11], 32, gamma=4)
    assert result.token_ids == plain and result.stats.drafted > 0


def test_frequent_tokens_ranks_by_count_keeps_eos_and_ascends() -> None:
    tokens = np.array([5, 5, 5, 2, 2, 9, 9, 9, 9, 7], dtype=np.uint16)
    assert frequent_tokens(tokens, 3, 12, always=(0,)).tolist() == [0, 5, 9]
    assert frequent_tokens(tokens, 4, 12, always=()).tolist() == [2, 5, 7, 9]  # 7 ties 0..; the count wins
    assert frequent_tokens(tokens, 2, 6, always=()).tolist() == [2, 5]  # ids >= the limit never


def test_text_data_uses_wide_tokens_for_a_large_vocabulary_and_refuses_too_little_text(tmp_path: Path,
                                                                                       text_dir: Path) -> None:
    from quickdraft.model.tokenizer import Tokenizer

    write_char_tokenizer(tmp_path / "tok")
    tokenizer = Tokenizer.from_dir(tmp_path / "tok")
    wide = prepare_token_data([text_dir], tokenizer, 0, 151_936, tmp_path / "wide", min_tokens=66)
    assert stream_dtype(wide) == np.uint32
    narrow = prepare_token_data([text_dir / "copy.py"], tokenizer, 0, 96, tmp_path / "narrow", min_tokens=66)
    assert stream_dtype(narrow) == np.uint16
    (tmp_path / "short.txt").write_text("x = 1\n")
    with pytest.raises(QuickdraftError, match="too little text"):
        prepare_token_data([tmp_path / "short.txt"], tokenizer, 0, 96, tmp_path / "short", min_tokens=66)
    with pytest.raises(QuickdraftError, match="no such file"):
        prepare_token_data([tmp_path / "missing"], tokenizer, 0, 96, tmp_path / "missing_out", min_tokens=66)


def test_text_data_reads_a_corpus_jsonl_by_record_not_as_json_text(tmp_path: Path) -> None:
    """`quickdraft train corpus` writes one {"path", "text"} record per line: each record's text is a
    document, tokenized as written (round 31 found a draft trained on the escaped JSON lines)."""
    from quickdraft.model.tokenizer import Tokenizer
    from quickdraft.train.text_data import load_stream

    write_char_tokenizer(tmp_path / "tok")
    tokenizer = Tokenizer.from_dir(tmp_path / "tok")
    source = 'def f(x):\n    return "x"\n'
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text("".join(json.dumps({"path": f"m{i}.py", "text": source * 5}) + "\n"
                                                for i in range(40)))
    streams = prepare_token_data([corpus], tokenizer, 0, 96, tmp_path / "out", min_tokens=66)
    tokens = np.concatenate([load_stream(streams, "train"), load_stream(streams, "val")]).tolist()
    document = tokenizer.encode(source * 5, add_special_tokens=False) + [0]
    assert tokens == document * 40  # every record, whole, each ending with EOS; no JSON syntax
    assert json.loads((streams / "streams.json").read_text())["documents"] == 40
