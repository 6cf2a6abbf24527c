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


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype name (fp32, bf16, fp16, or auto: see ``auto_dtype``) -> torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype(device)
    try:
        return DTYPES[dtype]
    except KeyError:
        raise QuickdraftError(f"unknown dtype {dtype!r}; choose one of auto, fp32, bf16, fp16") from None


def auto_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 where it runs fast, else fp32: CUDA GPUs that support it; CPUs with bf16 dot products
    (AVX512-BF16, AMX), where a k-row verifying forward costs about one 1-row step; and CPUs where
    quickdraft's kernels run at all (AVX2): there bf16 weights are widened in registers and a step
    streams half the bytes of fp32 (embedded target, Zen 3, 1 thread: 1.82 against 3.70 ms)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    if kind == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        if any(getattr(torch.cpu, probe, lambda: False)() for probe in probes):
            return torch.bfloat16
        from quickdraft import kernels

        if kernels.available():
            return torch.bfloat16
    return torch.float32


def default_draft_dtype(target_dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """The target's dtype, except fp32 on a CPU without quickdraft's bf16 kernels: a draft of a few
    million parameters is bound by per-op overhead, where torch's fp32 kernels beat its bf16 ones
    (embedded draft: 0.51 vs 0.82 ms per 1-row step). With the kernels a bf16 draft step is one C++
    call (embedded draft, draft step as the engine measures it: 0.18 ms in bf16, 0.33 ms in fp32)."""
    dtype = parse_dtype(target_dtype, device)
    if torch.device(device).type != "cpu":
        return dtype
    from quickdraft import kernels

    return dtype if dtype == torch.bfloat16 and kernels.available() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


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
    model = load_transformer(model_dir, config, dtype=parse_dtype(dtype, device), device=device)
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
