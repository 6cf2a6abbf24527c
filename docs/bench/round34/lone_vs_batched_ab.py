"""One client: the batch scheduler against the single-sequence engine (what the one-at-a-time server
runs), with the product's row buckets (1, 2, 3, 4, 5, 9, 17: a 6-9-row verify runs as 9 rows) and with
every row count 1-9 a step shape (tried in round 34, no gain), in one process.

    .venv/bin/python docs/bench/round34/lone_vs_batched_ab.py [--rounds 7] [--requests 24] [--max-tokens 32]

The embedded pair (bf16, 1 thread, the default drafter), requests one after another as a single
client sends them (prefill included), half greedy and half seeded T = 0.8 / top-p 0.95 (the load
test's mix), auto γ. Arms alternate within each round (the first round is dropped); prints each arm's
median tokens/s, its median ratio to the lone engine within a round, target calls and the γ histogram.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round33"))
from batch_split_cost_ab import GREEDY, SAMPLED  # noqa: E402

import quickdraft.batch.shapes as shapes  # noqa: E402
from quickdraft.assets import default_draft_path, default_target_path  # noqa: E402
from quickdraft.batch.scheduler import BatchScheduler  # noqa: E402
from quickdraft.bench.load import TEXT_PROMPTS  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402
from quickdraft.output import GenerationResult  # noqa: E402

EVERY_ROW_COUNT = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)


def scheduled(scheduler: BatchScheduler, prompt: list[int], max_tokens: int, sampling, gammas: collections.Counter
              ) -> GenerationResult:
    scheduler.submit(prompt, max_tokens, sampling, "auto")
    while True:
        for _, event in scheduler.step():
            if event.result is not None:
                return event.result
        gammas[scheduler.last_gamma] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = {name: Engine(default_target_path(), default_draft_path(), dtype="bf16")
               for name in ("lone", "batched", "batched, rows 1-9")}
    schedulers = {"batched": engines["batched"].batch_scheduler(32)}
    buckets, shapes.ROW_BUCKETS = shapes.ROW_BUCKETS, EVERY_ROW_COUNT
    schedulers["batched, rows 1-9"] = engines["batched, rows 1-9"].batch_scheduler(32)
    shapes.ROW_BUCKETS = buckets
    for scheduler in schedulers.values():
        scheduler.measure_step_costs()
    prompts = [engines["lone"].encode(p) for p in TEXT_PROMPTS]
    names = list(engines)
    rates: dict[str, list[float]] = {name: [] for name in names}
    calls: dict[str, list[int]] = {name: [] for name in names}
    gammas: dict[str, collections.Counter] = {name: collections.Counter() for name in names}
    for round_ in range(args.rounds + 1):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            tokens = target_calls = 0
            start = time.perf_counter()
            for i in range(args.requests):
                prompt, sampling = prompts[i % len(prompts)], (GREEDY, SAMPLED)[(i // 2) % 2]
                if name == "lone":
                    result = engines[name].generate(prompt, args.max_tokens, sampling, gamma="auto")
                else:
                    result = scheduled(schedulers[name], prompt, args.max_tokens, sampling, gammas[name])
                tokens += len(result.token_ids)
                target_calls += result.stats.target_calls
            if round_:
                rates[name].append(tokens / (time.perf_counter() - start))
                calls[name].append(target_calls)
    print(f"## one client, {args.requests} requests of {args.max_tokens} tokens per round, {args.rounds} rounds")
    for name in names:
        ratio = statistics.median(r / lone for r, lone in zip(rates[name], rates["lone"]))
        histogram = f"  steps at γ: {dict(sorted(gammas[name].items()))}" if gammas[name] else ""
        print(f"  {name:26s} median {statistics.median(rates[name]):6.0f} tokens/s  x{ratio:.3f} of lone"
              f"  ({', '.join(f'{v:.0f}' for v in rates[name])})  target calls {statistics.median(calls[name]):.0f}"
              f"{histogram}", flush=True)


if __name__ == "__main__":
    main()
