"""Pick the early-exit layer L by measurement, and remember the choice per model.

A shallow exit drafts cheaply but is rarely accepted; a deep one is accepted often but costs
nearly a target step. Which L is fastest depends on the model *and* the machine, so it is
measured: a short speculative generation per candidate L on a few prompts (tokens per CPU-second
of this process, the median of two rounds), the fastest wins. The choice is cached in
``$QUICKDRAFT_CACHE_DIR`` (default ``~/.cache/quickdraft``) under a key made of the model's
config and weight files, the dtype, the device, the thread count and the kernels' build.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft import kernels
from quickdraft.model.loader import LoadedModel
from quickdraft.user_cache import cache_dir, read_json, write_json

log = logging.getLogger(__name__)

CACHE_FILE = "early_exit_layers.json"
CALIBRATION_TOKENS = 24
CALIBRATION_ROUNDS = 2
MAX_CANDIDATES = 6
# Used when the target has a tokenizer; a model without one is calibrated on token ids.
CALIBRATION_TEXTS = (
    "def parse_arguments(argv):\n    \"\"\"Parse the command line and return the options.\"\"\"",
    "The history of the city begins in the twelfth century, when",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
)


@dataclass
class Calibration:
    layer: int
    tokens_per_s: dict[int, float]  # measured per candidate (empty when read from the cache)
    cached: bool


def model_fingerprint(target: LoadedModel) -> str:
    """The model's identity for the cache: config.json's bytes and each weight file's name, size
    and modification time (hashing gigabytes of weights would cost more than calibrating)."""
    digest = hashlib.sha256()
    config = target.path / "config.json"
    digest.update(config.read_bytes() if config.exists() else repr(target.config).encode())
    for weights in sorted(target.path.glob("*.safetensors")):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    device = target.model.device
    digest.update(f"{target.model.dtype}|{device}|threads={torch.get_num_threads()}".encode())
    # what the drafts and verifies run on: another build of the kernels drafts at another cost
    digest.update(f"|kernels={kernels.build_id() if device.type == 'cpu' else None}".encode())
    return digest.hexdigest()[:32]


def candidate_layers(n_layer: int, trained: int | None = None) -> list[int]:
    """Every exit layer 1..n-1 for a shallow model; evenly spread ones in the first half for a
    deep one (a draft deeper than half the target rarely pays), plus the trained exit."""
    if n_layer - 1 <= MAX_CANDIDATES:
        layers = set(range(1, n_layer))
    else:
        half = max(1, n_layer // 2)
        layers = {max(1, round(half * (i + 1) / MAX_CANDIDATES)) for i in range(MAX_CANDIDATES)}
    if trained is not None and 1 <= trained < n_layer:
        layers.add(trained)
    return sorted(layers)


def calibration_prompts(target: LoadedModel) -> list[list[int]]:
    if target.tokenizer is not None:
        return [target.tokenizer.encode(text) for text in CALIBRATION_TEXTS]
    vocab = target.config.vocab_size
    return [[(7 * i + 3 * j) % (vocab - 1) + 1 for j in range(24)] for i in range(len(CALIBRATION_TEXTS))]


def measure_tokens_per_s(target: LoadedModel, layer: int, prompts: Sequence[list[int]], quantized_draft: bool = True) -> float:
    """Tokens per CPU-second of this process for early-exit speculation at ``layer`` (γ auto), with the
    early-exit drafter the factory makes (``quantized_draft``: its quantised form where it applies)."""
    from quickdraft.engine import Engine

    engine = Engine(target, f"early-exit:{layer}", exact=False, quantized_draft=quantized_draft)
    engine.eos_token_ids = frozenset()  # every run generates the same number of tokens
    engine.generate(prompts[0], 4, gamma="auto")  # warm-up
    rates = []
    for _ in range(CALIBRATION_ROUNDS):
        start = time.process_time()
        tokens = sum(len(engine.generate(p, CALIBRATION_TOKENS, gamma="auto").token_ids) for p in prompts)
        rates.append(tokens / max(time.process_time() - start, 1e-9))
    return statistics.median(rates)


def calibrate_exit_layer(
    target: LoadedModel,
    trained: int | None = None,
    *,
    use_cache: bool = True,
    measure: Callable[[LoadedModel, int, Sequence[list[int]]], float] | None = None,
    quantized_draft: bool = True,
) -> Calibration:
    """The exit layer that measured the most tokens/s (``measure``, default ``measure_tokens_per_s``
    with ``quantized_draft``), cached per model and per early-exit form."""
    from quickdraft.drafters.early_exit import QuantizedEarlyExitDrafter

    quantized = QuantizedEarlyExitDrafter.applies(target, quantized_draft)
    if measure is None:
        measure = functools.partial(measure_tokens_per_s, quantized_draft=quantized_draft)
    key = model_fingerprint(target) + (f"|int{QuantizedEarlyExitDrafter.quantized_layer_bits}" if quantized else "")
    path = cache_dir() / CACHE_FILE
    cache = read_json(path) if use_cache else {}
    if key in cache:
        return Calibration(int(cache[key]["layer"]), {}, cached=True)
    prompts = calibration_prompts(target)
    layers = candidate_layers(target.config.n_layer, trained)
    log.info("calibrating the early-exit layer over %s (cached afterwards in %s)", layers, path)
    rates = {layer: measure(target, layer, prompts) for layer in layers}
    best = max(rates, key=lambda layer: rates[layer])
    log.info("early-exit calibration: %s tokens/s -> layer %d",
             ", ".join(f"L={k}: {v:.0f}" for k, v in rates.items()), best)
    if use_cache:
        cache[key] = {"layer": best, "tokens_per_s": {str(k): v for k, v in rates.items()},
                      "model": str(target.path)}
        write_json(path, cache)
    return Calibration(best, rates, cached=False)
