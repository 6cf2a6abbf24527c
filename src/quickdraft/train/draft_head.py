"""``quickdraft train draft-head``: count which tokens a draft's head keeps (model/draft_head.py).

The K most frequent tokens of the user's text, tokenized with the draft's own tokenizer, are saved
beside the draft as draft_head.json; the draft then drafts over them only. No weights change, and
the count takes seconds: a draft for any target can have one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.model.draft_head import save_draft_head
from quickdraft.model.loader import load_model
from quickdraft.model.self_draft import default_head_tokens
from quickdraft.model.tokenizer import Tokenizer
from quickdraft.train.text_data import documents, is_token_corpus, load_stream, text_files

MIN_TOKENS = 10_000  # fewer counted tokens than this rank most of a head by ties, not by use


def frequent_tokens(tokens: np.ndarray, k: int, vocab_limit: int, always: tuple[int, ...]) -> torch.Tensor:
    """The k most frequent token ids of ``tokens`` below ``vocab_limit`` (ties: the lower id), with
    ``always`` among them, ascending."""
    return most_counted(token_counts(tokens, vocab_limit), k, always)


def token_counts(tokens: np.ndarray, vocab_limit: int) -> np.ndarray:
    """How often each id below ``vocab_limit`` occurs in ``tokens``."""
    return np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_limit)[:vocab_limit]


def most_counted(counts: np.ndarray, k: int, always: tuple[int, ...]) -> torch.Tensor:
    """``frequent_tokens`` from ``token_counts``."""
    vocab_limit = len(counts)
    counts = counts.astype(np.float64)
    for token in always:
        if 0 <= token < vocab_limit:
            counts[token] = np.inf
    order = np.lexsort((np.arange(vocab_limit), -counts))  # by count descending, then id ascending
    return torch.from_numpy(np.sort(order[:k])).to(torch.long)


def count_tokens(paths: list[Path], tokenizer: Tokenizer | None) -> np.ndarray:
    """The token ids of ``paths``: a token corpus directory's train stream, else the text tokenized."""
    if is_token_corpus(paths):
        return np.asarray(load_stream(paths[0], "train"), dtype=np.int64)
    if tokenizer is None:
        raise QuickdraftError("the draft has no tokenizer.json, so text cannot be tokenized for it")
    files = text_files(paths)
    chunks = [np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
              for text in tqdm(documents(files), desc="counting", unit="text", mininterval=5)]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


def make_draft_head(draft: str | Path, data: list[Path], *, head_tokens: int | None = None,
                    out: Path | None = None) -> dict[str, object]:
    """Count ``data`` with the draft's tokenizer and save the head beside the draft (or in ``out``)."""
    loaded = load_model(draft)
    vocab = loaded.config.vocab_size
    k = head_tokens or default_head_tokens(vocab)
    if not 1 <= k <= vocab:
        raise QuickdraftError(f"--head-tokens must be in 1..{vocab} (the draft's vocabulary), got {k}")
    tokens = count_tokens(data, loaded.tokenizer)
    if tokens.size < MIN_TOKENS:
        raise QuickdraftError(f"--data gives {tokens.size} tokens: count at least {MIN_TOKENS:,} for a head "
                              "ranked by use")
    return save_counted_head(tokens, out or loaded.path, k, vocab, loaded.eos_token_ids, " ".join(map(str, data)))


def save_counted_head(tokens: np.ndarray, directory: Path, k: int, vocab: int, always: tuple[int, ...],
                      text: str) -> dict[str, object]:
    """Save the ``k`` most frequent of ``tokens`` (with ``always`` among them) as ``directory``'s head."""
    counts = token_counts(tokens, vocab)
    head_ids = most_counted(counts, k, always)
    covered = float(counts[head_ids.numpy()].sum() / max(1, counts.sum()))
    path = save_draft_head(directory, head_ids, vocab, {"tokens": int(tokens.size), "text": text})
    return {"head_file": str(path), "head_tokens": k, "vocab_size": vocab, "counted_tokens": int(tokens.size),
            "text_covered": round(covered, 4)}
