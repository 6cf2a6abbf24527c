"""A tiny character-level tokenizer for the random test models (vocabulary 96).

ids: 0 = <|endoftext|> (special, EOS), 1 = "\\n", 2..95 = the printable ASCII characters " " .. "}".
Any other character is normalized to "?", so every text encodes and ``decode(encode(t))`` is ``t``
for text made of those characters.
"""

from __future__ import annotations

import json
from pathlib import Path

EOS = "<|endoftext|>"
CHARS = ["\n"] + [chr(c) for c in range(32, 126)]  # 95 characters: ids 1..95
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def make_char_tokenizer(vocab_size: int = 96):
    """A `tokenizers.Tokenizer`: one token per character, no merges."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    if vocab_size < len(CHARS) + 1:
        raise ValueError(f"vocab_size must be >= {len(CHARS) + 1}, got {vocab_size}")
    vocab = {EOS: 0, **{ch: i + 1 for i, ch in enumerate(CHARS)}}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[]))
    tokenizer.normalizer = normalizers.Replace(Regex(r"[^\n -}]"), "?")
    tokenizer.decoder = decoders.Fuse()
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    return tokenizer


def write_char_tokenizer(model_dir: Path, *, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """Write tokenizer.json and tokenizer_config.json (eos_token, chat_template) into ``model_dir``."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    make_char_tokenizer().save(str(model_dir / "tokenizer.json"))
    config = {"eos_token": EOS, "bos_token": None, "model_max_length": 512}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return model_dir
