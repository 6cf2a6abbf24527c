"""Tokenizer: ``tokenizer.json`` through `tokenizers`, special tokens and chat template from
``tokenizer_config.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from quickdraft.errors import ModelFormatError, QuickdraftError


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as {"content": ...}.
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, backend: HFTokenizer, config: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.config = config or {}
        self.chat_template: str | None = self.config.get("chat_template")
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise ModelFormatError(f"missing {path}: quickdraft reads tokenizers from tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception on malformed files
            raise ModelFormatError(f"corrupt {path}: {exc}") from exc
        config_path = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.exists():
            try:
                config = json.loads(config_path.read_text())
            except json.JSONDecodeError as exc:
                raise ModelFormatError(f"corrupt {config_path}: not valid JSON ({exc})") from exc
        template_file = model_dir / "chat_template.jinja"
        if "chat_template" not in config and template_file.exists():
            config["chat_template"] = template_file.read_text()
        return cls(backend, config)

    @property
    def vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.eos_token)

    def special_tokens(self) -> dict[str, int]:
        return {t.content: i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            # A plain fallback, so that chat works on base models too.
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            return "\n".join(lines) + ("\nassistant:" if add_generation_prompt else "")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(self.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )


def encode_prompt(tokenizer: Tokenizer | None, vocab_limit: int, prompt: str | Sequence[int]) -> list[int]:
    """A prompt's token ids: text through the tokenizer, ids checked against the vocabulary."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise QuickdraftError("this model has no tokenizer.json: pass the prompt as a list of token ids")
        ids = tokenizer.encode(prompt)
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < vocab_limit]
        if bad:
            raise QuickdraftError(f"token id {bad[0]} is outside the vocabulary 0..{vocab_limit - 1}")
    if not ids:
        raise QuickdraftError("the prompt is empty: give at least one token")
    return ids


def decode_ids(tokenizer: Tokenizer | None, ids: list[int]) -> str:
    return "" if tokenizer is None else tokenizer.decode(ids)
