"""The batch scheduler with the drafts' products int8 against unquantised, in one process: the
embedded pair's default drafter (prompt lookup, then the draft model), n prompts of the load test
submitted together (every other one sampled at T = 0.8, top-p 0.95, seeded), 64 new tokens each,
``Engine.generate_batch``; plain batched decoding (γ = 0) for scale. The three engines share one
target and alternate, REPEATS times; medians of tokens/s.

    .venv/bin/python docs/bench/round37/batch_int8_ab.py [n ...]   (default: 4 16 32)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams

NEW_TOKENS, REPEATS = 64, 5


def main() -> None:
    torch.set_num_threads(1)
    path = default_target_path()
    target = load_model(path, dtype="auto")
    drafter = f"prompt-lookup+{embedded_draft_for(path)}"
    engines = {"int8 drafts": Engine(target, drafter, exact=True, dtype="auto"),
               "unquantised drafts": Engine(target, drafter, exact=True, dtype="auto", int8_draft=False)}
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
    for n in [int(a) for a in sys.argv[1:]] or [4, 16, 32]:
        prompts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(n)]
        sampling = [SamplingParams() if i % 2 == 0 else sampled for i in range(n)]
        for engine in engines.values():  # warm-up: caches, timings
            engine.generate_batch(prompts, 8, sampling, max_batch=32)
        rates: dict[str, list[float]] = {name: [] for name in (*engines, "plain")}
        for _ in range(REPEATS):
            for name, engine, gamma in [*((name, e, "auto") for name, e in engines.items()),
                                        ("plain", engines["int8 drafts"], 0)]:
                start = time.perf_counter()
                results = engine.generate_batch(prompts, NEW_TOKENS, sampling, gamma=gamma, max_batch=32)
                rates[name].append(sum(len(r.token_ids) for r in results) / (time.perf_counter() - start))
        plain = statistics.median(rates["plain"])
        print(f"{n} sequences: " + "; ".join(
            f"{name} {statistics.median(v):.0f} tokens/s ({min(v):.0f}-{max(v):.0f}, "
            f"{statistics.median(v) / plain:.2f}x plain)" for name, v in rates.items()), flush=True)


if __name__ == "__main__":
    main()
