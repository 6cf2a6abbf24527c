"""ModelConfig: one dataclass read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFormatError, UnsupportedModelError

# config.json key where training records the early-exit layer its auxiliary loss trained
EARLY_EXIT_CONFIG_KEY = "quickdraft_early_exit_layer"

LLAMA_FAMILY = ("llama", "mistral", "qwen2")
SUPPORTED_ARCHITECTURES = (*LLAMA_FAMILY, "gpt2")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    intermediate_size: int
    block_size: int  # the model's maximum context (max_position_embeddings / n_positions)
    norm_eps: float
    tie_word_embeddings: bool
    # Llama family
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    qkv_bias: bool = False
    sliding_window: int | None = None
    activation: str = "silu"  # silu (gated MLP) for the Llama family; gelu_tanh or gelu for GPT-2
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def is_gpt2(self) -> bool:
        return self.model_type == "gpt2"

    @property
    def n_params_estimate(self) -> int:
        d, f, v = self.n_embd, self.intermediate_size, self.vocab_size
        q_and_o = 2 * d * self.n_head * self.head_dim
        kv = 2 * d * self.n_kv_head * self.head_dim
        mlp = (2 if self.is_gpt2 else 3) * d * f
        embed = v * d * (1 if self.tie_word_embeddings else 2)
        return self.n_layer * (q_and_o + kv + mlp) + embed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ModelFormatError(f"missing {path}: a model directory needs a config.json") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFormatError(f"corrupt {path}: not valid JSON ({exc})") from exc
        return cls.from_hf_dict(raw, source=str(path))

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            if model_type == "gpt2":
                return _gpt2_config(raw)
            return _llama_family_config(raw, model_type)
        except KeyError as exc:
            raise ModelFormatError(f"{source}: required field {exc.args[0]!r} is missing") from exc


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _llama_family_config(raw: dict[str, Any], model_type: str) -> ModelConfig:
    n_embd = int(raw["hidden_size"])
    n_head = int(raw["num_attention_heads"])
    rope_scaling = raw.get("rope_scaling")
    rope_theta = raw.get("rope_theta")
    # transformers 5 moves rope settings into "rope_parameters".
    rope_parameters = raw.get("rope_parameters")
    if isinstance(rope_parameters, dict):
        rope_theta = rope_parameters.get("rope_theta", rope_theta)
        if rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = rope_parameters
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if kind not in ("default", "linear", "llama3"):
            raise UnsupportedModelError(f"rope scaling {kind!r} is not supported; supported: linear, llama3")
        if kind == "default":
            rope_scaling = None
    sliding_window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(raw["vocab_size"]),
        n_embd=n_embd,
        n_layer=int(raw["num_hidden_layers"]),
        n_head=n_head,
        n_kv_head=int(raw.get("num_key_value_heads") or n_head),
        head_dim=int(raw.get("head_dim") or n_embd // n_head),
        intermediate_size=int(raw["intermediate_size"]),
        block_size=int(raw.get("max_position_embeddings", 2048)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta or 10000.0),
        rope_scaling=dict(rope_scaling) if rope_scaling else None,
        qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        sliding_window=int(sliding_window) if sliding_window else None,
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw),
    )


def _gpt2_config(raw: dict[str, Any]) -> ModelConfig:
    n_embd = int(raw["n_embd"])
    n_head = int(raw["n_head"])
    activation = raw.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise UnsupportedModelError(f"gpt2 activation {activation!r} is not supported")
    return ModelConfig(
        model_type="gpt2",
        vocab_size=int(raw["vocab_size"]),
        n_embd=n_embd,
        n_layer=int(raw["n_layer"]),
        n_head=n_head,
        n_kv_head=n_head,
        head_dim=n_embd // n_head,
        intermediate_size=int(raw.get("n_inner") or 4 * n_embd),
        block_size=int(raw.get("n_positions", 1024)),
        norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw),
        activation="gelu" if activation == "gelu" else "gelu_tanh",
    )
