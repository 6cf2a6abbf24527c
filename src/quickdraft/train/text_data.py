"""A user's text as token streams in the *target's* tokenization, for training drafters of any model.

``--data`` takes files and directories (read recursively; files that are not UTF-8 text are
skipped; a ``.jsonl`` file is one document per line's "text" field, as ``quickdraft train corpus``
writes them), or one corpus directory that already holds ``train.bin`` / ``val.bin`` (the embedded
pipeline's, tokenized with the embedded tokenizer). Each document is encoded with the target's
tokenizer and ends with its EOS token; every 20th document goes to validation (the last 5% of the
tokens when there are fewer than 20). The streams are written once to ``OUT/data`` and reused while
the sources are unchanged, so a resumed run does not tokenize again.

Token streams are flat arrays: uint16 while the vocabulary fits (the embedded corpus's format),
uint32 beyond (Qwen2's 151,936 tokens). ``streams.json`` beside them names the dtype.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.model.tokenizer import Tokenizer
from quickdraft.train.corpus import iter_documents

log = logging.getLogger(__name__)

META_FILE = "streams.json"
VAL_EVERY = 20


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def stream_dtype(data_dir: Path) -> np.dtype:
    """The dtype of ``data_dir``'s token streams (uint16 where no streams.json says otherwise)."""
    meta = data_dir / META_FILE
    return np.dtype(json.loads(meta.read_text())["dtype"]) if meta.exists() else np.dtype(np.uint16)


def load_stream(data_dir: Path, split: str, *, memmap: bool = False) -> np.ndarray:
    path = data_dir / f"{split}.bin"
    if not path.exists():
        raise QuickdraftError(f"{path} is missing: --data names a corpus directory without token streams")
    dtype = stream_dtype(data_dir)
    return np.memmap(path, dtype=dtype, mode="r") if memmap else np.fromfile(path, dtype=dtype)


def is_token_corpus(paths: list[Path]) -> bool:
    return len(paths) == 1 and paths[0].is_dir() and (paths[0] / "train.bin").exists()


def text_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file()
                            and not any(part.startswith(".") for part in p.relative_to(path).parts))
        elif path.is_file():
            files.append(path)
        else:
            raise QuickdraftError(f"--data {path}: no such file or directory")
    return files


def documents(files: list[Path]) -> Iterator[str]:
    """Each file's text; each record's "text" field of a .jsonl file (a corpus of many documents:
    tokenizing its JSON lines as text would train on escaped quotes and newlines)."""
    for path in files:
        try:
            if path.suffix == ".jsonl":
                for record in iter_documents(path):
                    if isinstance(record, dict) and isinstance(record.get("text"), str) and record["text"].strip():
                        yield record["text"]
                continue
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError, json.JSONDecodeError):
            continue  # binary, unreadable or not a corpus: not training text
        if text.strip():
            yield text


def _fingerprint(files: list[Path], tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256(json.dumps(sorted(tokenizer.vocab.items())[:64]).encode())
    digest.update(str(tokenizer.vocab_size).encode())
    digest.update(b"documents: .jsonl records")  # streams cut before .jsonl files were read by record differ
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def prepare_token_data(paths: list[Path], tokenizer: Tokenizer | None, eos_id: int | None, vocab_size: int,
                       out_dir: Path, *, min_tokens: int) -> Path:
    """The directory of train/val token streams for ``paths`` (see the module docstring)."""
    if is_token_corpus(paths):
        return paths[0]
    if tokenizer is None:
        raise QuickdraftError("the target has no tokenizer.json, so text cannot be tokenized for it")
    files = text_files(paths)
    if not files:
        raise QuickdraftError(f"--data {' '.join(map(str, paths))}: no files found")
    fingerprint = _fingerprint(files, tokenizer)
    meta_path = out_dir / META_FILE
    if meta_path.exists() and json.loads(meta_path.read_text()).get("fingerprint") == fingerprint:
        log.info("reusing the token streams in %s", out_dir)
        return out_dir
    dtype = token_dtype(vocab_size)
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    n_docs = 0
    for n_docs, text in enumerate(tqdm(documents(files), desc="tokenizing", unit="document",
                                       mininterval=5), start=1):
        ids = tokenizer.encode(text, add_special_tokens=False) + ([eos_id] if eos_id is not None else [])
        (val if n_docs % VAL_EVERY == 0 else train).append(np.asarray(ids, dtype=dtype))
    train_tokens = np.concatenate(train) if train else np.zeros(0, dtype=dtype)
    val_tokens = np.concatenate(val) if val else np.zeros(0, dtype=dtype)
    if val_tokens.size < min_tokens:  # few documents: hold out the tail instead
        all_tokens = np.concatenate([train_tokens, val_tokens])
        cut = int(all_tokens.size * 0.95)
        train_tokens, val_tokens = all_tokens[:cut], all_tokens[cut:]
    if train_tokens.size < min_tokens or val_tokens.size < min_tokens:
        raise QuickdraftError(f"--data gives {train_tokens.size + val_tokens.size} tokens in {n_docs} documents: "
                              f"too little text to train on (at least {20 * min_tokens} tokens are needed)")
    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokens.tofile(out_dir / "train.bin")
    val_tokens.tofile(out_dir / "val.bin")
    meta = {"dtype": np.dtype(dtype).name, "fingerprint": fingerprint, "documents": n_docs,
            "train_tokens": int(train_tokens.size), "val_tokens": int(val_tokens.size),
            "sources": [str(p) for p in paths]}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    log.info("tokenized %d documents: %d train and %d validation tokens", n_docs, train_tokens.size, val_tokens.size)
    return out_dir
