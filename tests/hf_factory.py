"""Tiny random checkpoints written by transformers' save_pretrained: the oracle's own files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ARCHITECTURES = ("llama", "llama3", "mistral", "qwen2", "gpt2")


def hf_config(arch: str, vocab_size: int = 96, num_hidden_layers: int = 3, hidden_size: int = 64, **overrides: Any):
    import transformers

    common = dict(vocab_size=vocab_size, max_position_embeddings=512)
    llama_like = dict(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=False, **common,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(**llama_like, rope_theta=10000.0)
    elif arch == "llama3":
        cfg = transformers.LlamaConfig(
            **{**llama_like, "tie_word_embeddings": True},
            rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64},
        )
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**llama_like, sliding_window=None)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**{**llama_like, "tie_word_embeddings": True}, use_sliding_window=False)
    elif arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=vocab_size, n_positions=512, n_embd=hidden_size, n_layer=num_hidden_layers, n_head=4
        )
    else:
        raise ValueError(arch)
    # No EOS unless a test asks for one: generations then run to max_new_tokens.
    cfg.eos_token_id = overrides.pop("eos_token_id", None)
    cfg.bos_token_id = overrides.pop("bos_token_id", None)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def make_hf_checkpoint(arch: str, out_dir: Path, *, seed: int = 0, logit_scale: float = 8.0, **overrides: Any) -> Path:
    """Write a random model; the final norm is scaled so logits are peaked and argmax ties impossible."""
    import transformers

    torch.manual_seed(seed)
    cfg = hf_config(arch, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        final_norm = model.transformer.ln_f if arch == "gpt2" else model.model.norm
        final_norm.weight.mul_(logit_scale)
        for p in model.parameters():  # random init is small; widen it so layers matter
            if p.dim() == 2:
                p.mul_(2.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    return out_dir
