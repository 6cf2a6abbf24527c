"""Byte-level BPE tokenizer trained on the corpus, saved in Hugging Face format.

Byte-level BPE maps every byte to a symbol first, so any text (any Unicode, any whitespace) encodes
and decodes back exactly. ``<|endoftext|>`` ends each document (and is the EOS token);
``<|pad|>`` pads batches.

The corpus is also tokenized here, once, into flat ``uint16`` token streams
(``train.bin``/``val.bin``) with ``<|endoftext|>`` after every document, which the trainers read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from quickdraft.train.corpus import iter_documents

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOS_TOKEN, PAD_TOKEN]  # ids 0 and 1
DEFAULT_VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 1024


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def tokenizer_config(model_max_length: int = MODEL_MAX_LENGTH) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": None,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, model_max_length: int = MODEL_MAX_LENGTH) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model_max_length), indent=2) + "\n")


def encode_documents(tokenizer: Tokenizer, texts: Iterable[str]) -> np.ndarray:
    """One flat stream: each document's tokens followed by <|endoftext|>."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    batch: list[str] = []
    parts: list[np.ndarray] = []

    def flush() -> None:
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            parts.append(np.asarray(enc.ids + [eos], dtype=np.uint16))
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) == 64:
            flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _texts(path: Path) -> Iterator[str]:
    return (doc["text"] for doc in iter_documents(path))


def build_tokenizer(corpus_dir: Path, out_dir: Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> dict[str, int]:
    """Train on train.jsonl, save to ``out_dir``, and write train.bin/val.bin next to the corpus."""
    if vocab_size > 65536:
        raise ValueError("token streams are stored as uint16: vocab_size must be <= 65536")
    tokenizer = train_tokenizer(_texts(corpus_dir / "train.jsonl"), vocab_size)
    save_tokenizer(tokenizer, out_dir)
    stats = {"vocab_size": tokenizer.get_vocab_size()}
    for split in ("train", "val"):
        tokens = encode_documents(tokenizer, _texts(corpus_dir / f"{split}.jsonl"))
        tokens.tofile(corpus_dir / f"{split}.bin")
        stats[f"{split}_tokens"] = int(tokens.size)
    (corpus_dir / "tokens.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("tokenizer: vocab %d; %d train tokens, %d val tokens", stats["vocab_size"], stats["train_tokens"],
             stats["val_tokens"])
    return stats


def load_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)
