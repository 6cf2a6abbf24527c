"""A lone sequence: the batch scheduler against the single-sequence engine, on the load test's
prompts (greedy, 32 tokens), at a fixed γ and at auto γ, with each path's draft and target time per
call from the results' statistics.

    python docs/bench/lone_sequence.py [--gamma 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    engine.batch_scheduler(args.max_batch)
    greedy = SamplingParams()
    paths = {
        "single": lambda p, g: engine.generate(p, 32, greedy, gamma=g),
        "batched": lambda p, g: engine.generate_batch([p], 32, greedy, gamma=g, max_batch=args.max_batch)[0],
    }
    for _ in range(args.rounds):
        for gamma in (args.gamma, "auto", 0):
            for label, generate in paths.items():
                drafter_s = calls = target_s = target_calls = tokens = 0
                start = time.perf_counter()
                for prompt in TEXT_PROMPTS * 3:
                    stats = (result := generate(prompt, gamma)).stats
                    drafter_s += stats.drafter_seconds
                    calls += stats.drafter_calls
                    target_s += stats.target_seconds
                    target_calls += stats.target_calls
                    tokens += len(result.token_ids)
                wall = time.perf_counter() - start
                draft = f"draft {drafter_s / calls * 1e3:.3f} ms a step, " if calls else ""
                print(f"γ={gamma!s:4} {label:8} {tokens / wall:6.0f} tokens/s  {tokens / target_calls:.2f} tokens/call  "
                      f"{draft}target {target_s / target_calls * 1e3:.3f} ms a call")


if __name__ == "__main__":
    main()
