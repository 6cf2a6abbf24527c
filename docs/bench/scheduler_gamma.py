"""Which γ the batch scheduler runs, and what it measured, under a steady load (round 16).

    .venv/bin/python docs/bench/scheduler_gamma.py [--clients 4] [--mix mixed|greedy|sampled]
                                                   [--gamma auto|N] [--seconds 8]

The engine alone on the embedded pair (bf16, 1 thread), ``--clients`` requests of 32 tokens kept
running (a finished one is replaced at once), greedy, seeded T = 0.8 / top-p 0.95, or half each as
in the load test. Prints tokens/s, how many steps ran at each (running sequences, γ), the
scheduler's measured costs (target step per [slots, rows], draft step, the step's Python) and, per
slot bucket, how many tokens its steps at goodput's γ and its plain steps committed against what
goodput predicted for them (the clock's efficiency).
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams

GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.95, seed=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mix", choices=["mixed", "greedy", "sampled"], default="mixed")
    parser.add_argument("--gamma", default="auto", help="'auto' or an integer (0 = plain decoding)")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    scheduler = engine.batch_scheduler(32)
    prompts = [engine.encode(p) for p in TEXT_PROMPTS]
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        sampling = {"greedy": GREEDY, "sampled": SAMPLED}.get(args.mix, (GREEDY, SAMPLED)[(submitted // 2) % 2])
        scheduler.submit(prompts[submitted % len(prompts)], 32, sampling, gamma)
        submitted += 1

    for _ in range(args.clients):
        submit()
    steps: collections.Counter[tuple[int, int]] = collections.Counter()
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for _, event in scheduler.step():
            tokens += len(event.token_ids)
            if event.result is not None:
                submit()
        steps[(scheduler.last_batch, scheduler.last_gamma)] += 1
    print(f"{args.clients} clients, {args.mix}, gamma {args.gamma}: {tokens / (time.perf_counter() - start):.0f} tokens/s")
    print("steps at (running, γ):", ", ".join(f"{k}: {n}" for k, n in steps.most_common(8)))
    ms = lambda costs: {k: round(v * 1e3, 3) for k, v in sorted(costs.items())}  # noqa: E731
    print("target step ms per (slots, rows):", ms({(n, r): cost for n, rows in scheduler._target_cost.items()
                                                   for r, cost in rows.items()}))
    print("draft step ms per (slots, drafts with q):", ms(scheduler._draft_cost), "beyond its steps, per proposal:",
          ms(scheduler._draft_fixed), "step Python ms:", ms(scheduler._step_overhead))
    print("the clock's efficiency (committed / goodput's predicted tokens) per slot bucket:",
          {bucket: {arm: round(arms.rate(arm), 2) for arm in arms.arms}
           for bucket, arms in scheduler._speculation_arms.items()})


if __name__ == "__main__":
    main()
