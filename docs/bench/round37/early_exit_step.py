"""Early exit at layer 2 of the embedded target as a draft model over the truncated target
(``early_exit.truncated_target``): a greedy chain of 4 after 200 cached tokens in one native call, its
products unquantised against int8, and the full target's chain for scale (one thread; median of 200
chains, three repeats).

    .venv/bin/python docs/bench/round37/early_exit_step.py
"""

from __future__ import annotations

import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.drafters.early_exit import truncated_target
from quickdraft.model.loader import load_model
from quickdraft.model.native import NativeForward
from quickdraft.model.transformer import Transformer

EXIT_LAYER, CACHED, CHAIN, ROUNDS = 2, 200, 4, 200


def microseconds_a_token(model: Transformer, native: NativeForward, ids: list[int]) -> float:
    cache = model.new_cache(512)
    positions = torch.arange(CACHED)[None]
    mask = torch.ones(CACHED, CACHED, dtype=torch.bool).tril()[None]
    native(torch.tensor([ids[:CACHED]]), positions, positions, mask, cache, logits_rows=0)
    times = []
    for _ in range(ROUNDS):
        cache.length = CACHED
        start = time.perf_counter()
        native.draft_greedy([ids[CACHED]], CHAIN, model.config.vocab_size, cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / CHAIN * 1e6


def main() -> None:
    torch.set_num_threads(1)
    assert kernels.int8_products(), "needs the AVX-512 build of quickdraft's kernels (VNNI)"
    target = load_model(default_target_path(), dtype="bf16")
    target.model.pack_products()
    ids = target.tokenizer.encode(open(__file__).read())[: CACHED + 1]
    early = truncated_target(target.model, EXIT_LAYER)
    early.pack_products()
    int8 = NativeForward(early, int8_products=True)
    for _ in range(3):
        print(f"early exit at {EXIT_LAYER}: unquantised {microseconds_a_token(early, early.native, ids):.0f} us a token; "
              f"int8 {microseconds_a_token(early, int8, ids):.0f}; "
              f"full target {microseconds_a_token(target.model, target.model.native, ids):.0f}", flush=True)


if __name__ == "__main__":
    main()
