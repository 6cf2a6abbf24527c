"""Model sizes for training, without torch (the CLI reads its defaults from here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quickdraft.model.config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    """The size of a Llama decoder; vocabulary, context and RoPE come from the tokenizer or the target."""

    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    intermediate_size: int

    def llama_config(self, *, vocab_size: int, block_size: int, eos_token_ids: tuple[int, ...],
                     norm_eps: float = 1e-5, rope_theta: float = 10000.0) -> ModelConfig:
        return ModelConfig(model_type="llama", vocab_size=vocab_size, block_size=block_size, norm_eps=norm_eps,
                           tie_word_embeddings=True, rope_theta=rope_theta, eos_token_ids=eos_token_ids, **asdict(self))


# The embedded pair (MODEL_CARD.md): the CLI's defaults.
EMBEDDED_TARGET_SHAPE = ModelShape(n_embd=384, n_layer=6, n_head=6, n_kv_head=2, head_dim=64, intermediate_size=1024)
EMBEDDED_DRAFT_SHAPE = ModelShape(n_embd=112, n_layer=2, n_head=4, n_kv_head=4, head_dim=28, intermediate_size=320)
TARGET_BLOCK_SIZE = 1024
