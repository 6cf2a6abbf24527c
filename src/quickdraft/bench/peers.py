"""Peers on the same weights: Hugging Face transformers' ``generate()`` plain, with
``assistant_model`` (assisted generation) and with ``prompt_lookup_num_tokens``.

transformers is a bench/test dependency only: importing this module raises ImportError without it.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from quickdraft.model.loader import parse_dtype


def _load(path: Path, dtype: torch.dtype, device: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    # Ignore EOS as our engines do in the bench, so every method generates max_new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class HFPeer:
    version = transformers.__version__

    def __init__(self, target: Path, draft: Path | None, *, dtype: str | torch.dtype = "fp32",
                 draft_dtype: str | torch.dtype | None = None, device: str = "cpu") -> None:
        """``draft_dtype``: the assistant's dtype (default: the target's); the bench gives it the
        dtype our drafter runs in, so both sides draft with the same arithmetic."""
        torch_dtype = parse_dtype(dtype, device)
        self.device = device
        transformers.logging.set_verbosity_error()  # its deprecation chatter would bury the bench's progress
        self.model = _load(target, torch_dtype, device)
        assistant_dtype = parse_dtype(draft_dtype, device) if draft_dtype is not None else torch_dtype
        self.assistant = _load(draft, assistant_dtype, device) if draft is not None else None

    @staticmethod
    def assistant_defaults() -> str:
        """transformers' default assistant settings (what users get), as a note for the report."""
        keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        try:
            defaults = transformers.GenerationConfig._get_default_generation_params()
        except AttributeError:  # older transformers keep them as GenerationConfig() attributes
            defaults = vars(transformers.GenerationConfig())
        return ", ".join(f"{k}={defaults.get(k)}" for k in keys)

    def runner(self, method: Any, lookup_tokens: int):
        def run(ids: list[int], max_new: int, seed: int) -> tuple[list[int], None]:
            input_ids = torch.tensor([ids], device=self.device)
            config = copy.deepcopy(self.model.generation_config)
            config.update(max_new_tokens=max_new, pad_token_id=0, eos_token_id=None)
            if method.greedy:
                config.update(do_sample=False, temperature=None, top_k=None, top_p=None)
            else:
                torch.manual_seed(seed)
                config.update(do_sample=True, temperature=method.temperature, top_k=0, top_p=1.0)
            kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(input_ids), "generation_config": config}
            if method.family == "hf-assisted":
                kwargs["assistant_model"] = self.assistant
            elif method.family == "hf-lookup":
                config.update(prompt_lookup_num_tokens=lookup_tokens)
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.model.generate(input_ids, **kwargs)
            return out[0, len(ids):].tolist(), None

        return run


def hf_batched_generate_seconds(model: Any, prompts: list[list[int]], max_new: int) -> float:
    """Seconds for transformers' ``generate()`` over one static, left-padded batch of ``prompts``
    (greedy, EOS ignored): the batched peer of the load sweep."""
    import time

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=0, eos_token_id=None,
                  do_sample=False, temperature=None, top_k=None, top_p=None)
    start = time.perf_counter()
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.generate(input_ids, attention_mask=mask, generation_config=config)
    return time.perf_counter() - start


def load_hf_model(path: Path, dtype: str | torch.dtype = "fp32", device: str = "cpu") -> Any:
    transformers.logging.set_verbosity_error()
    return _load(path, parse_dtype(dtype, device), device)
