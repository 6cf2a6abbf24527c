"""The offline training pipeline, end to end on a tiny corpus: corpus → tokenizer → target (with
early-exit loss) → distilled draft → evaluation → install, in well under a minute on two cores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from quickdraft.model.loader import load_model
from quickdraft.model.transformer import Transformer
from quickdraft.train.common import TrainArgs, batch_at, init_from_model, init_weights, train_loop
from quickdraft.train.corpus import build_corpus, stdlib_dir
from quickdraft.train.distill import train_draft
from quickdraft.train.evaluate import distinct_2, evaluate_pair, replay_rounds
from quickdraft.train.pretrain import EARLY_EXIT_KEY, model_config, target_loss, train_target
from quickdraft.train.shapes import ModelShape
from quickdraft.train.tokenizer_train import build_tokenizer, train_tokenizer

TINY_TARGET = ModelShape(n_embd=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=128)
TINY_DRAFT = ModelShape(n_embd=32, n_layer=1, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64)
SOURCES = ["argparse.py", "textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "glob.py", "copy.py"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stdlib")
    for name in SOURCES:
        shutil.copyfile(stdlib_dir() / name, root / name)
    out = tmp_path_factory.mktemp("corpus")
    manifest = build_corpus(out, root, held_out_percent=30)
    assert manifest["train_files"] > 0 and manifest["val_files"] > 0
    return out


def test_tokenizer_round_trips_text_exactly() -> None:
    texts = [(stdlib_dir() / name).read_text() for name in SOURCES[:3]]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    for text in [texts[0][:5000], "\tdef f(x):\r\n    return x  # héllo ✓ 日本語 \x00 <|endoftext|>\n\n\n", ""]:
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_batches_are_a_pure_function_of_seed_and_step() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    assert torch.equal(batch_at(tokens, 7, 4, 16, seed=1), batch_at(tokens, 7, 4, 16, seed=1))
    assert not torch.equal(batch_at(tokens, 7, 4, 16, seed=1), batch_at(tokens, 8, 4, 16, seed=1))


def test_replay_counts_rounds_like_speculative_decoding() -> None:
    assert replay_rounds([True] * 10, gamma=4) == (2, 8)  # 4 accepted + 1 target token, twice
    assert replay_rounds([False] * 3, gamma=4) == (3, 0)
    assert replay_rounds([True, True, False, True], gamma=4) == (2, 3)


def test_distinct_2_counts_repeated_bigrams() -> None:
    assert distinct_2([1, 2, 3, 4]) == 1.0
    assert distinct_2([7, 7, 7, 7, 7]) == 0.25  # one distinct pair of four
    assert distinct_2([1, 2, 1, 2, 1]) == 0.5
    assert distinct_2([5]) == 1.0


def test_pipeline_trains_target_and_draft_and_loss_falls(corpus: Path, tmp_path: Path) -> None:
    tokenizer_dir = tmp_path / "tokenizer"
    stats = build_tokenizer(corpus, tokenizer_dir, vocab_size=512)
    assert stats["train_tokens"] > 10_000 and stats["val_tokens"] > 0

    common = dict(data_dir=corpus, batch_size=8, seq_len=64, warmup_steps=5, threads=2, eval_batches=2)
    target_args = TrainArgs(out_dir=tmp_path / "target", lr=3e-3, max_steps=30, **common)
    summary = train_target(target_args, TINY_TARGET, tokenizer_dir, exit_layer=1, exit_weight=0.3, block_size=256)
    history = json.loads((tmp_path / "target" / "history.json").read_text())
    first, last = history[0]["loss"], min(h["loss"] for h in history if "loss" in h)
    assert last < first - 0.5, f"target loss did not fall: {first} -> {last}"
    assert summary["val_loss"] < first

    target_dir = tmp_path / "target" / "final"
    assert json.loads((target_dir / "config.json").read_text())[EARLY_EXIT_KEY] == 1
    loaded = load_model(target_dir)
    assert loaded.n_params == summary["params"]
    assert 0.0 <= summary["val_repeat_top1"] <= 1.0

    # Copy-augmented fine-tuning starts from the exported target (its first loss is far below a
    # fresh model's) and refuses a saved model of another shape.
    copy_args = TrainArgs(out_dir=tmp_path / "target_copy", lr=1e-3, max_steps=2, **common)
    copy_summary = train_target(copy_args, TINY_TARGET, tokenizer_dir, exit_layer=1, copy_fraction=0.5,
                                init_from=target_dir, block_size=256)
    copy_history = json.loads((tmp_path / "target_copy" / "history.json").read_text())
    assert copy_history[0]["loss"] < first - 0.5, "fine-tuning did not start from the target"
    assert copy_summary["copy_fraction"] == 0.5 and copy_summary["init_from"] == str(target_dir)
    other = Transformer(model_config(TINY_DRAFT, 512, eos_id=0))
    with pytest.raises(ValueError, match="does not have this model's shape"):
        init_from_model(other, target_dir)

    draft_args = TrainArgs(out_dir=tmp_path / "draft", lr=5e-3, max_steps=20, **common)
    draft_summary = train_draft(draft_args, TINY_DRAFT, target_dir, n_generations=8, prompt_len=8)
    draft_history = json.loads((tmp_path / "draft" / "history.json").read_text())
    assert draft_history[-2]["loss"] < draft_history[0]["loss"], "distillation KL did not fall"
    assert draft_summary["params"] < summary["params"]

    # Fine-tuning from the exported draft starts where it ended, not from scratch, and extends
    # the saved generations instead of regenerating them.
    (tmp_path / "draft_v2").mkdir()
    old_generations = np.load(tmp_path / "draft" / "generations.npy")
    shutil.copyfile(tmp_path / "draft" / "generations.npy", tmp_path / "draft_v2" / "generations.npy")
    tuned_args = TrainArgs(out_dir=tmp_path / "draft_v2", lr=1e-3, max_steps=2, **common)
    tuned_summary = train_draft(tuned_args, TINY_DRAFT, target_dir, n_generations=12, prompt_len=8,
                                init_from=tmp_path / "draft" / "final", copy_fraction=0.5, induction_steps=2)
    assert tuned_summary["copy_fraction"] == 0.5
    assert 0.0 <= tuned_summary["induction_repeat_top1_after"] <= 1.0  # the bootstrap ran before distillation
    tuned_history = json.loads((tmp_path / "draft_v2" / "history.json").read_text())
    assert tuned_history[0]["loss"] < draft_history[0]["loss"] - 0.5, "fine-tuning did not start from the draft"
    generations = np.load(tmp_path / "draft_v2" / "generations.npy")
    assert generations.shape == (12, old_generations.shape[1])
    assert np.array_equal(generations[:8], old_generations)

    # install: the target stored in bf16 (what fp32 loading then gives is the bf16-rounded weights), the draft as is
    from quickdraft.cli import main

    assets = tmp_path / "assets"
    assert main(["train", "install", "--target", str(target_dir), "--draft", str(tmp_path / "draft" / "final"),
                 "--dest", str(assets)]) == 0
    assert json.loads((assets / "target" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    installed, trained = load_model(assets / "target").model, load_model(target_dir).model
    for (name, a), b in zip(installed.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b.to(torch.bfloat16).float()), name
    assert (assets / "draft" / "model.safetensors").read_bytes() == (tmp_path / "draft" / "final" / "model.safetensors").read_bytes()
    assert main(["train", "install", "--target", str(tmp_path / "nowhere"), "--draft", str(target_dir),
                 "--dest", str(tmp_path / "assets2")]) == 1
    assert not (tmp_path / "assets2").exists()  # nothing half-installed

    report = evaluate_pair(target_dir, tmp_path / "draft" / "final", corpus, n_prompts=3, n_new=8,
                           prompts_out=tmp_path / "prompts.jsonl", threads=2, n_samples=1)
    assert 0.0 <= report["draft"]["alpha"] <= 1.0
    assert set(report["target_copying"]) == {"first_top1", "repeat_top1"}
    assert 0.0 < report["target_greedy_distinct_2"] <= 1.0
    assert len((tmp_path / "prompts.jsonl").read_text().splitlines()) == 3


class _Interrupted(Exception):
    pass


def test_resume_continues_exactly(corpus: Path, tmp_path: Path) -> None:
    """A run interrupted after 3 of 6 steps and resumed ends with the weights of an uninterrupted run."""
    tokenizer_dir = tmp_path / "tokenizer"
    build_tokenizer(corpus, tokenizer_dir, vocab_size=300)
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])

    def run(out: str, resume: bool, interrupt_at: int | None) -> Transformer:
        torch.manual_seed(0)
        model = Transformer(model_config(TINY_TARGET, vocab, eos_id=0))
        init_weights(model)
        calls = 0

        def loss_fn(m: Transformer, batch: torch.Tensor):  # noqa: ANN202
            nonlocal calls
            calls += 1
            if interrupt_at is not None and calls > interrupt_at:
                raise _Interrupted
            return target_loss(m, batch, exit_layer=1, exit_weight=0.3)

        args = TrainArgs(out_dir=tmp_path / out, data_dir=corpus, batch_size=4, seq_len=32, warmup_steps=2,
                         max_steps=6, checkpoint_minutes=0.0, threads=1, resume=resume)
        try:
            train_loop(model, loss_fn, args, name=out)
        except _Interrupted:
            pass
        return model

    straight = run("straight", resume=False, interrupt_at=None)
    run("resumed", resume=False, interrupt_at=3)
    resumed = run("resumed", resume=True, interrupt_at=None)
    assert json.loads((tmp_path / "resumed" / "summary.json").read_text())["steps"] == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_training_device_is_refused_by_name_when_torch_cannot_use_it() -> None:
    from quickdraft.errors import QuickdraftError
    from quickdraft.train.common import training_device

    assert training_device("cpu").type == "cpu"
    with pytest.raises(QuickdraftError, match="not a device torch knows"):
        training_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(QuickdraftError, match="sees no CUDA device"):
            training_device("cuda")
