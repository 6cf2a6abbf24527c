"""A draft model's frequency-ranked head: it drafts over the K most frequent tokens only.

A small draft's LM head is most of its step (the embedded draft: 0.92M of its 1.23M weights), and
the tokens it leaves out are rare ones a draft seldom guesses right anyway (FR-Spec, Zhao et al.
2025). Restricted to the 2,048 most frequent of 8,192 tokens, the embedded draft's step costs a
quarter less and its drafts are accepted about as often (BENCHMARKS.md, round 31). Its logits stay
over the whole vocabulary, -inf outside the subset (``Transformer.full_vocabulary``): q gives those
tokens probability 0, greedy drafts never pick them, and the target verifies as for any draft, so
the output is unchanged. The weights are not retrained: the head is the draft's own rows.

On disk, beside the draft's weights (``quickdraft train draft-head``; used unless told otherwise):

    draft_head.json     {"format": "quickdraft-draft-head", "version": 1, "head_tokens": K,
                         "vocab_size": V, "head_ids": [K ascending token ids],
                         "counted": {"tokens": N, "text": "..."}}
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from quickdraft.errors import ModelFormatError, QuickdraftError
from quickdraft.model.transformer import Transformer, shallow_copy

FORMAT = "quickdraft-draft-head"
VERSION = 1
HEAD_FILE = "draft_head.json"


def save_draft_head(directory: str | Path, head_ids: torch.Tensor, vocab_size: int, counted: dict[str, object]) -> Path:
    ids = sorted(int(i) for i in head_ids.tolist())
    _check_ids(ids, vocab_size, "the head")
    path = Path(directory) / HEAD_FILE
    meta = {"format": FORMAT, "version": VERSION, "head_tokens": len(ids), "vocab_size": vocab_size,
            "head_ids": ids, "counted": counted}
    path.write_text(json.dumps(meta) + "\n")
    return path


def load_draft_head(directory: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The head ids saved beside a draft (ascending), or None when there is no head file."""
    path = Path(directory) / HEAD_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"corrupt {path}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ModelFormatError(f"{path} is not a {FORMAT} v{VERSION} file")
    if meta.get("vocab_size") != vocab_size:
        raise ModelFormatError(f"{path} was counted for a vocabulary of {meta.get('vocab_size')} tokens, "
                               f"the draft has {vocab_size}; count it again with `quickdraft train draft-head`")
    ids = meta.get("head_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ModelFormatError(f"{path}: head_ids must be a list of token ids")
    _check_ids(ids, vocab_size, str(path))
    return torch.tensor(ids, dtype=torch.long)


def _check_ids(ids: list[int], vocab_size: int, where: str) -> None:
    if not ids:
        raise ModelFormatError(f"{where}: no head ids")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ModelFormatError(f"{where}: head ids must ascend without repeats")
    if ids[0] < 0 or ids[-1] >= vocab_size:
        raise ModelFormatError(f"{where}: head ids outside the vocabulary 0..{vocab_size - 1}")


def with_subset_head(model: Transformer, head_ids: torch.Tensor) -> Transformer:
    """``model`` drafting over ``head_ids`` only: a Transformer sharing every module of ``model`` but
    the LM head, which keeps the head's rows for those tokens (``model`` itself is left as it was)."""
    if model.head_ids is not None:
        raise QuickdraftError("this model's head already covers a subset of the vocabulary")
    ids = head_ids.to(torch.long)
    restricted = shallow_copy(model)
    weight = model.lm_head.weight.detach()
    head = nn.Linear(weight.shape[1], len(ids), bias=False, device=weight.device, dtype=weight.dtype)
    head.weight = nn.Parameter(weight[ids.to(weight.device)].clone(), requires_grad=False)
    restricted.lm_head = head
    restricted.head_ids = ids.to(weight.device)
    return restricted.eval()
