"""A drafted token's time where the engine pays it: right after a verify. A chain of 5 greedy drafts
after 200 cached tokens, each chain preceded by a 6-row target forward (the verify that pushes the
draft's weights out of the caches), the drafter's layers at 8 bits against 4 (heads at 8), alternating,
40 rounds; medians and quartiles of the time per drafted token.

    .venv/bin/python docs/bench/round38/draft_step_after_verify.py [self|early-exit:L|DRAFT]   (default: self)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from quickdraft.assets import default_target_path
from quickdraft.drafters.factory import make_drafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model

CONTEXT, CHAIN, VERIFY_ROWS, ROUNDS = 200, 5, 6, 40


def main() -> None:
    torch.set_num_threads(1)
    spec = sys.argv[1] if len(sys.argv) > 1 else "self"
    target = load_model(default_target_path(), dtype="auto")
    engine = Engine(target, None, dtype="auto")
    assert engine.target_steps is not None, "needs quickdraft's native forwards"
    drafters = {}
    for bits in (8, 4):
        drafter = make_drafter(spec, target)
        assert drafter.model.quantize_native_products(bits) and drafter.model.native.layer_bits == bits
        drafters[f"{bits}-bit layers"] = drafter
    prompt = [(i * 37) % 8000 + 5 for i in range(CONTEXT)]
    target_cache = target.model.new_cache(1024)
    target.model.prefill(torch.tensor([prompt]), 0, target_cache)
    caches = {}
    for name, drafter in drafters.items():
        caches[name] = drafter.model.new_cache(1024)
        drafter.model.prefill(torch.tensor([prompt[:-1]]), 0, caches[name])
    times: dict[str, list[float]] = {name: [] for name in drafters}
    for _ in range(ROUNDS):
        for name, drafter in drafters.items():
            engine.target_steps.run(list(range(10, 10 + VERIFY_ROWS)), CONTEXT, target_cache)
            cache = caches[name]
            cache.set_length(CONTEXT - 1)
            start = time.perf_counter()
            drafter.model.native.draft_greedy([prompt[-1]], CHAIN, target.config.vocab_size, cache)
            times[name].append((time.perf_counter() - start) / CHAIN)
    for name, values in times.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"{spec} {name}: {median * 1e6:6.1f} us a drafted token (quartiles {q1 * 1e6:.1f}-{q3 * 1e6:.1f})")


if __name__ == "__main__":
    main()
