"""A draft model's frequency-ranked head (model/draft_head.py): the file beside the draft, the cut
model, the drafters that use it and ``quickdraft train draft-head``. Greedy exactness with a cut head
is in test_exact_greedy.py, its sampled distribution in test_sampling_exact.py."""

from __future__ import annotations

import json

import pytest
import torch

from quickdraft import Engine
from quickdraft.cli import main
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.lookup_then_model import LookupThenModelDrafter
from quickdraft.errors import ModelFormatError, QuickdraftError
from quickdraft.model.draft_head import HEAD_FILE, load_draft_head, save_draft_head, with_subset_head
from quickdraft.model.loader import load_model
from quickdraft.train.draft_head import make_draft_head
from tokenizer_factory import make_char_tokenizer, write_char_tokenizer


def test_a_cut_head_scores_its_tokens_as_the_whole_head_does_and_leaves_the_model_alone(models) -> None:
    model = models["related"].model
    vocab = model.config.vocab_size
    head_ids = torch.tensor([0, 3, 4, 10, 50, vocab - 1])
    cut = with_subset_head(model, head_ids)
    assert model.head_ids is None and model.lm_head.weight.shape[0] == vocab  # untouched
    assert cut.embed is model.embed and cut.layers is model.layers  # shared, not copied
    tokens = torch.tensor([[5, 17, 3, 88, 41]])
    with torch.inference_mode():
        full, restricted = model(tokens), cut(tokens)
    # the same rows of the same weights (to rounding: a 6-row product may block unlike a 96-row one)
    torch.testing.assert_close(restricted[..., head_ids], full[..., head_ids], rtol=1e-5, atol=1e-5)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[head_ids] = False
    assert torch.isneginf(restricted[..., outside]).all()
    with pytest.raises(QuickdraftError, match="already"):
        with_subset_head(cut, head_ids)


def test_the_head_file_round_trips_and_refuses_what_it_cannot_use(tmp_path) -> None:
    assert load_draft_head(tmp_path, 96) is None  # no file: the whole head
    save_draft_head(tmp_path, torch.tensor([7, 2, 40]), 96, {"tokens": 123})
    assert load_draft_head(tmp_path, 96).tolist() == [2, 7, 40]
    with pytest.raises(ModelFormatError, match="vocabulary of 96"):
        load_draft_head(tmp_path, 128)
    meta = json.loads((tmp_path / HEAD_FILE).read_text())
    for ids, message in (([2, 2, 5], "ascend"), ([5, 2], "ascend"), ([1, 96], "outside"), ([], "no head ids"),
                         (["a"], "list of token ids")):
        (tmp_path / HEAD_FILE).write_text(json.dumps({**meta, "head_ids": ids}))
        with pytest.raises(ModelFormatError, match=message):
            load_draft_head(tmp_path, 96)
    (tmp_path / HEAD_FILE).write_text("{not json")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        load_draft_head(tmp_path, 96)
    (tmp_path / HEAD_FILE).write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(ModelFormatError, match="quickdraft-draft-head"):
        load_draft_head(tmp_path, 96)


def _draft_dir_with_head(checkpoints, tmp_path, head_ids: list[int]):
    import shutil

    draft_dir = tmp_path / "draft"
    shutil.copytree(checkpoints["related"], draft_dir)
    save_draft_head(draft_dir, torch.tensor(head_ids), 96, {"tokens": 0, "text": "test"})
    return draft_dir


def test_a_draft_drafts_over_the_head_saved_beside_it_unless_told_otherwise(checkpoints, tmp_path) -> None:
    draft_dir = _draft_dir_with_head(checkpoints, tmp_path, list(range(0, 96, 3)))
    target = load_model(checkpoints["target"])
    engine = Engine(target, str(draft_dir))
    assert isinstance(engine.drafter, DraftModelDrafter) and engine.drafter.head_tokens == 32
    assert Engine(target, str(draft_dir), full_draft_head=True).drafter.head_tokens is None  # type: ignore[union-attr]
    behind_lookup = Engine(target, f"prompt-lookup+{draft_dir}").drafter
    assert isinstance(behind_lookup, LookupThenModelDrafter) and behind_lookup.model.head_tokens == 32  # type: ignore[attr-defined]
    assert Engine(target, load_model(draft_dir)).drafter.head_tokens == 32  # type: ignore[union-attr]
    prompts = [[5, 17, 3, 88, 41, 9, 60, 23] * 2, [31, 7], [4, 4, 8, 15, 16, 23, 42]]
    plain = [engine.generate(p, 40, gamma=0).token_ids for p in prompts]
    drafted = []
    for prompt in prompts:
        result = engine.generate(prompt, 40, gamma=3)
        assert result.token_ids == plain[prompts.index(prompt)]
        drafted.append(result.stats.accepted)
    assert sum(drafted) > 0
    assert [r.token_ids for r in engine.generate_batch(prompts, 40, gamma=3)] == plain  # batched too


def test_train_draft_head_counts_the_text_with_the_drafts_tokenizer(checkpoints, tmp_path, capsys) -> None:
    import shutil

    draft_dir = tmp_path / "draft"
    shutil.copytree(checkpoints["related"], draft_dir)
    write_char_tokenizer(draft_dir)  # one token per character
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.py").write_text("def add(a, b):\n    return a + b\n" * 400)
    (text / "corpus.jsonl").write_text(json.dumps({"path": "x.py", "text": "import os\n" * 500}) + "\n")
    assert main(["train", "draft-head", "--draft", str(draft_dir), "--data", str(text), "--head-tokens", "22"]) == 0
    summary = json.loads(capsys.readouterr().out)
    used = set("def add(a, b):\n    return a + b\n") | set("import os\n")  # 21 characters in all
    assert summary["head_tokens"] == 22 and summary["text_covered"] == 1.0
    head = load_draft_head(draft_dir, 96)
    # the text's characters and the end of text, which the draft must be able to propose
    assert head is not None and head.tolist() == sorted({0} | {make_char_tokenizer().token_to_id(c) for c in used})
    assert Engine(load_model(checkpoints["target"]), str(draft_dir)).drafter.head_tokens == 22  # type: ignore[union-attr]
    (tmp_path / "little").mkdir()
    (tmp_path / "little" / "a.txt").write_text("tiny")
    with pytest.raises(QuickdraftError, match="at least"):
        make_draft_head(draft_dir, [tmp_path / "little"])
    with pytest.raises(QuickdraftError, match="1..96"):
        make_draft_head(draft_dir, [text], head_tokens=97)
