"""A lone sequence, the scheduler against the single engine, as a ratio of CPU-time rates (round 15).

    .venv/bin/python docs/bench/lone_sequence_ratio.py [--alternations 6]

The load test's prompts twice (32 tokens each) through ``Engine.generate`` and through
``Engine.generate_batch([prompt])``, alternating ``--alternations`` times in one process, greedy and
T = 0.8 with top-p 0.95 (seeded), γ = 0 and auto. Rates by CPU time (``time.process_time``: this
machine's steal time does not count), and the median of the per-alternation ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternations", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    engine.batch_scheduler(32)
    for name, sampling in (("greedy", SamplingParams()),
                           ("T = 0.8, top-p 0.95", SamplingParams(temperature=0.8, top_p=0.95, seed=1))):
        paths = {
            "single": lambda p, g, s=sampling: engine.generate(p, 32, s, gamma=g),
            "batched": lambda p, g, s=sampling: engine.generate_batch([p], 32, s, gamma=g, max_batch=32)[0],
        }
        for gamma in (0, "auto"):
            rates: dict[str, list[float]] = {label: [] for label in paths}
            for _ in range(args.alternations):
                for label, generate in paths.items():
                    start, tokens = time.process_time(), 0
                    for prompt in TEXT_PROMPTS * 2:
                        tokens += len(generate(prompt, gamma).token_ids)
                    rates[label].append(tokens / (time.process_time() - start))
            ratio = statistics.median(b / a for a, b in zip(rates["single"], rates["batched"]))
            print(f"{name}, γ = {gamma}: single {statistics.median(rates['single']):.0f}, scheduler "
                  f"{statistics.median(rates['batched']):.0f} tokens/s (CPU time); scheduler / single {ratio:.3f}")


if __name__ == "__main__":
    main()
