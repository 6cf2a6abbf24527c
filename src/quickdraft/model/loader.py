"""LoadedModel: config + weights + tokenizer from one directory or hub id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.model.config import ModelConfig
from quickdraft.model.tokenizer import Tokenizer
from quickdraft.model.transformer import Transformer
from quickdraft.model.weights import load_transformer, resolve_model_dir

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise QuickdraftError(f"unknown dtype {dtype!r}; choose one of fp32, bf16, fp16") from None


@dataclass
class LoadedModel:
    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer | None
    path: Path
    name: str
    eos_token_ids: tuple[int, ...]

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def _eos_token_ids(model_dir: Path, config: ModelConfig, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    ids = set(config.eos_token_ids)
    generation_config = model_dir / "generation_config.json"
    if generation_config.exists():
        try:
            eos = json.loads(generation_config.read_text()).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise QuickdraftError(f"corrupt {generation_config}: not valid JSON ({exc})") from exc
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))


def load_model(
    path_or_id: str | Path, *, dtype: str | torch.dtype = "fp32", device: str = "cpu", tokenizer: bool = True
) -> LoadedModel:
    model_dir = resolve_model_dir(path_or_id)
    config = ModelConfig.from_file(model_dir / "config.json")
    model = load_transformer(model_dir, config, dtype=parse_dtype(dtype), device=device)
    # A checkpoint without tokenizer.json still runs on token ids; text prompts then get a clear error.
    tok = Tokenizer.from_dir(model_dir) if tokenizer and (model_dir / "tokenizer.json").exists() else None
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=tok,
        path=model_dir,
        name=str(path_or_id),
        eos_token_ids=_eos_token_ids(model_dir, config, tok),
    )
