"""The batch scheduler under the load test's workload, without HTTP: ``--clients`` requests kept
running (a finished one is replaced at once by the next prompt), half greedy and half seeded
T = 0.8 / top_p = 0.95 as in ``quickdraft.bench.load``, 32 tokens each. Prints tokens/s and, with
``--profile``, where the engine's time goes (cProfile, top functions by cumulative time).

    python docs/bench/scheduler_load.py --clients 16 --seconds 10 [--gamma 0] [--profile]

It is the ceiling the server's batched configurations approach: what the engine alone does.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams

SAMPLINGS = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.95, seed=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--gamma", default="auto", help="'auto' or an integer (0 = plain decoding)")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--single", action="store_true",
                        help="also decode the same requests one at a time through engine.stream (the one-at-a-time "
                             "server's path) and print both")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    scheduler = engine.batch_scheduler(args.max_batch)
    prompts = [engine.encode(p) for p in TEXT_PROMPTS]
    counter = 0

    def submit() -> None:
        nonlocal counter
        scheduler.submit(prompts[counter % len(prompts)], args.max_tokens, SAMPLINGS[(counter // 2) % 2], gamma)
        counter += 1

    def run(seconds: float) -> int:
        for _ in range(args.clients - scheduler.running - len(scheduler.waiting)):
            submit()
        tokens, stop_at = 0, time.perf_counter() + seconds
        while time.perf_counter() < stop_at:
            for _, event in scheduler.step():
                tokens += len(event.token_ids)
                if event.result is not None:
                    submit()
        return tokens

    def run_single(seconds: float) -> int:
        tokens, i, stop_at = 0, 0, time.perf_counter() + seconds
        while time.perf_counter() < stop_at:
            result = engine.generate(prompts[i % len(prompts)], args.max_tokens, SAMPLINGS[(i // 2) % 2], gamma)
            tokens += len(result.token_ids)
            i += 1
        return tokens

    run(1.0)  # warm-up: the invariance probe, first shapes
    if args.single:
        run_single(1.0)
        for label, decode in (("batched", run), ("one at a time", run_single)) * 2:
            start = time.perf_counter()
            tokens = decode(args.seconds)
            print(f"{label}: {tokens / (time.perf_counter() - start):.0f} tokens/s")
        return
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    start = time.perf_counter()
    tokens = run(args.seconds)
    wall = time.perf_counter() - start
    if profiler:
        profiler.disable()
    print(f"{args.clients} clients, gamma {args.gamma}: {tokens} tokens in {wall:.1f} s = {tokens / wall:.0f} tokens/s")
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    main()
