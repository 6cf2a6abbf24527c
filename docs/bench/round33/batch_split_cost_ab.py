"""The batch scheduler's goodput planning a proposal's fixed cost apart from its draft steps ("split",
the product since round 33) against the same scheduler with the steps' times dropped ("nosplit":
every second of a proposal counted per step, as before), and plain batched decoding, in one process.

    .venv/bin/python docs/bench/round33/batch_split_cost_ab.py [--clients 1,4,16] [--rounds 5] [--seconds 6]

The embedded pair (bf16, 1 thread, the default drafter: lookup + the cut-head draft), ``--clients``
requests of 64 tokens kept running (a finished one replaced at once), half greedy and half seeded
T = 0.8 / top-p 0.95 as in the load test. Arms alternate within each round; prints each arm's
median tokens/s and its ratio to plain.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.batch.scheduler import BatchScheduler
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams

GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.95, seed=1)


def steady_load(scheduler: BatchScheduler, prompts: list[list[int]], clients: int, gamma: int | str,
                seconds: float, gammas: collections.Counter | None = None, max_tokens: int = 64,
                switches: collections.Counter | None = None) -> float:
    """Tokens per second with ``clients`` requests of ``max_tokens`` kept running for ``seconds``;
    ``gammas`` counts the steps run at each γ, ``switches["drafting after plain"]`` the drafting steps
    that followed a plain one."""
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        scheduler.submit(prompts[submitted % len(prompts)], max_tokens, (GREEDY, SAMPLED)[(submitted // 2) % 2], gamma)
        submitted += 1

    for _ in range(clients):
        submit()
    tokens, previous, start = 0, None, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _, event in scheduler.step():
            tokens += len(event.token_ids)
            if event.result is not None:
                submit()
        if gammas is not None:
            gammas[scheduler.last_gamma] += 1
        if switches is not None:
            switches["drafting after plain"] += previous == 0 and scheduler.last_gamma > 0
        previous = scheduler.last_gamma
    elapsed = time.perf_counter() - start
    for request in list(scheduler.active) + list(scheduler.waiting):
        scheduler.cancel(request)
    while not scheduler.idle:
        scheduler.step()
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engines = {name: Engine(default_target_path(), default_draft_path(), dtype="bf16") for name in ("split", "nosplit")}
    schedulers = {name: engine.batch_scheduler(32) for name, engine in engines.items()}
    observe = schedulers["nosplit"]._observe_draft
    schedulers["nosplit"]._observe_draft = lambda key, seconds, calls, steps: observe(key, seconds, calls, None)
    for scheduler in schedulers.values():
        scheduler.measure_step_costs()
    prompts = [engines["split"].encode(p) for p in TEXT_PROMPTS]
    arms = [("plain", "split", 0), ("split", "split", "auto"), ("nosplit", "nosplit", "auto")]
    for clients in map(int, args.clients.split(",")):
        rates: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        gammas: dict[str, collections.Counter] = {name: collections.Counter() for name, _, _ in arms}
        for round_ in range(args.rounds + 1):  # the first round warms every arm up and is dropped
            for name, which, gamma in (arms if round_ % 2 == 0 else arms[::-1]):
                rate = steady_load(schedulers[which], prompts, clients, gamma, args.seconds, gammas[name])
                if round_:
                    rates[name].append(rate)
        plain = statistics.median(rates["plain"])
        print(f"## {clients} clients, {args.rounds} rounds of {args.seconds:.0f} s per arm")
        for name, values in rates.items():
            print(f"  {name:8s} median {statistics.median(values):7.0f} tokens/s  x{statistics.median(values) / plain:.3f}"
                  f"  ({', '.join(f'{v:.0f}' for v in values)})  steps at γ: {dict(sorted(gammas[name].items()))}")
        split = schedulers["split"]
        ms = lambda costs: {k: round(v * 1e3, 3) for k, v in sorted(costs.items())}  # noqa: E731
        print("  split: draft step ms", ms(split._draft_cost), "beyond steps ms", ms(split._draft_fixed))
        print("  nosplit: draft step ms", ms(schedulers["nosplit"]._draft_cost), flush=True)


if __name__ == "__main__":
    main()
