"""A self-draft's (or early exit's) layers at 8 bits against 4 (heads at 8 either way), in one process:
plain decoding, then the drafter with each form, alternating round after round over the bench's prompts
(128 new tokens each), greedy and T = 0.8 (coupled rule, seeded per prompt). Per form: the median
speedup over the round's plain decoding, tokens per target call, and the draft's microseconds per drafted
token (``GenerationStats.drafter_seconds`` / drafted: catch-up and Python included).

    .venv/bin/python docs/bench/round38/int4_layers_ab.py [self|early-exit] [rounds]   (default: self 5)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from importlib import resources

import torch

from quickdraft.assets import default_target_path
from quickdraft.drafters.factory import make_drafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams

NEW_TOKENS = 128


def main() -> None:
    torch.set_num_threads(1)
    spec = sys.argv[1] if len(sys.argv) > 1 else "self"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    lines = (resources.files("quickdraft.bench") / "prompts" / "bench.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    target = load_model(default_target_path(), dtype="auto")
    engines = {"plain": Engine(target, None, dtype="auto")}
    for bits in (8, 4):
        drafter = make_drafter(spec, target)
        assert drafter.model.quantize_native_products(bits) and drafter.model.native.layer_bits == bits
        engines[f"{bits}-bit layers"] = Engine(target, drafter, dtype="auto")
    modes = {"greedy": None, "T=0.8": 0.8}
    for engine in engines.values():  # warm-up: caches, row timings
        for prompt in prompts[:3]:
            engine.generate(prompt, 32, gamma="auto")
    rate, per_call, draft_us = ({(m, n): [] for m in modes for n in engines} for _ in range(3))
    for _ in range(rounds):
        for mode, temperature in modes.items():
            for name, engine in engines.items():
                tokens = calls = drafted = 0
                drafter_seconds = 0.0
                start = time.perf_counter()
                for i, prompt in enumerate(prompts):
                    sampling = SamplingParams() if temperature is None else SamplingParams(temperature=temperature, seed=i)
                    result = engine.generate(prompt, NEW_TOKENS, sampling, gamma=0 if name == "plain" else "auto")
                    tokens += len(result.token_ids)
                    calls += result.stats.target_calls
                    drafted += result.stats.drafted
                    drafter_seconds += result.stats.drafter_seconds
                rate[(mode, name)].append(tokens / (time.perf_counter() - start))
                per_call[(mode, name)].append(tokens / calls)
                draft_us[(mode, name)].append(1e6 * drafter_seconds / max(drafted, 1))
    print(f"{spec}, {rounds} rounds, {len(prompts)} prompts x {NEW_TOKENS} tokens")
    for mode in modes:
        for name in engines:
            speedups = [a / b for a, b in zip(rate[(mode, name)], rate[(mode, "plain")])]
            print(f"{mode:7s} {name:13s} {statistics.median(rate[(mode, name)]):6.0f} tokens/s, speedup median "
                  f"{statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}), tokens/call "
                  f"{statistics.median(per_call[(mode, name)]):.2f}, draft {statistics.median(draft_us[(mode, name)]):.0f} "
                  "us a drafted token")


if __name__ == "__main__":
    main()
